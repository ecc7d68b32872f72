"""The list at the top of issue 19, each bullet through the real front door (uvicorn serving a
FastAPI app behind RagguardMiddleware, a grpc.aio server behind GuardServerInterceptor) and the
real client (httpx with GuardTransport, the openai and anthropic SDKs, grpc.aio with ragguard's
client interceptors), against the wire servers of tests/wire."""

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
from fastapi import FastAPI
from grpc import aio
from qdrant_client import grpc as qgrpc
from qdrant_client.grpc import points_service_pb2_grpc

import ragguard
from ragguard import BreakerPolicy, Guard, Policy, RetryPolicy, StagePolicy, TenantQuota, ThrottlePolicy
from ragguard.asgi import RagguardMiddleware
from ragguard.breakers import BreakerState
from ragguard.grpc import GuardServerInterceptor, client_interceptors
from ragguard.httpx import GuardTransport
from wire import OVERLOADED, AnthropicWire, Fault, OpenAIWire, QdrantGrpcWire, serving

pytestmark = pytest.mark.anyio

ASK = [{"role": "user", "content": "hi"}]


def _app(guard: Guard) -> FastAPI:
    app = FastAPI()
    app.add_middleware(RagguardMiddleware, guard=guard)
    return app


def _clean(reply: httpx.Response, *upstreams: str) -> None:
    """No 500, no traceback, no upstream address in the body."""
    assert reply.status_code != 500, reply.text
    assert "Traceback" not in reply.text
    for upstream in upstreams:
        host = upstream.split("//")[-1]
        assert host not in reply.text and host.split(":")[-1] not in reply.text, reply.text


# -- an embedding provider answering 503, or refusing connections ------------------------------


@pytest.mark.parametrize("provider", ["503", "refused"])
async def test_a_down_embedding_provider_answers_502_or_503_and_opens_the_embedding_breaker(
    provider: str, closed_port: int
) -> None:
    g = Guard()  # the standard embedding stage: its typed breaker, two attempts
    wire = OpenAIWire()
    wire.faults.always("embeddings", Fault(status=503))
    app = _app(g)
    with wire.running() as wire_url:
        base = wire_url if provider == "503" else f"http://127.0.0.1:{closed_port}"

        @g.guard("embedding")
        async def embed(texts: list[str]) -> Any:
            async with httpx.AsyncClient(transport=GuardTransport()) as http:
                return (await http.post(f"{base}/v1/embeddings", json={"input": texts})).json()

        @app.get("/ask")
        async def ask(q: str) -> Any:
            return await embed([q])

        with serving(app) as (url, _):
            async with httpx.AsyncClient(base_url=url) as client:
                replies = [await client.get("/ask", params={"q": f"query {i}"}) for i in range(20)]
    for reply in replies:
        _clean(reply, base)
        assert reply.status_code in (502, 503)
    assert g.breaker("embedding").state is BreakerState.OPEN
    if provider == "503":
        assert wire.faults.seen["embeddings"] <= 12  # the breaker stopped the calls (was 40)


# -- a provider's 429 ------------------------------------------------------------------------


async def test_a_providers_429_is_served_by_the_fallback_or_answered_503_never_429() -> None:
    g = Guard()
    wire = OpenAIWire()
    wire.faults.always("embeddings", Fault(status=429, headers={"retry-after-ms": "50"}))
    app = _app(g)
    with wire.running() as wire_url:

        async def provider(texts: list[str]) -> Any:
            async with httpx.AsyncClient(transport=GuardTransport()) as http:
                return (await http.post(f"{wire_url}/v1/embeddings", json={"input": texts})).json()

        @g.guard("embedding", fallback=lambda texts: {"fallback": True})
        async def embed(texts: list[str]) -> Any:
            return await provider(texts)

        @g.guard("embedding")
        async def embed_bare(texts: list[str]) -> Any:
            return await provider(texts)

        @app.get("/served")
        async def served(q: str) -> Any:
            return await embed([q])

        @app.get("/bare")
        async def bare(q: str) -> Any:
            return await embed_bare([q])

        with serving(app) as (url, _):
            async with httpx.AsyncClient(base_url=url) as client:
                fell_back = await client.get("/served", params={"q": "a"})
                refused = await client.get("/bare", params={"q": "b"})
    assert fell_back.status_code == 200 and fell_back.json() == {"fallback": True}
    assert fell_back.headers["ragguard-degraded"]
    _clean(refused, wire_url)
    assert refused.status_code == 503 and refused.headers["retry-after-ms"] == "50"


