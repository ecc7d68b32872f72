"""ragguard's own guarded use of Redis: a timeout per command, a cap on commands in flight, and a
count of failures in a row.

Every Redis command the shared breaker and the shared quotas send goes through a
:class:`RedisLink`. When ``failures_to_degrade`` commands in a row fail or outlast ``timeout_s``
(a breaker of its own, reduced to a counter: the link is the one caller), the component switches to
local state, logs one warning and emits :class:`SharedStateDegraded`. While degraded, no user call
touches Redis; every ``probe_every_s`` seconds the component's probe runs (one script, with a key
of the component's own, that checks the ACL user may run every command the component's scripts
run) and, once it answers, the component's ``restore`` step (the quotas put back the leases they
run), then the link emits :class:`SharedStateRestored` and the component goes back to Redis.

Configuration is not an outage. A refused password or user (``WRONGPASS``, ``NOAUTH``), a missing
ACL permission (``NOPERM``, or a command the probe finds denied), a read-only replica (``READONLY``)
and a TLS failure (an untrusted or mismatched certificate, a failed handshake) switch the
component to local state at once and log one ERROR naming the cause (never a secret: the client's
password is masked from every message);
the probe keeps checking, so a fixed ACL is picked up, and it never flaps: it passes only when
every command would. :meth:`RedisLink.check` (``start(strict=True)`` of the components) raises
:class:`~ragguard.ConfigError` for such a cause instead.

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
import re
import ssl
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    NoPermissionError,
    NoScriptError,
    ReadOnlyError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from .. import events
from .._clock import Clock, monotonic
from .._errors import ConfigError
from .._timeouts import call_with_timeout
from ._events import SharedStateDegraded, SharedStateRestored
from ._scripts import PROBE

__all__ = [
    "LinkBusy",
    "Misconfigured",
    "Probe",
    "RedisLink",
    "Script",
    "SharedStateUnavailable",
    "config_problem",
    "is_pool_exhausted",
    "mask_url",
]

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


class Misconfigured(SharedStateUnavailable):
    """Internal: Redis refused ragguard's configuration (credentials, permissions or TLS);
    ``problem`` says which, without any secret. The component runs on local state meanwhile."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen and len(seen) < 16:
        seen.add(id(node))
        yield node
        node = node.__cause__ or node.__context__


def config_problem(exc: BaseException, secrets: Iterable[str] = ()) -> str | None:
    """What ``exc`` says is wrong with the client's configuration, or None when it is not that.

    Credentials (redis-py's ``AuthenticationError``: ``WRONGPASS``, ``NOAUTH``...), permissions
    (``NOPERM``) and TLS (an untrusted or mismatched certificate, a failed handshake), found on
    ``exc`` or the errors it was raised from. ``secrets`` (the client's password) are masked."""
    problem: str | None = None
    for err in _chain(exc):
        if isinstance(err, (AuthenticationError, AuthenticationWrongNumberOfArgsError)):
            problem = f"authentication failed: Redis refused the username or password ({err})"
        elif isinstance(err, NoPermissionError):
            problem = f"permission denied: the ACL user may not run what ragguard needs (NOPERM {err})"
        elif isinstance(err, ReadOnlyError):
            problem = f"Redis is a read-only replica: point ragguard at the primary (READONLY {err})"
        elif isinstance(err, ssl.SSLCertVerificationError):
            problem = (f"TLS: the server's certificate is not trusted "
                       f"({err.verify_message or err.reason or err})")
        elif isinstance(err, ssl.SSLError):
            problem = f"TLS handshake failed ({err.reason or err})"
        if problem is not None:
            break
    if problem is None:
        text = str(exc)
        if "CERTIFICATE_VERIFY_FAILED" in text:
            problem = f"TLS: the server's certificate is not trusted ({text})"
        elif "WRONGPASS" in text or "NOAUTH" in text:
            problem = f"authentication failed: Redis refused the username or password ({text})"
        else:
            return None
    for secret in secrets:
        if secret:
            problem = problem.replace(secret, "***")
    return problem[:500]


_URL_PASSWORD = re.compile(r"(//[^/?#@:]*:)([^/?#]*)@")
_QUERY_SECRET = re.compile(r"([?&](?:password|pass|pwd)=)([^&#]*)", re.IGNORECASE)


def mask_url(url: str, text: str | None = None) -> str:
    """``url`` with its password masked (``redis://user:***@host:6379/0``; a ``password=`` of the
    query too), for printing and logging; works on malformed URLs as well. With ``text``: that
    text (an error message about the URL, say) with the URL's passwords masked instead."""
    if text is None:
        return _QUERY_SECRET.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", url))
    for match in (*_URL_PASSWORD.finditer(url), *_QUERY_SECRET.finditer(url)):
        if match.group(2):
            text = text.replace(match.group(2), "***")
    return text


