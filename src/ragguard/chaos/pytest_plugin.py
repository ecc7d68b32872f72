"""ragguard's pytest plugin (registered through the ``pytest11`` entry point).

Fixtures, available in any suite once ragguard is installed:

``fake_clock``            a :class:`ragguard.FakeClock` at 0.0 s
``chaos``                 a :class:`ragguard.chaos.Chaos` installed as the injector, removed after the test
``redis_server``          a real ``redis-server`` on a free 127.0.0.1 port for one test (skips without one)
``redis_server_session``  one such server shared by the whole session (call ``.flushall()`` yourself)
``redis_cluster``         a local Redis Cluster of three masters from the same binary, for one test
``redis_cluster_session`` one such cluster shared by the whole session (use distinct keys per test)
``fault_proxy``           a factory: ``fault_proxy(redis_server)`` or ``fault_proxy(port)`` returns a
                          running :class:`ragguard.chaos.FaultProxy`; every proxy is closed after the test
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from .._clock import FakeClock
from ._redis_server import RedisClusterServers, RedisServer, RedisServerUnavailable, find_redis_server

if TYPE_CHECKING:
    from ._chaos import Chaos
    from ._proxy import FaultProxy


class _HasAddress(Protocol):
    host: str
    port: int


FaultProxyFactory = Callable[..., "FaultProxy"]


@pytest.fixture
def fake_clock() -> FakeClock:
    """A :class:`ragguard.FakeClock` starting at 0.0 seconds; advance it instead of sleeping."""
    return FakeClock()


def _redis_server() -> Iterator[RedisServer]:
    if find_redis_server() is None:
        pytest.skip("redis-server not found on PATH (install redis, or set RAGGUARD_REDIS_SERVER)")
    server = RedisServer()
    try:
        try:
            server.start()
        except RedisServerUnavailable as exc:
            pytest.skip(f"redis-server would not start: {exc}")
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A real ``redis-server`` on a free 127.0.0.1 port, killed after the test.

    Yields a :class:`ragguard.chaos.RedisServer`: ``.host``, ``.port``, ``.url``, ``.stop()``,
    ``.start()`` (restarts on the same port, empty). Skips the test with the reason when the
    binary is missing or will not start.
    """
    yield from _redis_server()


@pytest.fixture(scope="session")
def redis_server_session() -> Iterator[RedisServer]:
    """Like ``redis_server``, one process for the whole session (faster; not isolated)."""
    yield from _redis_server()


def _redis_cluster() -> Iterator[RedisClusterServers]:
    if find_redis_server() is None:
        pytest.skip("redis-server not found on PATH (install redis, or set RAGGUARD_REDIS_SERVER)")
    cluster = RedisClusterServers()
    try:
        try:
            cluster.start()
        except RedisServerUnavailable as exc:
            pytest.skip(f"a local Redis Cluster would not start: {exc}")
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def redis_cluster() -> Iterator[RedisClusterServers]:
    """A local Redis Cluster: three ``redis-server`` masters (cluster mode, no replicas) on free
    127.0.0.1 ports, slots spread evenly, all killed after the test.

    Yields a :class:`~ragguard.chaos._redis_server.RedisClusterServers`: ``.startup_nodes`` for
    ``redis.asyncio.RedisCluster``, ``.stop_node(i)`` / ``.start_node(i)`` to restart a master
    (empty), ``.node_of(slot)``. Skips the test when the binary is missing or the cluster will not
    form.
    """
    yield from _redis_cluster()


@pytest.fixture(scope="session")
def redis_cluster_session() -> Iterator[RedisClusterServers]:
    """Like ``redis_cluster``, one cluster for the whole session (faster; not isolated)."""
    yield from _redis_cluster()


@pytest.fixture
def fault_proxy() -> Iterator[FaultProxyFactory]:
    """A factory of running :class:`ragguard.chaos.FaultProxy` instances, all closed after the test.

    ``fault_proxy(upstream)`` where ``upstream`` is a port number or anything with ``.host`` and
    ``.port`` (a ``RedisServer``); keyword options go to ``FaultProxy``. Each proxy runs on its
    own loop thread, so it serves sync, asyncio and trio tests alike.
    """
    from ._proxy import FaultProxy

    proxies: list[FaultProxy] = []

    def make(upstream: int | _HasAddress, **options: Any) -> FaultProxy:
        if isinstance(upstream, int):
            proxy = FaultProxy(upstream, **options)
        else:
            proxy = FaultProxy(upstream.port, upstream.host, **options)
        proxies.append(proxy)
        return proxy.start_in_thread()

    try:
        yield make
    finally:
        for proxy in proxies:
            proxy.close()


@pytest.fixture
def chaos() -> Iterator[Chaos]:
    """A :class:`ragguard.chaos.Chaos` installed as the process's injector, seeded with 0.

    ``chaos.inject(fault, stage=..., tenant=...)`` adds a fault; every fault is removed and the
    injector uninstalled after the test.
    """
    import random

    from ._chaos import Chaos

    c = Chaos(rng=random.Random(0))
    c.install()
    try:
        yield c
    finally:
        c.close()