# -- a Retry-After the stage could never use ---------------------------------------------------

_HUGE = {
    "seconds": {"retry-after": "9999999999"},
    "milliseconds": {"retry-after-ms": "9999999999999"},
    "date 50 years ahead": {
        "retry-after": email.utils.formatdate(time.time() + 50 * 365 * 86400, usegmt=True)
    },
}


@pytest.mark.parametrize("headers", list(_HUGE.values()), ids=list(_HUGE))
async def test_a_huge_retry_after_without_a_deadline_ends_the_retry_and_the_fallback_serves(
    headers: dict[str, str],
) -> None:
    g = Guard()  # no deadline anywhere
    wire = OpenAIWire()
    wire.faults.always("embeddings", Fault(status=429, headers=headers))
    app = _app(g)
    with wire.running() as wire_url:

        @g.guard("embedding", fallback=lambda texts: {"fallback": True})
        async def embed(texts: list[str]) -> Any:
            async with httpx.AsyncClient(transport=GuardTransport()) as http:
                return (await http.post(f"{wire_url}/v1/embeddings", json={"input": texts})).json()

        @app.get("/ask")
        async def ask(q: str) -> Any:
            return await embed([q])

        with serving(app) as (url, _):
            async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
                started = time.monotonic()
                reply = await client.get("/ask", params={"q": "a"})
                took = time.monotonic() - started
    assert reply.status_code == 200 and reply.json() == {"fallback": True}
    assert took < 5.0 and wire.faults.seen["embeddings"] == 1  # no retry slept on it


async def _qdrant_query(target: str) -> Any:
    async with aio.insecure_channel(target, interceptors=client_interceptors()) as channel:
        stub = points_service_pb2_grpc.PointsStub(channel)
        return await stub.Query(qgrpc.QueryPoints(collection_name="docs"))


async def test_a_grpc_retry_after_of_1e308_ends_the_retry_and_the_fallback_serves() -> None:
    g = Guard()
    wire = QdrantGrpcWire()
    wire.faults.always("query", Fault(grpc_code="RESOURCE_EXHAUSTED", trailers=(("retry-after", "1e308"),)))
    app = _app(g)
    with wire.running() as port:

        @g.guard("vector_store", fallback=lambda query: ["keyword hit"])
        async def search(query: str) -> Any:
            reply = await _qdrant_query(f"127.0.0.1:{port}")
            return [str(p.id) for p in reply.result]

        @app.get("/search")
        async def endpoint(q: str) -> Any:
            return await search(q)

        with serving(app) as (url, _):
            async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
                started = time.monotonic()
                reply = await client.get("/search", params={"q": "a"})
                took = time.monotonic() - started
    assert reply.status_code == 200 and reply.json() == ["keyword hit"]
    assert took < 5.0 and wire.faults.seen["query"] == 1


# -- an upstream wait of 1e308 mapped at a front door ------------------------------------------


async def test_an_upstream_wait_of_1e308_is_503_over_http_and_unavailable_over_grpc() -> None:
    wire = QdrantGrpcWire()
    wire.faults.always("query", Fault(grpc_code="RESOURCE_EXHAUSTED", trailers=(("retry-after", "1e308"),)))
    g = Guard(Policy(stages={"search": StagePolicy(breaker=BreakerPolicy(kind="none"))}))
    with wire.running() as port:
        target = f"127.0.0.1:{port}"

        @g.guard("search")
        async def search() -> Any:
            return await _qdrant_query(target)

        app = _app(g)

        @app.get("/search")
        async def endpoint() -> Any:
            await search()
            return {}

        with serving(app) as (url, _):
            async with httpx.AsyncClient(base_url=url) as client:
                reply = await client.get("/search")
        _clean(reply, target)
        assert reply.status_code == 503 and reply.headers["retry-after"] == "86400"

        async def upstream(request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
            await search()
            return b""

        server = aio.server(interceptors=[GuardServerInterceptor(guard=g)])
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "t.Up", {"Q": grpc.unary_unary_rpc_method_handler(upstream)}
                ),
            )
        )
        up_port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with aio.insecure_channel(f"127.0.0.1:{up_port}") as channel:
                with pytest.raises(aio.AioRpcError) as info:
                    await channel.unary_unary("/t.Up/Q")(b"")
        finally:
            await server.stop(None)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert dict(info.value.trailing_metadata())["grpc-retry-pushback-ms"] == "86400000"
    assert str(port) not in info.value.details()


