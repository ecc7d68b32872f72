"""GuardedEmbedding, GuardedRetriever and GuardedPostprocessor with llama-index-core's own
machinery (``BaseEmbedding``, ``BaseRetriever``, a ``RetrieverQueryEngine``): the embedding model
calls the OpenAI wire server through the real ``openai`` SDK, the retriever the Qdrant wire server
through the real qdrant-client. A provider failing, Retry-After, a provider that hangs, a reranker
out of memory, and a client leaving the front door during a query."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import httpx2
import openai
import pytest
from _door import Sleeps, eventually
from fastapi import FastAPI
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import Field
from llama_index.core.llms import MockLLM
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from qdrant_client import AsyncQdrantClient

import ragguard
from ragguard import Guard, Policy, StagePolicy
from ragguard.asgi import RagguardMiddleware
from ragguard.breakers import BreakerState
from ragguard.integrations import send_tenant_header, tenant_headers
from ragguard.integrations.llama_index import GuardedEmbedding, GuardedPostprocessor, GuardedRetriever
from wire import Fault, OpenAIWire, QdrantWire, serving

pytestmark = pytest.mark.anyio


class WireEmbedding(BaseEmbedding):
    """An embedding model of llama-index-core calling the OpenAI wire server with the real SDK;
    ``hooks``: request hooks of its HTTP client (as OpenAIEmbedding's ``async_http_client``)."""

    base_url: str
    hooks: list[Any] = Field(default_factory=list)

    def _sdk(self) -> openai.AsyncOpenAI:
        http = httpx2.AsyncClient(event_hooks={"request": list(self.hooks)})
        return openai.AsyncOpenAI(
            base_url=f"{self.base_url}/v1", api_key="k", max_retries=0, http_client=http
        )

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return (await self._aget_text_embeddings([query]))[0]

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return (await self._aget_text_embeddings([text]))[0]

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        async with self._sdk() as sdk:
            got = await sdk.embeddings.create(model=self.model_name, input=texts)
        return [d.embedding for d in got.data]

    def _get_query_embedding(self, query: str) -> list[float]:
        raise NotImplementedError

    def _get_text_embedding(self, text: str) -> list[float]:
        raise NotImplementedError


class WireRetriever(BaseRetriever):
    """A retriever searching the Qdrant wire server with the real qdrant-client (REST)."""

    def __init__(self, client: AsyncQdrantClient) -> None:
        super().__init__()
        self.client = client

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        got = await self.client.query_points("docs", query=[0.1, 0.2], limit=5)
        return [NodeWithScore(node=TextNode(text=str(p.payload)), score=p.score) for p in got.points]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        raise NotImplementedError


class KeywordRetriever(BaseRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [NodeWithScore(node=TextNode(text="keyword"), score=0.1)]


class BoundedReranker(BaseNodePostprocessor):
    """A reranker that runs out of memory above ``max_batch`` nodes, scoring by text length."""

    top_n: int = 3
    max_batch: int = 100
    calls: list[int] = Field(default_factory=list)

    async def _apostprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: Any = None) -> Any:
        self.calls.append(len(nodes))
        if len(nodes) > self.max_batch:
            raise MemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        scored = [NodeWithScore(node=n.node, score=float(len(n.node.get_content()))) for n in nodes]
        return sorted(scored, key=lambda n: n.score or 0.0, reverse=True)[: self.top_n]

    def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: Any = None) -> Any:
        raise NotImplementedError


@pytest.fixture
def qdrant(qdrant_wire: QdrantWire, closing: list[Any]) -> AsyncQdrantClient:
    client = AsyncQdrantClient(url=qdrant_wire.url, check_compatibility=False)
    closing.append(client)
    return client


