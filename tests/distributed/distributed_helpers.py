"""Helpers shared by the distributed tests (a module of its own: ``conftest`` names clash across folders)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ragguard import Policy
from ragguard.chaos import RedisServer, RedisServerUnavailable
from ragguard.chaos._redis_server import find_redis_server
from ragguard.options import BreakerPolicy, StagePolicy

PATIENT_S = 2.0
"""Redis link (``redis_timeout_s``) and socket timeouts for tests whose subject is not a timeout.

The 0.25 s link default is tight on a loaded 2-core machine: a command can wait that long for a
CPU, and one timed-out command leaves a replica unsynced (or, repeated, on its local fallback)
without any outage. A stopped Redis refuses connections at once, so outages still show at once."""

BREAKER_PATIENT_S = 0.8
"""The shared breaker's patient ``redis_timeout_s``: below its default ``staleness_s`` (1 s) less
its ``flush_interval_s`` (0.1 s), as the breaker requires."""

PATIENT = {"quotas": {"redis_timeout_s": PATIENT_S}, "breakers": {"redis_timeout_s": BREAKER_PATIENT_S}}
"""``Guard(redis_options=PATIENT)``: patient links for its quotas and breakers."""


def make_client(host: str, port: int, **kw: Any) -> aredis.Redis:
    """A client as docs/distributed.md recommends: short socket timeouts, no retries of its own."""
    kw.setdefault("socket_timeout", 0.5)
    kw.setdefault("socket_connect_timeout", 0.5)
    return aredis.Redis(host=host, port=port, retry=Retry(NoBackoff(), 0), **kw)


def breaker_policy(stage: str, **breaker: Any) -> Policy:
    """A policy whose ``stage`` has a generic breaker with ``breaker`` options."""
    return Policy(stages={stage: StagePolicy(breaker=BreakerPolicy(kind="generic", **breaker))})


async def until(cond: Callable[[], bool], limit_s: float,
                step: Callable[[], Awaitable[Any]] | None = None) -> float:
    """Seconds until ``cond()`` held (polling every 10 ms, running ``step`` each time), or inf."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if step is not None:
            await step()
        if cond():
            return time.monotonic() - t0
        await asyncio.sleep(0.01)
    return float("inf")


async def evalsha_calls(client: Any) -> int:
    """How many EVALSHA commands the server has run since its start (INFO commandstats)."""
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def leases_in(client: Any, key: Any) -> int:
    """The leases in a quota's lease set (ZCARD, less its ``tat`` member: the rate's state)."""
    return int(await client.zcard(key)) - (1 if await client.zscore(key, "tat") is not None else 0)


@contextlib.contextmanager
def redis_for_the_module() -> Iterator[RedisServer]:
    """One real redis-server for a whole module (a Hypothesis test's examples share it); the
    module is skipped when no redis-server is installed or none will start."""
    if find_redis_server() is None:
        pytest.skip("redis-server not found on PATH")
    try:
        with RedisServer() as server:
            yield server
    except RedisServerUnavailable as exc:
        pytest.skip(f"redis-server would not start: {exc}")
