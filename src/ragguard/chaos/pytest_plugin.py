"""ragguard's pytest plugin (registered through the ``pytest11`` entry point).

Fixtures, available in any suite once ragguard is installed:

``fake_clock``            a :class:`ragguard.FakeClock` at 0.0 s
``guard``                 a fresh :class:`ragguard.Guard` on ``fake_clock``, installed as the default
                          registry for the test (``@guard``, ``ragguard.tenant``, ``ragguard.deadline``
                          use it), the previous one restored after; its policy comes from
                          ``@pytest.mark.ragguard_policy(policy)`` (a Policy, a mapping or a file path)
``guard_events``          a :class:`ragguard.testing.EventRecorder` of ragguard's events during the test
``chaos``                 a :class:`ragguard.chaos.Chaos` installed as the injector, removed after the test
``redis_server``          a real ``redis-server`` on a free 127.0.0.1 port for one test (skips without one)
``redis_server_session``  one such server shared by the whole session (call ``.flushall()`` yourself)
``redis_cluster``         a local Redis Cluster of three masters from the same binary, for one test
``redis_cluster_session`` one such cluster shared by the whole session (use distinct keys per test)
``fault_proxy``           a factory: ``fault_proxy(redis_server)`` or ``fault_proxy(port)`` returns a
                          running :class:`ragguard.chaos.FaultProxy`; every proxy is closed after the test

The fake clock drives only what is built on it: with the ``guard`` fixture it is wired for you, so
``fake_clock.advance(s)`` moves that Guard's breakers, quotas, deadlines, retry backoff and attempt
timeouts; and when every task waits while one sleeps on it (a retry's backoff, a rate wait, a fake
dependency's ``await fake_clock.sleep(s)``) it jumps to the next sleeper or timer due by itself (a
discrete-event clock: see :class:`ragguard.FakeClock`). Without ``guard``, pass it yourself:
``Guard(clock=fake_clock)`` or ``ragguard.configure(policy, clock=fake_clock)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from .._clock import FakeClock
from ._redis_server import RedisClusterServers, RedisServer, RedisServerUnavailable, find_redis_server

if TYPE_CHECKING:
    from ..testing import EventRecorder, FreshGuard
    from ._chaos import Chaos
    from ._proxy import FaultProxy

__all__: list[str] = []  # fixtures and hooks, found by pytest through the entry point: nothing to import


class _HasAddress(Protocol):
    host: str
    port: int


FaultProxyFactory = Callable[..., "FaultProxy"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "ragguard_policy(policy): the policy of the `guard` fixture (Policy, mapping or path)"
    )


@pytest.fixture
def fake_clock() -> FakeClock:
    """A :class:`ragguard.FakeClock` starting at 0.0 seconds (discrete-event: sleepers on it wake
    in time order by themselves); advance it instead of sleeping.

    It drives the ``guard`` fixture's Guard; elsewhere pass it as ``clock=`` to what you build."""
    return FakeClock()


@pytest.fixture
def guard(request: pytest.FixtureRequest, fake_clock: FakeClock) -> Iterator[FreshGuard]:
    """A fresh :class:`ragguard.Guard` on the ``fake_clock`` fixture, installed as the default
    registry for this test and removed after it (see :func:`ragguard.testing.fresh_guard`).

    Its policy is the one given by ``@pytest.mark.ragguard_policy(policy)`` (default ``Policy()``).
    """
    from ..testing import fresh_guard

    marker = request.node.get_closest_marker("ragguard_policy")
    policy = marker.args[0] if marker is not None and marker.args else None
    with fresh_guard(policy, clock=fake_clock) as g:
        yield g


@pytest.fixture
def guard_events() -> Iterator[EventRecorder]:
    """Every event on ``ragguard.events.bus`` during the test (``await guard_events.settle()``
    before reading; ``guard_events.of(FallbackServed)`` filters by type)."""
    from ..testing import EventRecorder

    with EventRecorder() as recorder:
        yield recorder


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