async def test_the_embedding_model_falls_back_to_the_cache_and_waits_retry_after(
    openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    g = Guard(sleep=sleeps)
    model = GuardedEmbedding(WireEmbedding(base_url=openai_wire.url, model_name="wire-small"), guard=g)
    texts = await model.aget_text_embedding_batch(["alpha", "beta"])
    query = await model.aget_query_embedding("alpha")
    openai_wire.faults.push("embeddings", Fault(status=429, headers={"retry-after": "1"}))
    assert await model.aget_text_embedding("gamma") == [5.0, 0.5, 0.25]
    assert 1.0 in sleeps.waits
    openai_wire.faults.always("embeddings", Fault(status=503))
    assert await model.aget_text_embedding_batch(["beta", "alpha"]) == [texts[1], texts[0]]
    assert await model.aget_query_embedding("alpha") == query  # queries cached apart from texts
    assert "embedding_cache" in ragguard.degraded()
    with pytest.raises(openai.InternalServerError):
        await model.aget_query_embedding("beta")  # a text, never embedded as a query
    with pytest.raises(TypeError, match="async only"):
        model.get_query_embedding("alpha")


async def test_the_guards_tenant_header_reaches_the_store_the_fallback_and_a_hooked_embedding_client(
    openai_wire: OpenAIWire,
    qdrant_wire: QdrantWire,
    qdrant: AsyncQdrantClient,
    closing: list[Any],
    sleeps: Sleeps,
) -> None:
    g = Guard(sleep=sleeps, tenant_header="x-tenant-id")
    backup = AsyncQdrantClient(url=qdrant_wire.url, check_compatibility=False)
    closing.append(backup)
    retriever = GuardedRetriever(WireRetriever(qdrant), guard=g, fallback=WireRetriever(backup))
    hooked = WireEmbedding(base_url=openai_wire.url, hooks=[send_tenant_header])
    embedding = GuardedEmbedding(hooked, guard=g)
    async with g.tenant("acme"):
        await retriever.aretrieve("q")
        qdrant_wire.faults.push("query", Fault(status=400), times=1)  # a caller's error: no fallback
        with pytest.raises(Exception):  # noqa: B017 - qdrant-client's error of the 400
            await retriever.aretrieve("q")
        qdrant_wire.faults.push("query", Fault(status=503), times=2)  # both attempts: the fallback
        await retriever.aretrieve("q")
        await embedding.aget_query_embedding("alpha")
        assert tenant_headers() == {}  # only while a wrapped call runs
    assert [r["headers"].get("x-tenant-id") for r in qdrant_wire.requests] == ["acme"] * 5
    assert [r["headers"].get("x-tenant-id") for r in openai_wire.requests] == ["acme"]


async def test_a_hanging_embedding_model_is_cut_by_the_stage_timeout(
    openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    g = Guard(Policy(stages={"embedding": StagePolicy(timeout_s=0.3)}), sleep=sleeps)
    model = GuardedEmbedding(WireEmbedding(base_url=openai_wire.url), guard=g)
    openai_wire.faults.push("embeddings", Fault(delay_s=3.0))
    with pytest.raises(ragguard.StageTimeout):
        await model.aget_query_embedding("delta")
    assert openai_wire.faults.seen["embeddings"] == 1  # the embedding stage retries no timeout


async def test_a_failing_store_opens_the_retrievers_breaker_and_the_fallback_serves(
    qdrant_wire: QdrantWire, qdrant: AsyncQdrantClient, sleeps: Sleeps
) -> None:
    g = Guard(sleep=sleeps)
    retriever = GuardedRetriever(WireRetriever(qdrant), guard=g, fallback=KeywordRetriever())
    assert [n.score for n in await retriever.aretrieve("q")] == [pytest.approx(0.9)]
    qdrant_wire.faults.push("query", Fault(status=429, headers={"retry-after": "2"}))
    assert len(await retriever.aretrieve("q")) == 1 and 2.0 in sleeps.waits
    qdrant_wire.faults.always("query", Fault(status=503))
    for _ in range(4):
        nodes = await retriever.aretrieve("q")
        assert [n.node.get_content() for n in nodes] == ["keyword"]
    assert g.breaker("vector_store").state is BreakerState.OPEN
    assert "KeywordRetriever" in ragguard.degraded()


async def test_a_hanging_store_is_cut_and_served_by_the_fallback(
    qdrant_wire: QdrantWire, qdrant: AsyncQdrantClient, sleeps: Sleeps
) -> None:
    g = Guard(Policy(stages={"vector_store": StagePolicy(timeout_s=0.3)}), sleep=sleeps)
    retriever = GuardedRetriever(WireRetriever(qdrant), guard=g, fallback=KeywordRetriever())
    qdrant_wire.faults.push("query", Fault(delay_s=3.0), times=2)
    nodes = await retriever.aretrieve("q")
    assert [n.node.get_content() for n in nodes] == ["keyword"]
    assert qdrant_wire.faults.seen["query"] == 2


async def test_a_reranker_out_of_memory_scores_in_chunks_then_is_skipped() -> None:
    g = Guard()
    nodes = [NodeWithScore(node=TextNode(text="x" * n), score=1.0 / n) for n in range(1, 9)]
    reranker = BoundedReranker(max_batch=4)  # the floor of the learnt batch limit is 4
    guarded = GuardedPostprocessor(reranker, guard=g)
    ranked = await guarded.apostprocess_nodes(nodes, query_str="q")
    assert [len(n.node.get_content()) for n in ranked] == [8, 7, 6]  # the best three of all eight
    assert reranker.calls[0] == 8 and max(reranker.calls[1:]) <= 4
    assert "chunked_rerank" in ragguard.degraded()
    broken = GuardedPostprocessor(BoundedReranker(max_batch=0), guard=Guard())
    skipped = await broken.apostprocess_nodes(nodes, query_str="q")
    assert [len(n.node.get_content()) for n in skipped] == [1, 2, 3]  # retrieval order, cut to top_n


async def test_a_query_engine_of_the_guarded_parts_answers_and_a_leaving_client_cancels_it(
    openai_wire: OpenAIWire, qdrant_wire: QdrantWire, qdrant: AsyncQdrantClient
) -> None:
    g = Guard()
    retriever = GuardedRetriever(WireRetriever(qdrant), guard=g)
    reranker = GuardedPostprocessor(BoundedReranker(), guard=g)
    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM(), node_postprocessors=[reranker])
    answer = await engine.aquery("what is a generator?")
    assert len(answer.source_nodes) == 1 and answer.source_nodes[0].node.get_content()
    qdrant_wire.faults.push("query", Fault(delay_s=10.0))
    ended: list[str] = []
    app = FastAPI()
    app.add_middleware(RagguardMiddleware, guard=g)

    @app.get("/ask")
    async def ask() -> Any:
        try:
            await engine.aquery("what is a generator?")
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise
        return {}

    with serving(app) as (url, _):
        async with httpx.AsyncClient(base_url=url) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.get("/ask", timeout=0.5)
        await eventually(lambda: ended == ["cancelled"], within_s=3.0)
