"""A LlamaIndex query engine built from guarded parts: the embedding model, the retriever, the reranker.

    .venv/bin/python examples/integrations/llama_index_query.py \
        --base-url http://127.0.0.1:8000/v1 --qdrant-url http://127.0.0.1:6333

The query is embedded (the embedding stage: cached, served from the cache when the model fails),
the nodes retrieved from Qdrant (the vector-store stage: a keyword retriever answers when Qdrant
fails or its breaker is open), then reranked (the rerank stage: scored in chunks after an
out-of-memory error, else left in retrieval order). The embedding model and the retriever here
are small classes over the openai SDK and qdrant-client so that only llama-index-core is needed;
``GuardedEmbedding(OpenAIEmbedding(max_retries=0))`` and ``GuardedRetriever(index.as_retriever())``
wrap LlamaIndex's own the same way. Needs the ``llama-index``, ``openai`` and ``qdrant`` extras.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import openai
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from qdrant_client import AsyncQdrantClient

import ragguard
from ragguard.integrations.llama_index import GuardedEmbedding, GuardedPostprocessor, GuardedRetriever


class Embedding(BaseEmbedding):
    base_url: str

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return (await self._aget_text_embeddings([query]))[0]

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return (await self._aget_text_embeddings([text]))[0]

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        async with openai.AsyncOpenAI(base_url=self.base_url, api_key="sk-local", max_retries=0) as sdk:
            got = await sdk.embeddings.create(model=self.model_name, input=texts)
        return [d.embedding for d in got.data]

    def _get_query_embedding(self, query: str) -> list[float]:
        raise NotImplementedError("async only")

    def _get_text_embedding(self, text: str) -> list[float]:
        raise NotImplementedError("async only")


class QdrantRetriever(BaseRetriever):
    def __init__(self, client: AsyncQdrantClient, embed: BaseEmbedding) -> None:
        super().__init__()
        self.client, self.embed = client, embed

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        vector = await self.embed.aget_query_embedding(query_bundle.query_str)
        found = await self.client.query_points("docs", query=vector, limit=10)
        return [NodeWithScore(node=TextNode(text=str(p.payload)), score=p.score) for p in found.points]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        raise NotImplementedError("async only")


class KeywordRetriever(BaseRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [NodeWithScore(node=TextNode(text="a keyword match"), score=0.1)]  # yours: BM25


class LengthReranker(BaseNodePostprocessor):
    top_n: int = 3

    def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: Any = None) -> list[NodeWithScore]:
        return sorted(nodes, key=lambda n: len(n.node.get_content()), reverse=True)[: self.top_n]


async def main(base_url: str, qdrant_url: str) -> None:
    qdrant = AsyncQdrantClient(url=qdrant_url, check_compatibility=False)
    try:
        embed = GuardedEmbedding(Embedding(base_url=base_url, model_name="local-embedder"))
        retriever = GuardedRetriever(QdrantRetriever(qdrant, embed), fallback=KeywordRetriever())
        engine = RetrieverQueryEngine.from_args(
            retriever, llm=MockLLM(), node_postprocessors=[GuardedPostprocessor(LengthReranker())]
        )
        async with ragguard.tenant("acme"), ragguard.deadline(10):
            answer = await engine.aquery("What is a context manager?")
            print(f"sources: {[n.node.get_content() for n in answer.source_nodes]}")
            print(f"degraded: {list(ragguard.degraded()) or 'no'}")
    finally:
        await qdrant.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--qdrant-url", default="http://127.0.0.1:6333")
    args = parser.parse_args()
    asyncio.run(main(args.base_url, args.qdrant_url))