# -- a POST that timed out was sent twice ------------------------------------------------------


async def test_a_post_that_timed_out_is_not_sent_again_but_a_refused_one_is(closed_port: int) -> None:
    retry = RetryPolicy(attempts=2, retry_on=("connection", "timeout"), jitter_s=0.0, initial_backoff_s=0.01)
    g = Guard(
        Policy(stages={"act": StagePolicy(timeout_s=0.3, retry=retry, breaker=BreakerPolicy(kind="none"))})
    )
    wire = OpenAIWire()
    wire.faults.push("chat", Fault(delay_s=2.0))
    app = _app(g)
    with wire.running() as wire_url:
        bases = [f"http://127.0.0.1:{closed_port}/v1", f"{wire_url}/v1"]

        @g.guard("act")  # a tool call: not idempotent, so not declared so
        async def act(first_refused: bool) -> Any:
            base = bases.pop(0) if first_refused and bases else f"{wire_url}/v1"
            async with openai.AsyncOpenAI(base_url=base, api_key="k", max_retries=0) as llm:
                reply = await llm.chat.completions.create(model="m", messages=ASK)  # type: ignore[arg-type]
            return reply.choices[0].message.content

        @app.post("/act")
        async def endpoint(refused: bool = False) -> Any:
            return {"said": await act(refused)}

        with serving(app) as (url, _):
            async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
                timed_out = await client.post("/act")
                await asyncio.sleep(2.0)  # the slow first request has ended at the server
                sent_once = wire.faults.seen["chat"]
                retried = await client.post("/act", params={"refused": "true"})
    _clean(timed_out, wire_url)
    assert timed_out.status_code == 504 and sent_once == 1  # was 2: the POST went out twice
    assert retried.status_code == 200 and retried.json() == {"said": "Hello from the wire"}


# -- the request deadline bounds the whole handler -------------------------------------------


async def test_the_request_deadline_bounds_an_unguarded_handler_over_http() -> None:
    g = Guard()
    app = _app(g)
    finished = []

    @app.get("/slow")
    async def slow() -> Any:
        await asyncio.sleep(2.0)  # unguarded work
        finished.append(True)
        return {"ok": True}

    with serving(app) as (url, _):
        async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
            started = time.monotonic()
            reply = await client.get("/slow", headers={"x-request-timeout-ms": "300"})
            took = time.monotonic() - started
            await asyncio.sleep(2.0)
    assert reply.status_code == 504 and took < 1.5
    assert not finished  # the handler was cancelled


