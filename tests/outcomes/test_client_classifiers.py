"""Every client classifier, with the real package talking to a local server that speaks its wire
format (tests/wire), streams included: what each outcome is, whether the request may have
reached the dependency, and the wait it stated."""

from __future__ import annotations

import asyncio
import email.utils
import time
from typing import Any

import anthropic
import grpc
import httpx
import openai
import pytest
import redis.asyncio
from elasticsearch import AsyncElasticsearch
from qdrant_client import AsyncQdrantClient
from redis.backoff import NoBackoff
from redis.retry import Retry

from ragguard.httpx import GuardTransport, RemoteQuotaExceeded, RemoteUnavailable
from ragguard.outcomes import Kind, Outcome, classify
from wire import OVERLOADED, AnthropicWire, ElasticWire, Fault, OpenAIWire, QdrantGrpcWire, QdrantWire

pytestmark = pytest.mark.anyio

ASK = [{"role": "user", "content": "hi"}]


async def _raised(awaitable: Any) -> BaseException:
    try:
        await awaitable
    except Exception as exc:
        return exc
    raise AssertionError("no error was raised")


def _is(
    outcome: Outcome, kind: Kind, *, reached: bool | None = None, wait: float | None = None, tol: float = 0.01
) -> None:
    assert outcome.kind is kind, outcome
    if reached is not None:
        assert outcome.reached is reached, outcome
    if wait is not None:
        assert outcome.retry_after_s == pytest.approx(wait, abs=tol), outcome


# -- httpx and ragguard's transport --------------------------------------------------------------


async def test_httpx_and_guard_transport(closed_port: int) -> None:
    wire = OpenAIWire()
    with wire.running() as url:
        async with httpx.AsyncClient(base_url=url, transport=GuardTransport()) as http:
            wire.faults.push("embeddings", Fault(status=429, headers={"retry-after-ms": "250"}))
            err = await _raised(http.post("/v1/embeddings", json={"input": "a"}))
            assert isinstance(err, RemoteQuotaExceeded)
            _is(classify(err), Kind.REJECTION, wait=0.25)
            wire.faults.push("embeddings", Fault(status=503))
            err = await _raised(http.post("/v1/embeddings", json={"input": "a"}))
            assert isinstance(err, RemoteUnavailable)
            _is(classify(err), Kind.FAILURE)
            wire.faults.push("embeddings", Fault(status=503, headers={"retry-after": "2"}))
            _is(
                classify(await _raised(http.post("/v1/embeddings", json={"input": "a"}))),
                Kind.REJECTION,
                wait=2,
            )
        async with httpx.AsyncClient(base_url=url, timeout=0.2) as http:
            for status, kind in (
                (400, Kind.CALLER_ERROR),
                (404, Kind.CALLER_ERROR),
                (500, Kind.FAILURE),
                (408, Kind.TIMEOUT),
                (429, Kind.REJECTION),
                (529, Kind.REJECTION),
            ):
                wire.faults.push("embeddings", Fault(status=status))
                reply = await http.post("/v1/embeddings", json={"input": "a"})
                _is(classify(await _raised(asyncio.to_thread(reply.raise_for_status))), kind)
            wire.faults.push("embeddings", Fault(delay_s=1.0))
            _is(
                classify(await _raised(http.post("/v1/embeddings", json={"input": "a"}))),
                Kind.TIMEOUT,
                reached=True,
            )
            wire.faults.push("embeddings", Fault(reset=True))
            _is(
                classify(await _raised(http.post("/v1/embeddings", json={"input": "a"}))),
                Kind.FAILURE,
                reached=True,
            )
    async with httpx.AsyncClient() as http:
        refused = await _raised(http.get(f"http://127.0.0.1:{closed_port}/"))
    assert isinstance(refused, httpx.ConnectError)
    _is(classify(refused), Kind.FAILURE, reached=False)


# -- OpenAI -------------------------------------------------------------------------------------


