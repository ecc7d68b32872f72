"""Redis pool monitor: redis-py's asyncio pools, subclassed, counting what they do.

:class:`MonitoredConnectionPool` and :class:`MonitoredBlockingConnectionPool` are drop-in
subclasses of ``redis.asyncio.ConnectionPool`` / ``BlockingConnectionPool``. They override only
the public pool methods (``get_connection``, ``release``, ``make_connection``, ``reset``, and
plus ``ensure_connection``, which redis-py calls once it has reserved a connection for a caller)
and keep their own books; redis-py's private attributes are neither read nor patched.

"Free" connections, the headroom the exhaustion rule watches, are the pool's idle connections
plus those it may still open: ``max_connections - in_use``. A lazily filled pool with nothing
open yet is therefore not exhausted. ``idle`` counts only connections with an open socket.

A connection the pool hands out is checked first (redis-py #4252 and its neighbours): redis-py 8
skips its own check for a socket the server closed while maintenance notifications are on (the
default, "auto"), and its health-check PING is not retried, so an idle connection the server
killed (``timeout``, a restart, ``CLIENT KILL``) failed the caller's next command with
``ConnectionError``. The monitored pools reconnect such a connection once, before the command:
one with unread bytes or at end of file, or whose health check (``health_check_interval``) fails.
"""

from __future__ import annotations

import asyncio
import sys
import weakref
from bisect import bisect_left
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar

from redis.asyncio import BlockingConnectionPool, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import _validate as v
from .. import events
from .._clock import Clock, monotonic
from .._errors import ConfigError
from ._events import ConnectionLeak, PoolExhausted

__all__ = [
    "DEFAULT_WAIT_BUCKETS_S",
    "MonitoredBlockingConnectionPool",
    "MonitoredConnectionPool",
    "PoolStats",
    "monitored_pools",
]

DEFAULT_WAIT_BUCKETS_S: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
_SLOW_EVENT_GAP_S = 0.1  # at most ten slow-acquire events a second per pool
_MAX_STACK = 16
_POOLS: weakref.WeakSet[_PoolMonitor] = weakref.WeakSet()


def monitored_pools() -> list[MonitoredConnectionPool | MonitoredBlockingConnectionPool]:
    """The monitored pools alive in this process (the Prometheus exporter reads their gauges)."""
    kinds = (MonitoredConnectionPool, MonitoredBlockingConnectionPool)
    return [p for p in list(_POOLS) if isinstance(p, kinds)]


@dataclass(frozen=True, slots=True)
class PoolStats:
    """A snapshot of one monitored pool. Times in seconds.

    ``wait_buckets`` holds ``(upper bound, cumulative count)`` pairs of the acquire-wait
    histogram, the last bound being ``inf``.
    """

    pool: str
    in_use: int
    idle: int
    max_connections: int
    waiting: int
    acquires: int
    acquire_timeouts: int
    too_many_connections: int
    exhaustions: int
    leaks: int
    wait_sum_s: float
    wait_buckets: tuple[tuple[float, int], ...]


@dataclass(slots=True)
class _Acquire:
    """One caller's acquire in progress (carried from get_connection to ensure_connection)."""

    started: float
    reserved: bool = False


_ACQUIRE: ContextVar[_Acquire | None] = ContextVar("ragguard_pool_acquire", default=None)


@dataclass(slots=True)
class _Held:
    since: float
    stack: tuple[str, ...]
    reported: bool = False