async def test_the_request_deadline_bounds_an_unguarded_handler_over_grpc() -> None:
    g = Guard(Policy(tenants={"acme": TenantQuota(timeout_s=0.3)}))
    finished = []

    async def slow(request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        await asyncio.sleep(2.0)
        finished.append(True)
        return b"ok"

    server = aio.server(interceptors=[GuardServerInterceptor(guard=g)])
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("t.S", {"Slow": grpc.unary_unary_rpc_method_handler(slow)}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            started = time.monotonic()
            with pytest.raises(aio.AioRpcError) as info:
                await channel.unary_unary("/t.S/Slow")(b"", metadata=(("x-tenant-id", "acme"),))
            took = time.monotonic() - started
        await asyncio.sleep(2.0)
    finally:
        await server.stop(None)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and took < 1.5
    assert not finished


# -- the errors real RAG services see -----------------------------------------------------------


async def test_openai_caller_errors_and_rate_limits_do_not_open_a_generic_breaker() -> None:
    breaker = BreakerPolicy(kind="generic", minimum_calls=3, window_size=3)
    g = Guard(Policy(stages={"llm": StagePolicy(breaker=breaker, retry=RetryPolicy(attempts=1))}))
    wire = OpenAIWire()
    context_length = {
        "error": {
            "message": "maximum context length is 8192 tokens",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    faults = [Fault(status=400, body=context_length), Fault(status=401), Fault(status=429)]
    app = _app(g)
    with wire.running() as wire_url:

        @g.guard("llm")
        async def answer() -> Any:
            async with openai.AsyncOpenAI(base_url=f"{wire_url}/v1", api_key="k", max_retries=0) as llm:
                return (await llm.chat.completions.create(model="m", messages=ASK)).choices[0].message.content  # type: ignore[arg-type]

        @app.get("/answer")
        async def endpoint() -> Any:
            return {"said": await answer()}

        with serving(app) as (url, _):
            async with httpx.AsyncClient(base_url=url) as client:
                statuses = []
                for fault in faults:
                    for _ in range(3):
                        wire.faults.push("chat", fault)
                        reply = await client.get("/answer")
                        _clean(reply, wire_url)
                        statuses.append(reply.status_code)
                healthy = await client.get("/answer")
    assert statuses == [400] * 3 + [502] * 3 + [503] * 3
    assert g.breaker("llm").state is BreakerState.CLOSED
    assert healthy.status_code == 200


@pytest.mark.parametrize("how", ["529", "overloaded_error inside a 200 stream"])
async def test_anthropic_overload_is_a_rejection_to_the_throttle(how: str) -> None:
    stage = StagePolicy(
        throttle=ThrottlePolicy(k=2.0, window_s=60.0, max_reject=0.9),
        retry=RetryPolicy(attempts=1),
        breaker=BreakerPolicy(kind="none"),
    )
    g = Guard(Policy(stages={"claude": stage}))
    wire = AnthropicWire()
    fault = Fault(status=529) if how == "529" else Fault(event=OVERLOADED, event_after=4)
    wire.faults.always("messages", fault)
    app = _app(g)
    with wire.running() as wire_url:

        @g.guard("claude")
        async def ask() -> Any:
            async with anthropic.AsyncAnthropic(base_url=wire_url, api_key="k", max_retries=0) as llm:
                if how == "529":
                    return await llm.messages.create(model="x", max_tokens=8, messages=ASK)  # type: ignore[arg-type]
                async with llm.messages.stream(model="x", max_tokens=8, messages=ASK) as stream:  # type: ignore[arg-type]
                    return [text async for text in stream.text_stream]

        @app.get("/ask")
        async def endpoint() -> Any:
            await ask()
            return {}

        with serving(app) as (url, _):
            async with httpx.AsyncClient(base_url=url) as client:
                replies = [await client.get("/ask") for _ in range(40)]
    for reply in replies:
        _clean(reply, wire_url)
        assert reply.status_code == 503
    # the throttle refused a share of the calls locally: the provider saw fewer than were made
    assert wire.faults.seen["messages"] < 30


_WAITS = {
    "retry-after-ms": {"retry-after-ms": "400"},
    "retry-after": {"retry-after": "1"},
    "x-ratelimit-reset-requests": {
        "x-ratelimit-reset-requests": "400ms",
        "x-ratelimit-remaining-requests": "0",
    },
}


@pytest.mark.parametrize("headers", list(_WAITS.values()), ids=list(_WAITS))
async def test_the_wait_an_sdk_error_states_is_honoured_by_the_retry(headers: dict[str, str]) -> None:
    retry = RetryPolicy(attempts=2, initial_backoff_s=0.0, jitter_s=0.0)
    g = Guard(Policy(stages={"embedding": StagePolicy(retry=retry)}))
    wire = OpenAIWire()
    wire.faults.push("embeddings", Fault(status=429, headers=headers))
    app = _app(g)
    seen: list[float] = []
    with wire.running() as wire_url:

        @g.guard("embedding")
        async def embed(texts: list[str]) -> Any:
            seen.append(time.monotonic())
            async with openai.AsyncOpenAI(base_url=f"{wire_url}/v1", api_key="k", max_retries=0) as llm:
                return len((await llm.embeddings.create(model="m", input=texts)).data)

        @app.get("/embed")
        async def endpoint() -> Any:
            return {"n": await embed(["a", "b"])}

        with serving(app) as (url, _):
            async with httpx.AsyncClient(base_url=url) as client:
                reply = await client.get("/embed")
    assert reply.status_code == 200 and reply.json() == {"n": 2}
    assert len(seen) == 2
    wanted = 1.0 if "retry-after" in headers else 0.4
    assert seen[1] - seen[0] >= wanted - 0.02
    assert ragguard.degraded() == ()
