"""Fixtures of the distributed tests: a real redis-server (``redis_server`` from ragguard's pytest
plugin) and redis.asyncio clients that surface faults instead of retrying them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ragguard import events


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_client(host: str, port: int, **kw: Any) -> aredis.Redis:
    """A client as docs/distributed.md recommends: short socket timeouts, no retries of its own."""
    kw.setdefault("socket_timeout", 0.5)
    kw.setdefault("socket_connect_timeout", 0.5)
    return aredis.Redis(host=host, port=port, retry=Retry(NoBackoff(), 0), **kw)


@pytest.fixture
async def client(redis_server: Any) -> AsyncIterator[aredis.Redis]:
    c = make_client(redis_server.host, redis_server.port)
    try:
        yield c
    finally:
        await c.aclose()


@pytest.fixture
def seen() -> Any:
    """Every event emitted on ``ragguard.events.bus`` during the test, in order."""
    got: list[Any] = []
    unsubscribe: Callable[[], None] = events.bus.subscribe(got.append)
    try:
        yield got
    finally:
        unsubscribe()
