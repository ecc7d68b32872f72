"""A guarded three-stage RAG retrieval, run against dependencies that fail on purpose.

    .venv/bin/python examples/quickstart.py

The vector store refuses connections after the first requests; the reranker runs out of memory on
batches above 8. The guarded pipeline keeps answering: keyword search takes over once the vector
store fails (the retrieval step's fallback), and rerank scores every candidate in chunks it can hold.
Each line shows what served the request.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import ragguard
from ragguard import deadline, guard, tenant


@dataclass(frozen=True)
class Hit:
    text: str
    score: float = 0.0  # set by the reranker; chunked rerank merges chunks by it


DOCS = [f"passage {i} about python {'generators' if i % 3 == 0 else 'decorators'}" for i in range(40)]
state = {"store_up": True}


@guard("embedding")
async def embed(texts: list[str]) -> list[list[float]]:
    await asyncio.sleep(0.001)
    return [[float(len(t)), float(t.count("e"))] for t in texts]


@guard("vector_store")
async def search(vector: list[float], k: int) -> list[Hit]:
    if not state["store_up"]:
        raise ConnectionRefusedError("vector store: connection refused")
    return [Hit(d) for d in DOCS[:k]]


async def keyword_search(query: str, k: int) -> list[Hit]:
    """The fallback: a keyword match over the same passages (BM25 in a real service)."""
    words = query.split()
    return [Hit(d) for d in DOCS if any(w in d for w in words)][:k]


# A step of its own, taking what keyword search takes: when the embedding fails (and its cache
# misses) or the store does, the request is answered by keyword search. Its two stages have the
# breakers; breaker=False keeps the step from counting the same failures again.
@guard("retrieval", fallback=keyword_search, breaker=False)
async def candidates(query: str, k: int) -> list[Hit]:
    return await search((await embed([query]))[0], k)


@guard("rerank", candidates="hits")  # OOM -> every hit scored in chunks that fit -> skip rerank
async def rerank(query: str, hits: list[Hit]) -> list[Hit]:
    if len(hits) > 8:
        raise MemoryError(f"rerank batch of {len(hits)} does not fit")
    return sorted((Hit(h.text, float(h.text.count(query))) for h in hits), key=lambda h: -h.score)


async def main() -> None:
    ragguard.configure(
        ragguard.Policy(tenants={"acme": ragguard.TenantQuota(max_concurrency=4, timeout_s=1.0)})
    )
    for i in range(12):
        if i == 3:
            state["store_up"] = False
        async with tenant("acme"), deadline(0.8):
            hits = await rerank("generators", await candidates("generators", k=20))
            served = ", ".join(ragguard.degraded()) or "healthy path"
        breaker = ragguard.default_guard().breaker("vector_store")
        print(
            f"request {i:2d}: {len(hits)} hits, top={hits[0].text!r:40} served by: {served:32} "
            f"vector_store breaker: {breaker.state.value}"
        )


if __name__ == "__main__":
    asyncio.run(main())