async def test_openai_status_errors_and_their_waits(closed_port: int) -> None:
    wire = OpenAIWire()
    with wire.running() as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=0.5)

        async def embed() -> BaseException:
            return await _raised(client.embeddings.create(model="m", input="a"))

        wire.faults.push(
            "embeddings",
            Fault(
                status=400,
                body={
                    "error": {
                        "message": "maximum context length",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "context_length_exceeded",
                    }
                },
            ),
        )
        err = await embed()
        assert isinstance(err, openai.BadRequestError)
        _is(classify(err), Kind.CALLER_ERROR)
        wire.faults.push("embeddings", Fault(status=401))
        _is(classify(await embed()), Kind.CALLER_ERROR)
        wire.faults.push(
            "embeddings", Fault(status=429, headers={"retry-after-ms": "1500", "retry-after": "9"})
        )
        err = await embed()
        assert isinstance(err, openai.RateLimitError)
        _is(classify(err), Kind.REJECTION, wait=1.5)
        wire.faults.push("embeddings", Fault(status=429, headers={"retry-after": "7"}))
        _is(classify(await embed()), Kind.REJECTION, wait=7)
        wire.faults.push(
            "embeddings",
            Fault(
                status=429,
                headers={
                    "x-ratelimit-reset-requests": "6m0s",
                    "x-ratelimit-remaining-requests": "0",
                    "x-ratelimit-reset-tokens": "20ms",
                    "x-ratelimit-remaining-tokens": "1000",
                },
            ),
        )
        _is(classify(await embed()), Kind.REJECTION, wait=360)
        wire.faults.push(
            "embeddings",
            Fault(
                status=429,
                body={
                    "error": {
                        "message": "quota",
                        "type": "insufficient_quota",
                        "param": None,
                        "code": "insufficient_quota",
                    }
                },
            ),
        )
        _is(classify(await embed()), Kind.CALLER_ERROR)  # an unpaid account: no wait helps
        wire.faults.push("embeddings", Fault(status=500))
        _is(classify(await embed()), Kind.FAILURE)
        wire.faults.push("embeddings", Fault(delay_s=2.0))
        err = await embed()
        assert isinstance(err, openai.APITimeoutError)
        _is(classify(err), Kind.TIMEOUT, reached=True)
        wire.faults.push("embeddings", Fault(reset=True))
        err = await embed()
        assert isinstance(err, openai.APIConnectionError)
        _is(classify(err), Kind.FAILURE, reached=True)
        await client.close()
    refused = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{closed_port}/v1", api_key="k", max_retries=0)
    err = await _raised(refused.embeddings.create(model="m", input="a"))
    await refused.close()
    assert isinstance(err, openai.APIConnectionError)
    _is(classify(err), Kind.FAILURE, reached=False)


async def test_openai_streams() -> None:
    wire = OpenAIWire()
    with wire.running() as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=5.0)

        async def chat() -> tuple[list[str], BaseException | None]:
            got: list[str] = []
            try:
                stream = await client.chat.completions.create(model="m", messages=ASK, stream=True)  # type: ignore[arg-type]
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        got.append(chunk.choices[0].delta.content)
            except Exception as exc:
                return got, exc
            return got, None

        assert await chat() == (["Hello", " from", " the", " wire"], None)
        wire.faults.push(
            "chat", Fault(event={"message": "server overloaded", "type": "server_error"}, event_after=3)
        )
        got, err = await chat()
        assert got and isinstance(err, openai.APIError)
        _is(classify(err), Kind.FAILURE)
        wire.faults.push(
            "chat", Fault(event={"message": "slow down", "type": "rate_limit_exceeded"}, event_after=3)
        )
        got, err = await chat()
        assert got and err is not None
        _is(classify(err), Kind.REJECTION)
        wire.faults.push("chat", Fault(reset_after=3))
        got, err = await chat()
        assert got and isinstance(err, openai.APIConnectionError)
        _is(classify(err), Kind.FAILURE, reached=True)
        wire.faults.push("chat", Fault(status=429, headers={"retry-after": "3"}))
        got, err = await chat()
        assert not got and isinstance(err, openai.RateLimitError)
        _is(classify(err), Kind.REJECTION, wait=3)
        await client.close()


# -- Anthropic ----------------------------------------------------------------------------------


