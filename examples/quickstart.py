"""A guarded three-stage RAG retrieval, run against dependencies that fail on purpose.

    .venv/bin/python examples/quickstart.py

The vector store refuses connections after the first requests; the reranker runs out of memory on
batches above 8. The guarded pipeline keeps answering: keyword search takes over once the vector-store
breaker opens, and rerank runs on a smaller batch. Each line shows what served the request.
"""

from __future__ import annotations

import asyncio

import ragguard
from ragguard import deadline, guard, tenant

DOCS = [f"passage {i} about python {'generators' if i % 3 == 0 else 'decorators'}" for i in range(40)]
state = {"store_up": True}


@guard("embedding")
async def embed(texts: list[str]) -> list[list[float]]:
    await asyncio.sleep(0.001)
    return [[float(len(t)), float(t.count("e"))] for t in texts]


async def keyword_search(query_vec: list[list[float]], k: int) -> list[str]:
    return [d for d in DOCS if "generators" in d][:k]


@guard("vector_store", fallback=keyword_search)
async def search(query_vec: list[list[float]], k: int) -> list[str]:
    if not state["store_up"]:
        raise ConnectionRefusedError("vector store: connection refused")
    return DOCS[:k]


@guard("rerank")
async def rerank(query: str, hits: list[str]) -> list[str]:
    if len(hits) > 8:
        raise MemoryError(f"rerank batch of {len(hits)} does not fit")
    return sorted(hits, key=lambda h: -h.count(query))


async def main() -> None:
    ragguard.configure(
        ragguard.Policy(tenants={"acme": ragguard.TenantQuota(max_concurrency=4, timeout_s=1.0)})
    )
    for i in range(12):
        if i == 3:
            state["store_up"] = False
        async with tenant("acme"), deadline(0.8):
            hits = await rerank("generators", await search(await embed(["what is a generator?"]), k=20))
            served = ", ".join(ragguard.degraded()) or "healthy path"
        breaker = ragguard.default_guard().breaker("vector_store")
        print(
            f"request {i:2d}: {len(hits)} hits, top={hits[0]!r:40} served by: {served:28} "
            f"vector_store breaker: {breaker.state.value}"
        )


if __name__ == "__main__":
    asyncio.run(main())
