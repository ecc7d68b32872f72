"""A circuit breaker whose state is shared by every replica through Redis.

:class:`SharedCircuitBreaker` wraps an in-memory :class:`ragguard.breakers.CircuitBreaker`: the
wrapped breaker gives the options (validated once, by it), the failure classification, the error
class and the event bus, and it is the local state the replica falls back to when Redis fails.
The shared state machine is the same one, run by the Lua scripts of ``_scripts`` inside Redis.

The happy path never waits on Redis::

    acquire()    closed: returns the shared epoch read from the local copy (no I/O)
    on_result()  appends one outcome byte to a local batch (no I/O)
    background   every flush_interval_s (or when a batch fills): one EVALSHA sends the batch and
                 returns the shared state, so the local copy is never older than staleness_s

Half-open trials are leases in a Redis ZSET (id -> expiry), so all replicas together run at most
``half_open_permits`` trials and a replica that dies mid-trial gives its permit back when the
lease expires. :meth:`acquire_async` takes a permit from Redis at once (one round trip, only in
half-open); the synchronous :meth:`acquire` cannot wait, so in half-open it uses a permit the
background task fetched after an earlier caller asked, and otherwise rejects like a half-open
breaker with every permit taken (``retry_after_s`` 0.0).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import math
import os
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, NoReturn

from .. import events
from .._clock import Clock, monotonic
from .._errors import BreakerOpen, ConfigError
from ..breakers import BreakerState, CircuitBreaker, register_breaker
from ._link import RedisLink, SharedStateUnavailable
from ._scripts import BREAKER_REPORT, BREAKER_SET_STATE, BREAKER_TRIAL_ACQUIRE, BREAKER_TRIAL_DONE

__all__ = ["SharedCircuitBreaker", "breaker_keys"]

log = logging.getLogger("ragguard.distributed")

_CLOSED = BreakerState.CLOSED
_OPEN = BreakerState.OPEN
_HALF_OPEN = BreakerState.HALF_OPEN
_FORCED_OPEN = BreakerState.FORCED_OPEN
_DISABLED = BreakerState.DISABLED

_FAILED = 1
_SLOW = 2
_OUTCOMES = ("success", "failure", "slow_success", "slow_failure")
_IGNORED = -1


class _Trial:
    """Token of a half-open trial call: its Redis lease and the epoch it was granted in."""

    __slots__ = ("epoch", "lease")

    def __init__(self, lease: str, epoch: int) -> None:
        self.lease = lease
        self.epoch = epoch


Token = int | _Trial | None
"""int >= 0: shared epoch (closed); int < 0: ``-1 - token`` of the wrapped breaker (local mode);
a trial lease while half-open; None while disabled (nothing recorded)."""


def breaker_keys(name: str, key_prefix: str = "ragguard") -> list[str]:
    """The Redis keys of breaker ``name``: ``{<prefix>:breaker:<name>}:state|window|trials``."""
    tag = f"{{{key_prefix}:breaker:{name}}}"
    return [f"{tag}:state", f"{tag}:window", f"{tag}:trials"]


def _seconds(option: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{option} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _options_of(breaker: CircuitBreaker) -> dict[str, Any]:
    # The wrapped breaker validated these at construction; read them once, in one place.
    b: Any = breaker
    try:
        return {
            "failure_rate_threshold": b._failure_threshold,
            "slow_call_rate_threshold": b._slow_threshold,
            "slow_call_duration_s": b._slow_s,
            "consecutive_failures_threshold": b._consecutive_threshold,
            "minimum_calls": b._min_calls,
            "window_type": b.window_type,
            "window_size": b.window_size,
            "half_open_permits": b._permits_total,
            "open_for_s": b._open_for_s,
            "open_backoff_multiplier": b._multiplier,
            "open_max_s": b._open_max_s,
            "open_jitter": b._jitter,
            "rng": b._rng,
            "classifier": b._classifier,
            "slow_classifier": b._slow_classifier,
            "error_class": b._error_class,
        }
    except AttributeError as exc:  # pragma: no cover - guards against a renamed option
        raise ConfigError(f"cannot read the options of {breaker!r}: {exc}") from exc


class SharedCircuitBreaker:
    """``breaker``'s state machine, shared by every replica through ``redis``.

    ``breaker``: the in-memory :class:`~ragguard.breakers.CircuitBreaker` (or a typed one) whose
    options, classifier and error class apply; also the replica's state while Redis is down.
    ``redis``: a ``redis.asyncio.Redis`` client (see ``docs/distributed.md`` for its settings).

    Options (keyword-only, seconds):
    ``key_prefix`` (default ``"ragguard"``): keys are ``{<prefix>:breaker:<name>}:...``.
    ``staleness_s`` (default 1.0): the local copy of the shared state is at most this old while
    Redis answers; must be >= ``flush_interval_s + redis_timeout_s``.
    ``flush_interval_s`` (default 0.1): how often outcomes are sent and the state read.
    ``batch_size`` (1..10,000, default 1024): a batch this full is sent at once.
    ``trial_lease_s`` (default 10): a half-open trial permit returns to the pool this long after it
    was granted if its result never arrives (the replica died); keep it above the call timeout.
    ``key_ttl_s`` (default 3600): the keys expire this long after the last write (plus the time
    left open), so an abandoned breaker leaves nothing behind.
    ``redis_timeout_s`` (default 0.25), ``probe_every_s`` (default 1.0): see :class:`RedisLink`.
    ``clock``: seconds on a clock every replica shares (default ``time.time``; tests pass a
    ``FakeClock``); open-until times and time windows are computed on it.
    ``link_clock``: monotonic seconds for the Redis link's own breaker.

    Raises :class:`ragguard.ConfigError` naming the option when a value is out of range.
    Use it as ``async with SharedCircuitBreaker(...) as b:`` or call :meth:`start` and
    :meth:`aclose`; it also starts itself on first use inside a running event loop.
    """

    def __init__(
        self,
        breaker: CircuitBreaker,
        redis: Any,
        *,
        key_prefix: str = "ragguard",
        staleness_s: float = 1.0,
        flush_interval_s: float = 0.1,
        batch_size: int = 1024,
        trial_lease_s: float = 10.0,
        key_ttl_s: float = 3600.0,
        redis_timeout_s: float = 0.25,
        probe_every_s: float = 1.0,
        clock: Clock = time.time,
        link_clock: Clock = monotonic,
    ) -> None:
        if not isinstance(breaker, CircuitBreaker):
            raise ConfigError(f"breaker must be a ragguard CircuitBreaker, got {type(breaker).__name__}")
        name = breaker.name
        if "{" in name or "}" in name:
            raise ConfigError(f"breaker name {name!r} must not contain braces (they delimit the hash tag)")
        if not isinstance(key_prefix, str) or not key_prefix or "{" in key_prefix or "}" in key_prefix:
            raise ConfigError(f"key_prefix must be a non-empty str without braces, got {key_prefix!r}")
        self._flush_interval_s = _seconds("flush_interval_s", flush_interval_s)
        self.staleness_s = _seconds("staleness_s", staleness_s)
        timeout_s = _seconds("redis_timeout_s", redis_timeout_s)
        if self._flush_interval_s + timeout_s > self.staleness_s:
            raise ConfigError(
                f"staleness_s ({staleness_s}) must be >= flush_interval_s + redis_timeout_s "
                f"({flush_interval_s} + {redis_timeout_s})"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 10_000:
            raise ConfigError(f"batch_size must be an int in [1, 10000], got {batch_size!r}")
        self._batch_size = batch_size
        self._trial_lease_s = _seconds("trial_lease_s", trial_lease_s)
        self._ttl_ms = math.ceil(_seconds("key_ttl_s", key_ttl_s) * 1000)
        if not callable(clock):
            raise ConfigError(f"clock must be a callable returning seconds, got {clock!r}")
        self.clock = clock
        self.wrapped = breaker
        self.name = name
        self.bus = breaker.bus
        opts = _options_of(breaker)
        self.classifier: Callable[[BaseException], bool] = opts["classifier"]
        self._slow_classifier: Callable[[BaseException], bool] | None = opts["slow_classifier"]
        self._slow_s: float = opts["slow_call_duration_s"]
        self._error_class: type[BreakerOpen] = opts["error_class"]
        self._rng: random.Random = opts["rng"]
        self._jitter: float = opts["open_jitter"]
        open_max = opts["open_max_s"]
        self._static_args = [
            opts["window_type"],
            opts["window_size"],
            opts["minimum_calls"],
            repr(float(opts["failure_rate_threshold"])),
            repr(float(opts["slow_call_rate_threshold"])),
            opts["consecutive_failures_threshold"] or 0,
            opts["half_open_permits"],
            repr(float(opts["open_for_s"])),
            repr(float(opts["open_backoff_multiplier"])),
            0 if math.isinf(open_max) else repr(float(open_max)),
        ]
        self.keys = breaker_keys(name, key_prefix)
        self._link = RedisLink(redis, f"breaker:{name}", timeout_s=timeout_s,
                               probe_every_s=probe_every_s, clock=link_clock)
        self._report = redis.register_script(BREAKER_REPORT)
        self._trial_acquire = redis.register_script(BREAKER_TRIAL_ACQUIRE)
        self._trial_done = redis.register_script(BREAKER_TRIAL_DONE)
        self._set_state = redis.register_script(BREAKER_SET_STATE)
        self._lease_ids = (f"{os.getpid()}-{id(self):x}-{n}" for n in itertools.count())

        # The local copy of the shared state, replaced wholesale by every script reply.
        self._local = True  # until the first reply, and whenever Redis is unreachable
        self._state = _CLOSED
        self._epoch = 0
        self._open_until = 0.0
        self._synced_at: float | None = None

        self._pending = bytearray()  # outcome codes of the current epoch, not yet sent
        self._trial_results: deque[tuple[str, int, int]] = deque()
        self._prefetched: deque[tuple[str, int, float]] = deque()  # (lease, epoch, fetched at)
        self._want_trial = False
        self._wake = asyncio.Event()
        self._sync_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        register_breaker(self)

    # -- reading ---------------------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        """The shared state as last read (the wrapped breaker's own state while Redis is down)."""
        return self.wrapped.state if self._local else self._state

    @property
    def shared(self) -> bool:
        """True while this replica uses the shared state; False on local fallback."""
        return not self._local

    @property
    def retry_after_s(self) -> float | None:
        """Seconds left open (>= 0) while open; None in any other state."""
        if self._local:
            return self.wrapped.retry_after_s
        if self._state is not _OPEN:
            return None
        return max(0.0, self._open_until - self.clock())

    def add_listener(self, listener: Any) -> Callable[[], None]:
        """Subscribe ``listener`` to this breaker's events (shared transitions, rejections,
        outcomes, and the wrapped breaker's own while on local state); returns an unsubscribe."""
        return self.wrapped.add_listener(listener)

    def __repr__(self) -> str:
        where = "local" if self._local else "shared"
        return f"<SharedCircuitBreaker {self.name!r} {self.state.value} ({where})>"

    # -- the low-level protocol used by @guard ---------------------------------------------

    def acquire(self) -> Token:
        """Ask to run one call; returns a token for :meth:`on_result` or :meth:`release`.

        Never waits. Raises the wrapped breaker's ``error_class`` (a :class:`ragguard.BreakerOpen`)
        when open or forced open, and while half-open unless a trial permit fetched in the
        background is waiting (the first half-open caller asks for one; see :meth:`acquire_async`).
        """
        if self._local:
            if self._task is None:
                self._autostart()
            return -1 - self.wrapped.acquire()
        if self._state is _CLOSED:
            return self._epoch
        return self._acquire_slow()

    async def acquire_async(self) -> Token:
        """Like :meth:`acquire`, but while half-open it takes a trial permit from Redis at once
        (one round trip, bounded by ``redis_timeout_s``; on failure the local breaker decides).

        Raises ``error_class`` when open, forced open, or half-open with every permit taken.
        """
        if self._local or self._state is _CLOSED or not self._needs_trial() or self._prefetched:
            return self.acquire()
        lease = next(self._lease_ids)
        try:
            reply = await self._link.call(functools.partial(self._run_trial_acquire, lease))
        except SharedStateUnavailable:
            if self._link.degraded:
                self._go_local()
            return self.acquire()
        if self._apply(reply):
            return _Trial(lease, self._epoch)
        if self._state is _HALF_OPEN:
            self._reject(_HALF_OPEN, 0.0)
        return self.acquire()

    def on_result(self, token: Token, duration_s: float, exc: BaseException | None,
                  now: float | None = None) -> None:
        """Record the end of a call admitted with ``token`` (as ``CircuitBreaker.on_result``).

        ``duration_s`` in seconds; ``exc`` the ``Exception`` raised or None. Never waits: the
        outcome joins the batch the background task sends.
        """
        if type(token) is int:
            if token != self._epoch:  # the epoch is >= 0: local tokens (< 0) never match
                if token < 0:
                    self.wrapped.on_result(-1 - token, duration_s, exc, now)
                return  # else it started before a shared transition: the old epoch is over
            if exc is None:
                code = _SLOW if duration_s > self._slow_s else 0
            else:
                code = self._code(duration_s, exc)
                if code < 0:
                    return
            pending = self._pending
            pending.append(code)
            if len(pending) >= self._batch_size:
                self._batch_full()
            if self.bus.active:
                self.bus.emit(events.CallOutcome(self.name, _OUTCOMES[code], duration_s,
                                                 None if exc is None else type(exc).__name__))
        elif isinstance(token, _Trial):
            if exc is None:
                code = _SLOW if duration_s > self._slow_s else 0
            else:
                code = self._code(duration_s, exc)
            self._trial_results.append((token.lease, token.epoch, code))
            self._wake.set()

    def release(self, token: Token) -> None:
        """Give back ``token`` without recording an outcome (cancelled, or never ran)."""
        if type(token) is int:
            if token < 0:
                self.wrapped.release(-1 - token)
        elif isinstance(token, _Trial):
            self._trial_results.append((token.lease, token.epoch, _IGNORED))
            self._wake.set()

    async def call(self, fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``await fn(*args, **kwargs)`` through the shared breaker (as ``CircuitBreaker.call``)."""
        token = await self.acquire_async()
        clock = monotonic
        start = clock()
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            self.on_result(token, clock() - start, exc)
            raise
        except BaseException:
            self.release(token)
            raise
        self.on_result(token, clock() - start, None)
        return result

    # -- operators (shared: every replica follows) -------------------------------------------

    async def force_open(self) -> None:
        """Hold the breaker open on every replica until :meth:`reset`."""
        await self._operate("forced_open", self.wrapped.force_open)

    async def disable(self) -> None:
        """Switch the breaker off on every replica until :meth:`reset`."""
        await self._operate("disabled", self.wrapped.disable)

    async def reset(self) -> None:
        """Close the breaker on every replica with an empty window."""
        await self._operate("closed", self.wrapped.reset)

    async def _operate(self, target: str, local: Callable[[], None]) -> None:
        local()
        try:
            reply = await self._link.call(functools.partial(self._script, self._set_state, target))
        except SharedStateUnavailable:
            log.warning("ragguard breaker %r: %s applied locally only (Redis unreachable)", self.name, target)
            return
        self._apply(reply)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> SharedCircuitBreaker:
        """Read the shared state (writing nothing) and start the background task; returns self.

        When Redis does not answer, the breaker starts on local state and keeps trying.
        """
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(), name=f"ragguard-breaker-{self.name}")
            await self.refresh()
        return self

    async def refresh(self) -> None:
        """Send the pending outcomes and trial results and read the shared state now."""
        async with self._sync_lock:  # one sync at a time: the background task's or a caller's
            await self._refresh()

    async def _refresh(self) -> None:
        link = self._link
        if link.degraded:
            self._go_local()
            return
        try:
            while self._trial_results:
                lease, epoch, code = self._trial_results[0]
                reply = await link.call(functools.partial(self._script, self._trial_done, lease, epoch, code))
                self._trial_results.popleft()
                self._apply(reply)
            codes, epoch = self._pending, self._epoch
            self._pending = bytearray()
            reply = await link.call(functools.partial(self._script, self._report, epoch, bytes(codes)))
            self._apply(reply)
            self._local = False
            await self._manage_trials()
        except SharedStateUnavailable:
            # One failed sync only ages the local copy; the link decides when Redis is gone
            # (failures_to_degrade in a row), and then every path switches to local state.
            if self._link.degraded:
                self._go_local()

    async def aclose(self) -> None:
        """Send what is pending (best effort), give back unused permits, stop the background task."""
        if self._closing:
            return
        self._closing = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        while self._prefetched:
            lease, epoch, _ = self._prefetched.popleft()
            self._trial_results.append((lease, epoch, _IGNORED))
        if not self._local:
            await self.refresh()
        await self._link.aclose()

    async def __aenter__(self) -> SharedCircuitBreaker:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    # -- internals ---------------------------------------------------------------------------

    def _autostart(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if not self._closing:
            self._task = loop.create_task(self._run(first=True), name=f"ragguard-breaker-{self.name}")

    async def _run(self, *, first: bool = False) -> None:
        if first:
            await self.refresh()
        wake = self._wake
        while not self._closing:
            try:
                async with asyncio.timeout(self._flush_interval_s):
                    await wake.wait()
            except TimeoutError:
                pass
            wake.clear()
            try:
                await self.refresh()
            except Exception:  # a bug here must not stop the replica from syncing later
                log.exception("ragguard breaker %r: sync failed", self.name)

    def _batch_full(self) -> None:
        pending = self._pending
        if len(pending) >= 64 * self._batch_size:
            del pending[: len(pending) // 2]  # Redis is slow: keep the newest outcomes, bounded
        self._wake.set()

    def _needs_trial(self) -> bool:
        state = self._state
        return state is _HALF_OPEN or (state is _OPEN and self.clock() >= self._open_until)

    def _acquire_slow(self) -> Token:
        state = self._state
        if state is _DISABLED:
            return None
        if state is _FORCED_OPEN:
            self._reject(state, None)
        if state is _OPEN:
            left = self._open_until - self.clock()
            if left > 0:
                self._reject(state, left)
        prefetched = self._prefetched
        if prefetched:
            lease, epoch, _ = prefetched.popleft()
            return _Trial(lease, epoch)
        self._want_trial = True
        self._wake.set()
        self._reject(_HALF_OPEN, 0.0)

    def _reject(self, state: BreakerState, retry_after_s: float | None) -> NoReturn:
        if self.bus.active:
            self.bus.emit(events.CallRejected(self.name, state.value, retry_after_s))
        if state is _OPEN:
            raise self._error_class(self.name, retry_after_s)
        raise self._error_class(self.name, retry_after_s, state=state.value)

    def _code(self, duration_s: float, exc: BaseException) -> int:
        if not isinstance(exc, Exception):
            return _IGNORED
        try:
            if not self.classifier(exc):
                return _IGNORED
            slow = duration_s > self._slow_s or (
                self._slow_classifier is not None and bool(self._slow_classifier(exc))
            )
        except Exception:
            log.exception("classifier of breaker %r raised on %r; the error is not counted", self.name, exc)
            return _IGNORED
        return _FAILED | _SLOW if slow else _FAILED

    def _args(self, *extra: Any) -> list[Any]:
        spread = self._jitter * (2.0 * self._rng.random() - 1.0) if self._jitter else 0.0
        return [repr(float(self.clock())), self._ttl_ms, *self._static_args, repr(spread), *extra]

    def _script(self, script: Any, *extra: Any) -> Awaitable[Any]:
        return script(keys=self.keys, args=self._args(*extra))  # type: ignore[no-any-return]

    def _run_trial_acquire(self, lease: str) -> Awaitable[Any]:
        return self._script(self._trial_acquire, lease, repr(self._trial_lease_s))

    async def _manage_trials(self) -> None:
        link = self._link
        if self._want_trial and not self._prefetched and self._needs_trial():
            self._want_trial = False
            lease = next(self._lease_ids)
            reply = await link.call(functools.partial(self._run_trial_acquire, lease))
            if self._apply(reply):
                self._prefetched.append((lease, self._epoch, self.clock()))
        now = self.clock()
        while self._prefetched and now - self._prefetched[0][2] > self.staleness_s:
            lease, epoch, _ = self._prefetched.popleft()  # nobody came for it: give it back
            reply = await link.call(functools.partial(self._script, self._trial_done, lease, epoch, _IGNORED))
            self._apply(reply)

    def _apply(self, reply: Any) -> bool:
        """Adopt a script's snapshot ``[extra, state, epoch, open_until, reason]``; returns extra != 0."""
        extra, state_s, epoch_s, until_s, reason = reply
        state = BreakerState(_text(state_s))
        epoch = int(epoch_s)
        if epoch != self._epoch:
            self._pending.clear()  # recorded in an epoch that is over
            self._prefetched.clear()  # their leases died with the epoch
        old = self.state
        self._state, self._epoch, self._open_until = state, epoch, float(until_s)
        self._synced_at = self.clock()
        if old is not state and not self._local and self.bus.active:
            self.bus.emit(events.BreakerTransition(self.name, old.value, state.value, self._synced_at,
                                                   f"shared: {_text(reason)}"))
        return int(extra) != 0

    def _go_local(self) -> None:
        if not self._local:
            self._local = True
            self._pending.clear()
            self._trial_results.clear()  # their leases expire in Redis
            self._prefetched.clear()