async def test_anthropic_529_429_and_overload_inside_a_200_stream() -> None:
    wire = AnthropicWire()
    with wire.running() as url:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0, timeout=5.0)

        async def message() -> BaseException:
            return await _raised(client.messages.create(model="x", max_tokens=8, messages=ASK))  # type: ignore[arg-type]

        wire.faults.push("messages", Fault(status=529))
        err = await message()
        assert isinstance(err, anthropic.APIStatusError) and err.status_code == 529
        _is(classify(err), Kind.REJECTION)
        wire.faults.push("messages", Fault(status=429, headers={"retry-after": "4"}))
        err = await message()
        assert isinstance(err, anthropic.RateLimitError)
        _is(classify(err), Kind.REJECTION, wait=4)
        wire.faults.push("messages", Fault(status=400))
        _is(classify(await message()), Kind.CALLER_ERROR)
        wire.faults.push("messages", Fault(status=401))
        _is(classify(await message()), Kind.CALLER_ERROR)
        wire.faults.push("messages", Fault(status=500))
        _is(classify(await message()), Kind.FAILURE)

        wire.faults.push("messages", Fault(event=OVERLOADED, event_after=4))
        got: list[str] = []
        with pytest.raises(anthropic.APIStatusError) as info:
            async with client.messages.stream(model="x", max_tokens=8, messages=ASK) as stream:  # type: ignore[arg-type]
                async for text in stream.text_stream:
                    got.append(text)
        assert got == ["Hello"] and info.value.status_code == 200  # the stream had begun with 200
        _is(classify(info.value), Kind.REJECTION)
        await client.close()


# -- Qdrant -------------------------------------------------------------------------------------


async def test_qdrant_rest(closed_port: int) -> None:
    wire = QdrantWire()
    with wire.running() as url:
        client = AsyncQdrantClient(url=url, check_compatibility=False, timeout=5)

        async def query() -> BaseException:
            return await _raised(client.query_points("docs", query=[0.1, 0.2]))

        assert (await client.query_points("docs", query=[0.1, 0.2])).points[0].score == 0.9
        wire.faults.push("query", Fault(status=429, headers={"retry-after": "3"}))
        _is(classify(await query()), Kind.REJECTION, wait=3)
        date = email.utils.formatdate(time.time() + 30, usegmt=True)  # qdrant-client wants an int here
        wire.faults.push("query", Fault(status=429, headers={"retry-after": date}))
        _is(classify(await query()), Kind.REJECTION, wait=30, tol=1.5)  # an HTTP-date: whole seconds
        wire.faults.push("query", Fault(status=503))
        _is(classify(await query()), Kind.FAILURE)
        wire.faults.push("query", Fault(status=400))
        _is(classify(await query()), Kind.CALLER_ERROR)
        await client.close()
    refused = AsyncQdrantClient(url=f"http://127.0.0.1:{closed_port}", check_compatibility=False)
    _is(classify(await _raised(refused.query_points("docs", query=[0.1]))), Kind.FAILURE, reached=False)
    await refused.close()


async def test_qdrant_grpc(closed_port: int) -> None:
    wire = QdrantGrpcWire()
    with wire.running() as port:
        client = AsyncQdrantClient(
            host="127.0.0.1", grpc_port=port, prefer_grpc=True, check_compatibility=False
        )

        async def query() -> BaseException:
            return await _raised(client.query_points("docs", query=[0.1, 0.2]))

        assert (await client.query_points("docs", query=[0.1, 0.2])).points[0].id == 1
        wire.faults.push("query", Fault(grpc_code="RESOURCE_EXHAUSTED", trailers=(("retry-after", "2"),)))
        _is(classify(await query()), Kind.REJECTION, wait=2)
        wire.faults.push("query", Fault(grpc_code="RESOURCE_EXHAUSTED"))
        _is(classify(await query()), Kind.REJECTION)
        wire.faults.push("query", Fault(grpc_code="UNAVAILABLE"))
        err = await query()
        assert isinstance(err, grpc.aio.AioRpcError)
        _is(classify(err), Kind.FAILURE)
        wire.faults.push("query", Fault(grpc_code="INVALID_ARGUMENT"))
        _is(classify(await query()), Kind.CALLER_ERROR)
        await client.close()
    refused = AsyncQdrantClient(
        host="127.0.0.1", grpc_port=closed_port, prefer_grpc=True, check_compatibility=False, timeout=5
    )
    _is(classify(await _raised(refused.query_points("docs", query=[0.1]))), Kind.FAILURE, reached=False)
    await refused.close()


# -- Elasticsearch ------------------------------------------------------------------------------


