"""Prove that a RAG pipeline survives a vector-store outage, in your own pytest suite.

    .venv/bin/pytest examples/chaos_test_example.py -q        # or: python examples/chaos_test_example.py

The vector store is a real ``redis-server`` (a list of passages per topic) reached through
ragguard's ``fault_proxy``; the fixtures come from ragguard's pytest plugin, no import needed.
The test stops the proxy (the store goes away: connections closed, port refused), checks that
the pipeline keeps answering from its keyword fallback and that the vector-store breaker opens,
then restarts the proxy and checks that answers come from the store again.
"""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

import ragguard
from ragguard.breakers import BreakerState

PASSAGES = {
    "generators": ["a generator function uses yield", "generators are lazy iterators"],
    "decorators": ["a decorator wraps a function", "functools.wraps keeps the name"],
}


class Pipeline:
    """retrieve(query) -> passages: the store when it answers, keyword search when it does not."""

    def __init__(self, store: aredis.Redis) -> None:
        self.store = store
        self.guard = ragguard.Guard(ragguard.Policy())
        self.search = self.guard.guard("vector_store", fallback=self.keyword_search)(self.store_search)

    async def store_search(self, topic: str, k: int) -> list[str]:
        hits = await self.store.lrange(f"topic:{topic}", 0, k - 1)
        return [h.decode() for h in hits]

    async def keyword_search(self, topic: str, k: int) -> list[str]:
        words = topic.rstrip("s")
        return [p for ps in PASSAGES.values() for p in ps if words in p][:k]

    async def retrieve(self, topic: str) -> list[str]:
        return await self.search(topic, 5)


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_pipeline_survives_a_vector_store_outage(redis_server, fault_proxy) -> None:
    seed = aredis.Redis.from_url(redis_server.url)
    for topic, passages in PASSAGES.items():
        await seed.rpush(f"topic:{topic}", *passages)
    await seed.aclose()

    proxy = fault_proxy(redis_server)  # the pipeline talks to the store through the proxy
    store = aredis.Redis(
        host=proxy.host,
        port=proxy.port,
        socket_timeout=0.5,
        socket_connect_timeout=0.5,
        retry=Retry(NoBackoff(), 0),
    )
    pipeline = Pipeline(store)
    assert await pipeline.retrieve("generators") == PASSAGES["generators"]
    assert ragguard.degraded() == ()

    proxy.stop()  # outage: open connections closed, new ones refused
    t0 = time.perf_counter()
    for _ in range(20):
        hits = await pipeline.retrieve("generators")
        assert hits, "the pipeline must keep answering during the outage"
        assert all("generator" in h for h in hits)
    assert time.perf_counter() - t0 < 5.0  # no request waited out a long timeout
    assert "keyword_search" in ragguard.degraded()
    assert pipeline.guard.breaker("vector_store").state is BreakerState.OPEN

    proxy.restart()  # the store is back; once the breaker lets a trial through, answers are fresh
    pipeline.guard.breaker("vector_store").reset()
    assert await pipeline.retrieve("decorators") == PASSAGES["decorators"]
    await store.aclose()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


if __name__ == "__main__":
    raise SystemExit(
        pytest.main(
            [__file__, "-q", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning"]
        )
    )