class _PoolMonitor:
    """The bookkeeping shared by both monitored pools (a mixin placed before redis-py's class)."""

    _RG_OPTIONS: ClassVar[tuple[str, ...]] = (
        "pool_name",
        "wait_threshold_s",
        "leak_after_s",
        "track_leaks",
        "clock",
        "bus",
        "wait_buckets_s",
    )
    max_connections: int
    connection_kwargs: dict[str, Any]

    def _rg_init(
        self,
        *,
        pool_name: str | None,
        wait_threshold_s: float,
        leak_after_s: float | None,
        track_leaks: bool,
        clock: Clock,
        bus: events.EventBus | None,
        wait_buckets_s: tuple[float, ...],
    ) -> None:
        if pool_name is None:
            kw = self.connection_kwargs
            where = kw.get("path") or f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"
            pool_name = f"{where}/{kw.get('db', 0)}"
        if not isinstance(pool_name, str) or not pool_name:
            raise ConfigError(f"pool_name must be a non-empty str, got {pool_name!r}")
        v.seconds("wait_threshold_s", wait_threshold_s)
        if leak_after_s is not None:
            v.seconds("leak_after_s", leak_after_s)
        v.function("clock", clock, "returning seconds")
        buckets = tuple(float(b) for b in wait_buckets_s)
        if not buckets or any(b <= 0 for b in buckets) or list(buckets) != sorted(set(buckets)):
            raise ConfigError(f"wait_buckets_s must be increasing positive seconds, got {wait_buckets_s!r}")
        self.pool_name = pool_name
        self.wait_threshold_s = float(wait_threshold_s)
        self.leak_after_s = None if leak_after_s is None else float(leak_after_s)
        self.track_leaks = bool(track_leaks)
        self._rg_clock = clock
        self._rg_bus = events.bus if bus is None else bus
        self._rg_bounds = buckets
        self._rg_counts = [0] * (len(buckets) + 1)
        self._rg_wait_sum = 0.0
        self._rg_held: dict[Any, _Held] = {}
        self._rg_made: weakref.WeakSet[Any] = weakref.WeakSet()
        self._rg_waiting = 0
        self._rg_timeouts = 0
        self._rg_too_many = 0
        self._rg_exhaustions = 0
        self._rg_leaks = 0
        self._rg_low = False
        self._rg_last_slow = float("-inf")
        self._rg_next_leak_check = float("-inf")
        _POOLS.add(self)

    # -- redis-py's public pool methods ----------------------------------------------------------

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        clock = self._rg_clock
        acquire = _Acquire(clock())
        token = _ACQUIRE.set(acquire)
        self._rg_waiting += 1
        try:
            connection = await super().get_connection(*args, **kwargs)  # type: ignore[misc]
        except MaxConnectionsError:
            self._rg_too_many += 1
            self._rg_exhausted("too_many_connections", acquire.started, clock())
            raise
        except RedisConnectionError as exc:
            if not acquire.reserved and isinstance(exc.__cause__, TimeoutError | asyncio.TimeoutError):
                self._rg_timeouts += 1
                self._rg_exhausted("timeout", acquire.started, clock())
            raise
        finally:
            _ACQUIRE.reset(token)
            if not acquire.reserved:
                self._rg_waiting -= 1
        if self.leak_after_s is not None and clock() >= self._rg_next_leak_check:
            self.check_leaks()
        return connection

    async def ensure_connection(self, connection: Any) -> None:
        # redis-py calls this once the pool has reserved ``connection`` for the caller: the wait
        # is over and the connection is in use, even if connecting it still takes a while.
        acquire = _ACQUIRE.get(None)
        if acquire is not None and not acquire.reserved:
            acquire.reserved = True
            self._rg_waiting -= 1
            self._rg_reserved(connection, acquire.started)
        await super().ensure_connection(connection)  # type: ignore[misc]
        if not await _usable(connection):
            await connection.disconnect()
            await connection.connect()

    def _rg_reserved(self, connection: Any, started: float) -> None:
        now = self._rg_clock()
        wait = now - started
        self._rg_counts[bisect_left(self._rg_bounds, wait)] += 1
        self._rg_wait_sum += wait
        self._rg_held[connection] = _Held(now, _acquiring_stack() if self.track_leaks else ())
        if wait > self.wait_threshold_s and now - self._rg_last_slow >= _SLOW_EVENT_GAP_S:
            self._rg_last_slow = now
            self._rg_exhausted("slow_acquire", started, now)
        if not self._rg_low and self._rg_headroom() * 3 < self.max_connections:
            self._rg_low = True
            self._rg_exhausted("headroom", now, now)

    async def release(self, connection: Any) -> None:
        try:
            await super().release(connection)  # type: ignore[misc]
        finally:
            self._rg_held.pop(connection, None)
            # one event per episode: it ends when a third is free again and nobody waits
            if self._rg_low and not self._rg_waiting and self._rg_headroom() * 3 >= self.max_connections:
                self._rg_low = False

    def make_connection(self) -> Any:
        connection = super().make_connection()  # type: ignore[misc]
        self._rg_made.add(connection)
        return connection

    def reset(self) -> None:
        super().reset()  # type: ignore[misc]
        if hasattr(self, "_rg_held"):
            self._rg_held.clear()
            self._rg_made = weakref.WeakSet()
            self._rg_low = False

    # -- ours ------------------------------------------------------------------------------------

    @property
    def in_use(self) -> int:
        """Connections reserved for callers (connecting or handed out) and not yet released."""
        return len(self._rg_held)

    @property
    def idle(self) -> int:
        """Connections waiting in the pool with an open socket (a disconnected one is not idle)."""
        held = self._rg_held
        return sum(1 for c in list(self._rg_made) if c not in held and c.is_connected)

    @property
    def waiting(self) -> int:
        """Callers inside ``get_connection`` still waiting for the pool to reserve them a connection."""
        return self._rg_waiting

    def stats(self) -> PoolStats:
        """A consistent snapshot of the gauges, counters and the acquire-wait histogram."""
        cumulative, total = [], 0
        for bound, count in zip((*self._rg_bounds, float("inf")), self._rg_counts, strict=True):
            total += count
            cumulative.append((bound, total))
        return PoolStats(
            pool=self.pool_name,
            in_use=self.in_use,
            idle=self.idle,
            max_connections=self.max_connections,
            waiting=self._rg_waiting,
            acquires=total,
            acquire_timeouts=self._rg_timeouts,
            too_many_connections=self._rg_too_many,
            exhaustions=self._rg_exhaustions,
            leaks=self._rg_leaks,
            wait_sum_s=self._rg_wait_sum,
            wait_buckets=tuple(cumulative),
        )

    def check_leaks(self) -> list[ConnectionLeak]:
        """Report connections held longer than ``leak_after_s`` (each once); returns the new ones.

        Runs by itself on acquires; call it periodically when the pool can go quiet.
        Does nothing when ``leak_after_s`` is None.
        """
        limit = self.leak_after_s
        if limit is None:
            return []
        now = self._rg_clock()
        self._rg_next_leak_check = now + limit / 2
        found = []
        for held in list(self._rg_held.values()):
            if not held.reported and now - held.since > limit:
                held.reported = True
                found.append(ConnectionLeak(self.pool_name, now - held.since, held.since, now, held.stack))
        self._rg_leaks += len(found)
        if found and self._rg_bus.active:
            for leak in found:
                self._rg_bus.emit(leak)
        return found

    def _rg_headroom(self) -> int:
        return self.max_connections - len(self._rg_held)

    def _rg_exhausted(self, reason: str, started: float, now: float) -> None:
        self._rg_exhaustions += 1
        if self._rg_bus.active:
            self._rg_bus.emit(
                PoolExhausted(
                    pool=self.pool_name,
                    reason=reason,
                    in_use=self.in_use,
                    idle=self.idle,
                    max_connections=self.max_connections,
                    waiting=self._rg_waiting,
                    wait_s=now - started,
                    started_at=started,
                    at=now,
                )
            )