async def test_elasticsearch(closed_port: int) -> None:
    wire = ElasticWire()
    with wire.running() as url:
        client = AsyncElasticsearch(
            url, max_retries=0, retry_on_status=(), node_class="httpxasync", request_timeout=0.5
        )

        async def search() -> BaseException:
            return await _raised(client.search(index="docs", query={"match_all": {}}))

        assert (await client.search(index="docs", query={"match_all": {}}))["hits"]["total"]["value"] == 1
        wire.faults.push("search", Fault(status=429, headers={"retry-after": "4"}))
        _is(classify(await search()), Kind.REJECTION, wait=4)
        wire.faults.push("search", Fault(status=503))
        _is(classify(await search()), Kind.FAILURE)
        wire.faults.push("search", Fault(status=400))
        _is(classify(await search()), Kind.CALLER_ERROR)
        wire.faults.push("search", Fault(delay_s=2.0))
        _is(classify(await search()), Kind.TIMEOUT)
        await client.close()
    unknown = ElasticWire(product=False)
    with unknown.running() as url:
        client = AsyncElasticsearch(url, max_retries=0, node_class="httpxasync")
        _is(classify(await _raised(client.search(index="docs"))), Kind.CALLER_ERROR)  # not Elasticsearch
        await client.close()
    refused = AsyncElasticsearch(f"http://127.0.0.1:{closed_port}", max_retries=0, node_class="httpxasync")
    _is(classify(await _raised(refused.search(index="docs"))), Kind.FAILURE, reached=False)
    await refused.close()


def test_opensearch_in_a_thread(closed_port: int) -> None:
    from opensearchpy import OpenSearch

    wire = ElasticWire(product=False)
    with wire.running() as url:
        client = OpenSearch(url, max_retries=0, retry_on_status=(), timeout=0.5)
        assert client.search(index="docs", body={"query": {"match_all": {}}})["hits"]["total"]["value"] == 1
        for status, kind in ((429, Kind.REJECTION), (503, Kind.FAILURE), (400, Kind.CALLER_ERROR)):
            wire.faults.push("search", Fault(status=status))
            with pytest.raises(Exception) as info:
                client.search(index="docs", body={})
            _is(classify(info.value), kind)
        wire.faults.push("search", Fault(delay_s=2.0))
        with pytest.raises(Exception) as info:
            client.search(index="docs", body={})
        _is(classify(info.value), Kind.TIMEOUT)
    refused = OpenSearch(f"http://127.0.0.1:{closed_port}", max_retries=0)
    with pytest.raises(Exception) as info:
        refused.search(index="docs", body={})
    _is(classify(info.value), Kind.FAILURE)


# -- redis ----------------------------------------------------------------------------------------


async def test_redis(closed_port: int, silent_port: int) -> None:
    refused = redis.asyncio.Redis(host="127.0.0.1", port=closed_port, retry=Retry(NoBackoff(), 0))
    _is(classify(await _raised(refused.ping())), Kind.FAILURE, reached=False)
    await refused.aclose()
    silent = redis.asyncio.Redis(
        host="127.0.0.1", port=silent_port, socket_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    _is(classify(await _raised(silent.ping())), Kind.TIMEOUT)
    await silent.aclose()


# -- torch / CUDA out of memory -----------------------------------------------------------------


def test_torch_out_of_memory_by_name_and_message() -> None:
    """CI has no torch: its errors are matched by class name and message, as torch 2.13 (CPU wheel,
    tried once) raises them: ``torch.OutOfMemoryError`` (also ``torch.cuda.OutOfMemoryError``, a
    RuntimeError) for an accelerator, a plain RuntimeError from the CPU allocator."""
    oom = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch"})
    assert classify(oom("CUDA out of memory. Tried to allocate 20.00 GiB")).out_of_memory
    cpu = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 1125899906842624 bytes."
    )
    assert classify(cpu).out_of_memory and classify(cpu).kind is Kind.FAILURE
    assert not classify(RuntimeError("index out of range")).out_of_memory


def test_real_torch_out_of_memory() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError) as info:
        torch.empty(1 << 50, dtype=torch.uint8)  # a petabyte: the CPU allocator refuses
    assert classify(info.value).out_of_memory
    assert classify(torch.OutOfMemoryError("CUDA out of memory")).out_of_memory
