"""The retrieval gRPC service with the unguarded pipeline, against real backends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from ragguard import InvalidInput
from ragguard_tools.demo.backends import BackendServers, ControlClient
from ragguard_tools.demo.corpus import Passage, load_questions
from ragguard_tools.demo.loadgen import Arrival, run_load
from ragguard_tools.demo.pipeline import BackendClients, PipelineSettings, UnguardedPipeline
from ragguard_tools.demo.rerank import Reranker
from ragguard_tools.demo.service import RetrievalClient, RetrievalServer

REFUSED = {"kind": "error", "stage": "vector_store", "error": "connection_refused"}

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


@dataclass
class Stack:
    client: RetrievalClient
    control: ControlClient
    reranker: Reranker


@pytest.fixture
async def stack(
    demo_backends: BackendServers, demo_reranker: Reranker, demo_passages: list[Passage]
) -> AsyncIterator[Stack]:
    assert demo_backends.addresses is not None
    clients = BackendClients(demo_backends.addresses)
    pipeline = UnguardedPipeline(
        clients, demo_reranker, demo_passages, PipelineSettings(embed_timeout_s=2, search_timeout_s=2)
    )
    server = RetrievalServer(pipeline, demo_passages, capacity=2)
    address = await server.start()
    client = RetrievalClient(address)
    control = ControlClient(demo_backends.addresses.control)
    try:
        yield Stack(client, control, demo_reranker)
    finally:
        await client.close()
        await control.close()
        await server.stop()
        await clients.close()


async def test_retrieve_answers_the_labelled_questions(stack: Stack) -> None:
    questions = load_questions()
    hits = 0
    for q in questions:
        reply = await stack.client.retrieve("acme", q.text, timeout_s=5)
        assert len(reply["hits"]) == 5 and reply["fallbacks"] == []
        hits += any(set(q.topics) & set(h["topics"]) for h in reply["hits"])
    recall = hits / len(questions)
    assert recall >= 0.8, f"recall@5 of the healthy pipeline is {recall:.2f}"


@pytest.mark.parametrize("query", ["", "  ", "x" * 3000])
async def test_bad_queries_are_invalid_argument(stack: Stack, query: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stack.client.retrieve("acme", query, timeout_s=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_unguarded_fails_while_the_vector_store_is_down(stack: Stack) -> None:
    await stack.control.set_faults([REFUSED])
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stack.client.retrieve("acme", "what does yield do", timeout_s=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_unguarded_fails_when_rerank_runs_out_of_memory(stack: Stack) -> None:
    stack.reranker.set_budget(1024)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stack.client.retrieve("acme", "what does yield do", timeout_s=5)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "out of memory" in (info.value.details() or "")


async def test_slow_embeddings_fill_the_capacity_and_requests_are_refused(stack: Stack) -> None:
    await stack.control.set_faults([{"kind": "latency", "stage": "embedding", "seconds": 0.5}])
    results = await asyncio.gather(
        *(stack.client.retrieve("acme", f"question {i}", timeout_s=5) for i in range(5)),
        return_exceptions=True,
    )
    refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert refused and all(r.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for r in refused)
    assert sum(isinstance(r, dict) for r in results) == 2


async def answer(stack: Stack, query: str, tenant: str = "acme") -> tuple[list[str], list[dict[str, Any]]]:
    words: list[str] = []
    others: list[dict[str, Any]] = []
    async for message in stack.client.answer(tenant, query, timeout_s=5):
        if "text" in message:
            words.append(message["text"])
        else:
            others.append(message)
    return words, others


async def test_answer_streams_the_words_then_the_passages(stack: Stack) -> None:
    words, (last,) = await answer(stack, "When does the finally clause of a try statement run?")
    retrieved = await stack.client.retrieve("acme", "When does the finally clause of a try statement run?",
                                            timeout_s=5)
    assert len(words) == 30 and all(w.endswith(" ") for w in words)
    assert last == retrieved, "the last message is Retrieve's reply"


async def test_unguarded_answers_wait_out_a_stall_and_pass_a_broken_stream_through(stack: Stack) -> None:
    await stack.control.set_faults([{"kind": "latency", "stage": "generation_midway", "seconds": 0.6}])
    t0 = time.perf_counter()
    words, _ = await answer(stack, "what does yield do")
    assert len(words) == 30 and time.perf_counter() - t0 >= 0.6, "nothing bounds the stall"
    reset = {"kind": "error", "stage": "generation_midway", "error": "connection_reset"}
    await stack.control.set_faults([reset])
    got: list[str] = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for message in stack.client.answer("acme", "what does yield do", timeout_s=5):
            got.append(message["text"])
    assert len(got) == 15 and info.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("query", ["", "x" * 3000])
async def test_bad_answer_queries_are_invalid_argument(stack: Stack, query: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await answer(stack, query)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_the_load_generator_times_each_answers_words(stack: Stack) -> None:
    questions = load_questions()[:2]
    await stack.control.set_faults([{"kind": "latency", "stage": "generation_midway", "seconds": 1.2}])
    arrivals = [Arrival(0.0, "acme", 0), Arrival(0.05, "acme", 1)]
    records = await run_load({"acme": stack.client}, arrivals, questions, timeout_s=5, max_in_flight=2,
                             rpc="answer")
    for r in records:
        assert r.outcome == "ok" and r.words == 30 and r.hit is not None
        assert r.tokens > r.words, "a word with its space is one or more tokens"
        assert r.ttft_s is not None and 0 < r.ttft_s < 1.0
        assert r.max_gap_s >= 1.2 > r.ttft_s, "the stall is the longest wait between two words"
        assert r.latency_s >= r.ttft_s + r.max_gap_s
    with pytest.raises(InvalidInput, match="rpc"):
        await run_load({"acme": stack.client}, arrivals, questions, timeout_s=5, max_in_flight=2,
                       rpc="stream")


def test_a_capacity_below_one_is_refused(demo_passages: list[Passage]) -> None:
    with pytest.raises(InvalidInput, match="capacity"):
        RetrievalServer(Any, demo_passages, capacity=0)  # refused before the pipeline is read