class MonitoredConnectionPool(_PoolMonitor, ConnectionPool):
    """``redis.asyncio.ConnectionPool`` that reports its gauges, waits, exhaustion and leaks.

    Takes every redis-py pool argument, plus keyword-only:

    ``pool_name`` the ``pool`` label (default ``"host:port/db"``);
    ``wait_threshold_s`` an acquire slower than this (seconds, default 0.1) is a
    :class:`PoolExhausted` event of reason ``slow_acquire``;
    ``leak_after_s`` a connection held longer is a :class:`ConnectionLeak` (None: off);
    ``track_leaks`` capture the acquiring stack of every connection (costs a few microseconds
    per acquire; off by default); ``clock`` monotonic seconds; ``bus`` where events go
    (default :data:`ragguard.events.bus`); ``wait_buckets_s`` histogram upper bounds.

    Raises :class:`ragguard.ConfigError` for an option out of range.
    """

    def __init__(
        self,
        *args: Any,
        pool_name: str | None = None,
        wait_threshold_s: float = 0.1,
        leak_after_s: float | None = None,
        track_leaks: bool = False,
        clock: Clock = monotonic,
        bus: events.EventBus | None = None,
        wait_buckets_s: tuple[float, ...] = DEFAULT_WAIT_BUCKETS_S,
        **kwargs: Any,
    ) -> None:
        ConnectionPool.__init__(self, *args, **kwargs)
        self._rg_init(
            pool_name=pool_name,
            wait_threshold_s=wait_threshold_s,
            leak_after_s=leak_after_s,
            track_leaks=track_leaks,
            clock=clock,
            bus=bus,
            wait_buckets_s=wait_buckets_s,
        )


class MonitoredBlockingConnectionPool(_PoolMonitor, BlockingConnectionPool):
    """``redis.asyncio.BlockingConnectionPool`` with the monitoring of :class:`MonitoredConnectionPool`.

    Takes every redis-py argument (``max_connections``, ``timeout``, ...) plus the same
    keyword-only monitoring options. An acquire that times out counts in ``acquire_timeouts``
    and is a :class:`PoolExhausted` event of reason ``timeout``.
    """

    def __init__(
        self,
        *args: Any,
        pool_name: str | None = None,
        wait_threshold_s: float = 0.1,
        leak_after_s: float | None = None,
        track_leaks: bool = False,
        clock: Clock = monotonic,
        bus: events.EventBus | None = None,
        wait_buckets_s: tuple[float, ...] = DEFAULT_WAIT_BUCKETS_S,
        **kwargs: Any,
    ) -> None:
        BlockingConnectionPool.__init__(self, *args, **kwargs)
        self._rg_init(
            pool_name=pool_name,
            wait_threshold_s=wait_threshold_s,
            leak_after_s=leak_after_s,
            track_leaks=track_leaks,
            clock=clock,
            bus=bus,
            wait_buckets_s=wait_buckets_s,
        )


async def _usable(connection: Any) -> bool:
    """False when ``connection`` must not carry a command: unread bytes or end of file on its
    socket, or a failed health-check PING when its ``health_check_interval`` has passed."""
    try:
        if await connection.can_read():
            return False
        interval = connection.health_check_interval
        if interval and asyncio.get_running_loop().time() > connection.next_health_check:
            await connection.check_health()
    except (RedisConnectionError, RedisTimeoutError, OSError):
        return False
    return True


def _acquiring_stack() -> tuple[str, ...]:
    """The caller's stack, innermost first, without redis-py's and this module's frames."""
    frame = sys._getframe(2)
    out: list[str] = []
    while frame is not None and len(out) < _MAX_STACK:
        filename = frame.f_code.co_filename
        if f"{_SEP}redis{_SEP}" not in filename and filename != __file__:
            out.append(f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back  # type: ignore[assignment]
    return tuple(out)


_SEP = "/" if sys.platform != "win32" else "\\"

