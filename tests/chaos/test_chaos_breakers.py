"""The typed breakers open on real network faults through the proxy and close when it heals."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
import redis
import redis.asyncio as aredis
from chaos_helpers import echo_stub, grpc_channel, grpc_echo_server
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ragguard import EmbeddingUnavailable, RerankOutOfMemory, VectorStoreUnavailable
from ragguard.breakers import (
    BreakerState,
    EmbeddingTimeoutBreaker,
    RerankOOMBreaker,
    VectorStoreUnavailableBreaker,
)
from ragguard.chaos import Chaos, Error, FaultProxy, batch_size

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

OPEN_FOR_S = 0.3


async def _wait_half_open(breaker) -> None:
    for _ in range(40):  # bounded: open_for_s is 0.3 s
        if breaker.state is not BreakerState.OPEN:
            return
        await asyncio.sleep(0.02)


async def test_vector_store_breaker_opens_on_refused_and_reset_connections(redis_server, fault_proxy) -> None:
    proxy: FaultProxy = fault_proxy(redis_server)
    client = aredis.Redis(host=proxy.host, port=proxy.port, socket_timeout=1, retry=Retry(NoBackoff(), 0))
    breaker = VectorStoreUnavailableBreaker(minimum_calls=4, window_size=4, open_for_s=OPEN_FOR_S,
                                            half_open_permits=1)
    assert await breaker.call(client.ping)

    proxy.reset()   # open connections get an RST ...
    proxy.refuse()  # ... and new ones ECONNREFUSED
    failures = 0
    for _ in range(10):  # bounded
        try:
            await breaker.call(client.ping)
        except redis.ConnectionError:
            failures += 1
        except VectorStoreUnavailable as exc:
            assert exc.breaker == "vector_store"
            break
    assert breaker.state is BreakerState.OPEN
    assert failures >= 2
    with pytest.raises(VectorStoreUnavailable):
        await breaker.call(client.ping)

    proxy.heal()
    await _wait_half_open(breaker)
    assert await breaker.call(client.ping)  # the trial call reaches the real server
    assert breaker.state is BreakerState.CLOSED
    await client.aclose()


async def test_embedding_breaker_opens_on_slow_and_dropped_grpc_calls() -> None:
    async with grpc_echo_server() as port, FaultProxy(port) as proxy:
        channel = grpc_channel(proxy.target)
        echo = echo_stub(channel)
        breaker = EmbeddingTimeoutBreaker(slow_call_duration_s=0.1, minimum_calls=3, window_size=3,
                                          open_for_s=OPEN_FOR_S, half_open_permits=1)
        assert await breaker.call(echo, b"warm", timeout=5) == b"warm"

        proxy.set_latency(to_client_s=0.15)  # slow: each call past the 0.1 s slow-call line
        assert await breaker.call(echo, b"slow", timeout=5) == b"slow"
        proxy.drop()  # then nothing answers: DEADLINE_EXCEEDED
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await breaker.call(echo, b"lost", timeout=0.2)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert breaker.state is BreakerState.OPEN
        with pytest.raises(EmbeddingUnavailable):
            await breaker.call(echo, b"rejected", timeout=5)

        proxy.heal()
        await _wait_half_open(breaker)
        reply = None
        for _ in range(10):  # bounded: the channel may need a moment to reconnect
            try:
                reply = await breaker.call(echo, b"back", timeout=1)
                break
            except (grpc.aio.AioRpcError, EmbeddingUnavailable):
                await _wait_half_open(breaker)
        assert reply == b"back"
        assert breaker.state is BreakerState.CLOSED
        await channel.close()


async def test_rerank_breaker_opens_on_injected_oom_for_big_batches_only() -> None:
    chaos = Chaos(rng=random.Random(0))
    chaos.inject(Error(kind="cuda_oom", min_batch=16), stage="rerank")
    breaker = RerankOOMBreaker(open_for_s=OPEN_FOR_S)

    async def rerank(docs: list[str]) -> list[str]:
        async def real() -> list[str]:
            return sorted(docs)

        with batch_size(len(docs)):
            return await chaos("rerank", "default", real)

    assert await breaker.call(rerank, ["b", "a"]) == ["a", "b"]
    for _ in range(3):
        with pytest.raises(RuntimeError, match="CUDA out of memory"):
            await breaker.call(rerank, [str(i) for i in range(32)])
    assert breaker.state is BreakerState.OPEN
    with pytest.raises(RerankOutOfMemory):
        await breaker.call(rerank, ["a"])
    chaos.clear()
    await _wait_half_open(breaker)
    assert len(await breaker.call(rerank, [str(i) for i in range(32)])) == 32
    assert breaker.state is BreakerState.CLOSED