def client_secrets(redis: Any) -> tuple[str, ...]:
    """The password the ``redis.asyncio`` client (or cluster client) authenticates with, if any."""
    found: list[str] = []
    for owner in (getattr(redis, "connection_pool", None), getattr(redis, "nodes_manager", None)):
        kwargs = getattr(owner, "connection_kwargs", None)
        if isinstance(kwargs, dict):
            password = kwargs.get("password")
            if isinstance(password, str) and password:
                found.append(password)
    return tuple(found)


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
    pool, not a refused configuration: nothing says Redis itself is slow."""
    return (isinstance(exc, (RedisConnectionError, ConnectionError))
            and not isinstance(exc, TimeoutError) and not is_pool_exhausted(exc)
            and config_problem(exc) is None)


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


# What each command the scripts run is checked with: '$k' is the component's probe key.
_PROBE_SHAPES = {
    "DEL": "$k", "EXISTS": "$k", "GET": "$k", "GETRANGE": "$k 0 0", "HDEL": "$k f", "HGETALL": "$k",
    "HINCRBY": "$k f 1", "HMGET": "$k f", "HSET": "$k f v", "INCRBYFLOAT": "$k 1", "PEXPIRE": "$k 1",
    "PTTL": "$k", "SET": "$k v", "SETRANGE": "$k 0 v", "TIME": "", "ZADD": "$k 0 m", "ZCARD": "$k",
    "ZCOUNT": "$k 0 1", "ZRANGEBYSCORE": "$k 0 1", "ZRANK": "$k m", "ZREM": "$k m",
    "ZREMRANGEBYSCORE": "$k 0 1", "ZSCORE": "$k m",
}


def script_commands(sources: Iterable[str]) -> list[str]:
    """The Redis commands the Lua ``sources`` call (``redis.call('NAME', ...)``), sorted."""
    return sorted({name for source in sources for name in re.findall(r"redis\.call\('([A-Z]+)'", source)})


class Probe:
    """A component's health probe: one script run with ``key`` (a key of the component's hash tag)
    that checks the ACL user may run every command the component's Lua ``sources`` run, on that key.

    Passing it proves what a PING cannot: the client authenticates, may load and run scripts, may
    touch the component's keys and run each command of its scripts (``redis.acl_check_cmd``, Redis
    >= 7). Raises :class:`Misconfigured` naming the denied commands; the Redis errors otherwise.
    """

    __slots__ = ("_args", "_script")

    def __init__(self, redis: Any, key: str, sources: Iterable[str]) -> None:
        commands = script_commands(sources)
        unknown = [c for c in commands if c not in _PROBE_SHAPES]
        if unknown:  # pragma: no cover - a script gained a command the probe cannot check yet
            raise ConfigError(f"no probe shape for {unknown}")
        self._script = Script(redis, PROBE, 1)
        self._args = [key.encode(), *(f"{c} {_PROBE_SHAPES[c]}".strip().encode() for c in commands)]

    async def __call__(self) -> None:
        denied = await self._script(*self._args)
        if denied:
            names = denied.decode() if isinstance(denied, bytes) else str(denied)
            raise Misconfigured(f"permission denied: the ACL user may not run {', '.join(names.split())} "
                                "(ragguard's scripts need them)")


class RedisLink:
    """One component's guarded access to a ``redis.asyncio.Redis`` (or ``RedisCluster``) client.

    ``component`` names it in logs and events. ``timeout_s`` (seconds, > 0) bounds each command;
    ``failures_to_degrade`` (int >= 1) failed commands in a row switch to local state;
    ``probe_every_s`` (seconds, > 0) spaces the PINGs that detect Redis coming back;
    ``max_in_flight`` (int 1..10,000; default: half the client's pool, at most 32) caps this
    link's commands in flight. ``clock`` (monotonic seconds) times the outage for the events.
    ``probe``: the component's health probe (an async function, e.g. a :class:`Probe`; default
    PING); ``restore``: an async step run once the probe passes, before the component goes back
    to Redis (what it needs Redis to know first: it may use :meth:`call_restoring`); a failure of
    either keeps it on local state. ``on_degraded`` / ``on_restored`` list callbacks (no arguments)
    run at each switch; ``on_reconnect`` callbacks run when a command found its connection broken
    (Redis restarted, or a proxy reset it) and is sent again on a fresh one.
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
        probe: Callable[[], Awaitable[Any]] | None = None,
        restore: Callable[[], Awaitable[Any]] | None = None,
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
        self.on_reconnect: list[Callable[[], None]] = []
        self._probe_fn: Callable[[], Awaitable[Any]] = probe if probe is not None else self._ping
        self._restore_fn = restore
        self._secrets = client_secrets(redis)
        self.problem: str | None = None
        """The configuration problem that keeps the component on local state, if that is why."""
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
        return await _cancellable(self._run(False, fn, args, kwargs))

    async def call_restoring(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """:meth:`call` for the ``restore`` step: runs while the link is still degraded."""
        return await _cancellable(self._run(True, fn, args, kwargs))

    async def start(self, *, strict: bool = False) -> None:
        """:meth:`check`, as a component's ``start()``: Redis unreachable or misconfigured leaves it
        on local state (the probe keeps trying); with ``strict``, a configuration problem raises
        :class:`~ragguard.ConfigError` naming the component and the cause instead."""
        try:
            await self.check()
        except Misconfigured as exc:
            if strict:
                raise ConfigError(f"{self.component}: {exc.problem}") from None
        except SharedStateUnavailable:
            pass

    async def check(self) -> None:
        """Run the probe now (whatever the state). Returns when it passes (a degraded link then
        comes back, after the ``restore`` step); raises :class:`Misconfigured` for a configuration
        problem and :class:`SharedStateUnavailable` when Redis does not answer (both leave the
        component on local state)."""
        await self._run(self.degraded, self._probe_fn, (), {})
        if self.degraded:
            if self._restore_fn is not None:
                await self._restore_fn()
            if self.degraded:
                self._restore()

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
                    self._notify(self.on_reconnect)
                    result = await call_with_timeout(fn(*args, **kwargs), self.timeout_s)
        except Misconfigured as exc:
            self._misconfigured(exc.problem)
            raise
        except SharedStateUnavailable:
            raise
        except Exception as exc:
            if is_pool_exhausted(exc):
                raise LinkBusy(f"{self.component}: {type(exc).__name__}: {self._masked(exc)}") from exc
            problem = config_problem(exc, self._secrets)
            if problem is not None:
                self._misconfigured(problem)
                raise Misconfigured(problem) from exc
            if not self.degraded:
                self._failures += 1
                if self._failures >= self._failures_to_degrade:
                    self._degrade(exc)
            raise SharedStateUnavailable(
                f"{self.component}: {type(exc).__name__}: {self._masked(exc)}") from exc
        if not self.degraded and self._failures:
            self._failures = 0
        return result

    async def _ping(self) -> Any:
        return await self.redis.ping()

    def _masked(self, exc: BaseException) -> str:
        text = str(exc)
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text[:500]

    def _misconfigured(self, problem: str) -> None:
        """A configuration problem: local state at once (retrying cannot help), one ERROR per cause."""
        if problem != self.problem:
            self.problem = problem
            log.error("ragguard %s: Redis refused ragguard's configuration: %s; using local state "
                      "until the probe passes (fix the credentials, ACL or TLS settings; "
                      "start(strict=True) raises instead)", self.component, problem)
        if not self.degraded:
            self._degrade(None, f"misconfigured: {problem}")

    def _degrade(self, exc: Exception | None, reason: str | None = None) -> None:
        self.degraded = True
        self._degraded_at = self._clock()
        if reason is None:
            reason = (type(exc).__name__ if isinstance(exc, TimeoutError)
                      else f"{type(exc).__name__}: {self._masked(exc) if exc is not None else ''}")
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
        self.problem = None
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
        while self.degraded and not self._closed:
            await asyncio.sleep(self.probe_every_s)
            if not self.degraded or self._closed:
                return
            try:
                # only the probe brings the link back: a straggler's answer proves little
                await self._run(True, self._probe_fn, (), {})
                if self._restore_fn is not None:
                    await self._restore_fn()
            except SharedStateUnavailable:
                continue
            except Exception:  # a bug of the component's restore step must not end the probing
                log.exception("ragguard %s: restore step failed", self.component)
                continue
            if self.degraded and not self._closed:
                self._restore()

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


async def _cancellable(command: Awaitable[T]) -> T:
    """Await ``command``; a cancellation of the task that redis-py took in and did not re-raise
    (the command then completes, or fails otherwise, as if nobody had cancelled it:
    redis/redis-py#2028, #2551; seen with redis-py 8.2 on a plain GET cancelled in flight) is
    raised once the command is over, so that a cancelled caller gives back what it holds."""
    task = asyncio.current_task()
    if task is None:  # pragma: no cover - awaited outside a task
        return await command
    before = task.cancelling()
    try:
        result = await command
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        if task.cancelling() > before:
            raise asyncio.CancelledError("cancelled during a Redis command") from exc
        raise
    if task.cancelling() > before:
        raise asyncio.CancelledError("cancelled during a Redis command")
    return result
