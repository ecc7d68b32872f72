"""ragguard's own guarded use of Redis: a timeout per command, a cap on commands in flight, and a
count of failures in a row.

Every Redis command the shared breaker and the shared quotas send goes through a
:class:`RedisLink`. When ``failures_to_degrade`` commands in a row fail or outlast ``timeout_s``
(a breaker of its own, reduced to a counter: the link is the one caller), the component switches to
local state, logs one warning and emits :class:`SharedStateDegraded`. While degraded, no user call
touches Redis; a probe task sends a ``PING`` every ``probe_every_s`` seconds and, on the first
answer, the link emits :class:`SharedStateRestored` and the component goes back to Redis.

Backpressure is not an outage. The link keeps at most ``max_in_flight`` commands in flight (waiting
for a turn is not timed by ``timeout_s``), so ragguard never empties the client's connection pool
itself; and when the pool is empty anyway (the application shares it), redis-py's "Too many
connections" / "No connection available" is raised as :class:`LinkBusy`: the command was never
sent, and the link's breaker does not count it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

from .. import events
from .._clock import Clock, monotonic
from .._errors import ConfigError
from .._timeouts import call_with_timeout
from ._events import SharedStateDegraded, SharedStateRestored

__all__ = ["LinkBusy", "RedisLink", "Script", "SharedStateUnavailable", "is_pool_exhausted"]

log = logging.getLogger("ragguard.distributed")

T = TypeVar("T")

_DEFAULT_MAX_IN_FLIGHT = 32


class SharedStateUnavailable(Exception):
    """Internal: Redis could not serve ragguard's bookkeeping; the caller falls back to local state.

    Never reaches a user: every component catches it. The command may or may not have run.
    """


class LinkBusy(SharedStateUnavailable):
    """Internal: the client's connection pool had no free connection, so the command was not sent.

    Backpressure from this process, not a sign that Redis is down: never counted by the link.
    """


def is_pool_exhausted(exc: BaseException) -> bool:
    """True for redis-py's errors of an empty connection pool (``MaxConnectionsError`` "Too many
    connections" from ``ConnectionPool``, "No connection available." from ``BlockingConnectionPool``):
    raised before anything was sent."""
    if type(exc).__name__ == "MaxConnectionsError":
        return True
    text = str(exc)
    return "Too many connections" in text or "No connection available" in text


def _is_broken_connection(exc: BaseException) -> bool:
    """A socket that failed (redis-py's ConnectionError or the OS's), not a timeout, not an empty
    pool: nothing says Redis itself is slow."""
    return (isinstance(exc, (RedisConnectionError, ConnectionError))
            and not isinstance(exc, TimeoutError) and not is_pool_exhausted(exc))


def _positive(option: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ConfigError(f"{option} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _default_max_in_flight(redis: Any) -> int:
    # Half the pool, so the application keeps connections of its own; a cluster client has one pool
    # per node, each as large as max_connections.
    pool = getattr(redis, "connection_pool", None)
    size = getattr(pool, "max_connections", None) or getattr(redis, "max_connections", None)
    if isinstance(size, int) and size > 0:
        return max(1, min(_DEFAULT_MAX_IN_FLIGHT, size // 2))
    return _DEFAULT_MAX_IN_FLIGHT


class Script:
    """One script bound to a ``redis.asyncio`` client (or cluster client): ``await script(*keys,
    *args)`` sends EVALSHA, and loads the script again when the server answers NOSCRIPT (a
    restarted or flushed Redis, a new cluster node). ``numkeys``: how many of the arguments are keys.

    redis-py's ``register_script`` object does the same, with a few microseconds more per call
    (it copies the keys and arguments and runs an import statement): on the quotas' one round trip
    per request, that is worth the dozen lines.
    """

    __slots__ = ("_redis", "numkeys", "sha", "source")

    def __init__(self, redis: Any, source: str, numkeys: int) -> None:
        self._redis = redis
        self.source = source
        self.numkeys = numkeys
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(self, *keys_and_args: Any) -> Any:
        try:
            return await self._redis.evalsha(self.sha, self.numkeys, *keys_and_args)
        except NoScriptError:
            self.sha = await self._redis.script_load(self.source)
            return await self._redis.evalsha(self.sha, self.numkeys, *keys_and_args)


class RedisLink:
    """One component's guarded access to a ``redis.asyncio.Redis`` (or ``RedisCluster``) client.

    ``component`` names it in logs and events. ``timeout_s`` (seconds, > 0) bounds each command;
    ``failures_to_degrade`` (int >= 1) failed commands in a row switch to local state;
    ``probe_every_s`` (seconds, > 0) spaces the PINGs that detect Redis coming back;
    ``max_in_flight`` (int 1..10,000; default: half the client's pool, at most 32) caps this
    link's commands in flight. ``clock`` (monotonic seconds) times the outage for the events.
    ``on_degraded`` / ``on_restored`` list callbacks (no arguments) run at each switch.
    Raises ConfigError for an out-of-range option.
    """

    def __init__(
        self,
        redis: Any,
        component: str,
        *,
        timeout_s: float = 0.25,
        failures_to_degrade: int = 2,
        probe_every_s: float = 1.0,
        max_in_flight: int | None = None,
        clock: Clock = monotonic,
    ) -> None:
        if redis is None or not callable(getattr(redis, "register_script", None)):
            raise ConfigError(f"redis must be a redis.asyncio.Redis client, got {type(redis).__name__}")
        if isinstance(failures_to_degrade, bool) or not isinstance(failures_to_degrade, int) or not (
            1 <= failures_to_degrade <= 1000
        ):
            raise ConfigError(f"failures_to_degrade must be an int in [1, 1000], got {failures_to_degrade!r}")
        if max_in_flight is None:
            max_in_flight = _default_max_in_flight(redis)
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or not (
            1 <= max_in_flight <= 10_000
        ):
            raise ConfigError(f"max_in_flight must be an int in [1, 10000], got {max_in_flight!r}")
        self.redis = redis
        self.component = component
        self.timeout_s = _positive("redis_timeout_s", timeout_s)
        self.probe_every_s = _positive("probe_every_s", probe_every_s)
        self.max_in_flight = max_in_flight
        self._failures_to_degrade = failures_to_degrade
        self._failures = 0  # failed commands in a row
        self._turns = asyncio.Semaphore(max_in_flight)
        self._clock = clock
        self.degraded = False
        """True while the component runs on local state (read it freely: a plain attribute)."""
        self.on_degraded: list[Callable[[], None]] = []
        self.on_restored: list[Callable[[], None]] = []
        self._degraded_at = 0.0
        self._probe: asyncio.Task[None] | None = None
        self._closed = False

    async def call(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """Run ``await fn(*args, **kwargs)`` (one Redis command or script) within ``timeout_s``.

        Raises :class:`LinkBusy` when the client's pool had no connection (nothing was sent), and
        :class:`SharedStateUnavailable` (with the cause chained) when the link is degraded, the
        command fails, or it outlasts the timeout (then it may have run). Cancellation passes
        through uncounted.
        """
        if self.degraded:
            raise SharedStateUnavailable(f"{self.component}: Redis unreachable")
        return await self._run(False, fn, args, kwargs)

    async def _run(self, probe: bool, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> T:
        try:
            async with self._turns:  # a turn of ours: waiting for it is not Redis's time
                if self.degraded and not probe:
                    raise SharedStateUnavailable(f"{self.component}: Redis unreachable")
                try:
                    result = await call_with_timeout(fn(*args, **kwargs), self.timeout_s)
                except Exception as exc:
                    if not _is_broken_connection(exc):
                        raise
                    # A connection broken since its last use (Redis restarted, a proxy reset it)
                    # fails at once: one more try on a fresh connection. Every script is
                    # idempotent or carries its own id, so running one twice changes nothing.
                    result = await call_with_timeout(fn(*args, **kwargs), self.timeout_s)
        except SharedStateUnavailable:
            raise
        except Exception as exc:
            if is_pool_exhausted(exc):
                raise LinkBusy(f"{self.component}: {type(exc).__name__}: {exc}") from exc
            if not self.degraded:
                self._failures += 1
                if self._failures >= self._failures_to_degrade:
                    self._degrade(exc)
            raise SharedStateUnavailable(f"{self.component}: {type(exc).__name__}: {exc}") from exc
        if self.degraded:
            if probe:  # only the probe brings the link back: a straggler's answer proves little
                self._restore()
        elif self._failures:
            self._failures = 0
        return result

    def _degrade(self, exc: Exception) -> None:
        self.degraded = True
        self._degraded_at = self._clock()
        reason = type(exc).__name__ if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        log.warning("ragguard %s: Redis unreachable (%s); using local state until it answers again",
                    self.component, reason)
        if events.bus.active:
            events.bus.emit(SharedStateDegraded(self.component, reason))
        self._notify(self.on_degraded)
        if not self._closed and (self._probe is None or self._probe.done()):
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_back())

    def _restore(self) -> None:
        self.degraded = False
        self._failures = 0
        down_s = max(0.0, self._clock() - self._degraded_at)
        log.info("ragguard %s: Redis answers again after %.1fs; back on shared state", self.component, down_s)
        if events.bus.active:
            events.bus.emit(SharedStateRestored(self.component, down_s))
        self._notify(self.on_restored)

    def _notify(self, callbacks: list[Callable[[], None]]) -> None:
        for callback in callbacks:
            try:
                callback()
            except Exception:  # one component's bug must not stop the switch of the others
                log.exception("ragguard %s: switch callback %r failed", self.component, callback)

    async def _probe_until_back(self) -> None:
        ping = self.redis.ping
        while self.degraded and not self._closed:
            await asyncio.sleep(self.probe_every_s)
            try:
                await self._run(True, ping, (), {})
            except SharedStateUnavailable:
                continue

    async def aclose(self) -> None:
        """Stop the probe task (the Redis client belongs to the caller and stays open)."""
        self._closed = True
        probe, self._probe = self._probe, None
        if probe is not None and not probe.done():
            probe.cancel()
            try:
                await probe
            except asyncio.CancelledError:
                pass
