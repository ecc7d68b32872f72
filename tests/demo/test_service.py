"""The retrieval gRPC service with the unguarded pipeline, against real backends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from ragguard.demo.backends import BackendServers, ControlClient
from ragguard.demo.corpus import Passage, load_questions
from ragguard.demo.pipeline import BackendClients, PipelineSettings, UnguardedPipeline
from ragguard.demo.rerank import Reranker
from ragguard.demo.service import RetrievalClient, RetrievalServer

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
