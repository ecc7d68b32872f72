"""Against a real redis-server: a stream on a Redis-shared half-open breaker asks for a trial
permit (``acquire_async``) as a call does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import pytest
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ragguard import BreakerOpen, BreakerPolicy, BreakerState, FakeClock, Guard, Policy, StagePolicy
from ragguard.redis import RedisBackend

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


@pytest.fixture
async def client(redis_server: Any) -> AsyncIterator[aredis.Redis]:
    c = aredis.Redis(
        host=redis_server.host,
        port=redis_server.port,
        socket_timeout=0.5,
        socket_connect_timeout=0.5,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        yield c
    finally:
        await c.aclose()


def _policy() -> Policy:
    breaker = BreakerPolicy(
        kind="generic",
        minimum_calls=1,
        window_size=1,
        failure_rate_threshold=100,
        open_for_s=5,
        half_open_permits=1,
    )
    return Policy(stages={"tokens": StagePolicy(breaker=breaker), "answer": StagePolicy(breaker=breaker)})


@pytest.mark.parametrize("shape", ["stream", "call"])
async def test_a_shared_half_open_breaker_gives_a_trial_permit_to_a_stream_as_to_a_call(
    client: aredis.Redis, shape: str
) -> None:
    clock = FakeClock(1_000_000.0)
    g = Guard(_policy(), clock=clock, backend=RedisBackend(client, prefix=f"parity-{shape}"))
    failing = True

    @g.guard("tokens")
    async def tokens() -> Any:
        if failing:
            raise ConnectionRefusedError("down")
        for word in ("a", "b"):
            yield word

    @g.guard("answer")
    async def answer() -> str:
        if failing:
            raise ConnectionRefusedError("down")
        return "ok"

    async def run() -> Any:
        if shape == "call":
            return await answer()
        async with aclosing(tokens()) as stream:
            return [w async for w in stream]

    breaker = g.breaker("answer" if shape == "call" else "tokens")
    try:
        await breaker.refresh()  # joined the shared state
        with pytest.raises(ConnectionRefusedError):
            await run()
        await breaker.refresh()  # the failure reaches Redis: open for every replica
        assert breaker.shared and breaker.state is BreakerState.OPEN
        with pytest.raises(BreakerOpen):
            await run()
        clock.advance(5.0)
        failing = False
        # half-open: no permit was fetched in the background, so only a round trip can get one
        assert await run() == ("ok" if shape == "call" else ["a", "b"])
        await breaker.refresh()
        assert breaker.state is BreakerState.CLOSED  # the trial's success closed it everywhere
    finally:
        await g.aclose()
