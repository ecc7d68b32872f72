"""Fixtures of the distributed tests: a real redis-server (``redis_server`` from ragguard's pytest
plugin) and redis.asyncio clients that surface faults instead of retrying them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio as aredis
from distributed_helpers import PATIENT_S, make_client, redis_for_the_module

from ragguard import events


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client(redis_server: Any) -> AsyncIterator[aredis.Redis]:
    """A client straight to ``redis_server``, with patient socket timeouts (``PATIENT_S``): no test
    slows Redis through it, so only a loaded machine could make it time out."""
    c = make_client(redis_server.host, redis_server.port, socket_timeout=PATIENT_S,
                    socket_connect_timeout=PATIENT_S)
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


@pytest.fixture(scope="module")
def module_redis() -> Iterator[Any]:
    """One real redis-server for the whole module (a Hypothesis test's examples share it)."""
    with redis_for_the_module() as server:
        yield server
