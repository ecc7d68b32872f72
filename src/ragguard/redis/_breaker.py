"""A circuit breaker whose state is shared by every replica through Redis.

:class:`SharedCircuitBreaker` wraps an in-memory :class:`ragguard.breakers.CircuitBreaker`: the
wrapped breaker gives the options (validated once, by it), the failure classification, the error
class and the event bus, and it decides while the replica runs on local state. The shared state
machine is the same one, run by the Lua scripts of ``_scripts`` inside Redis.

The closed path never waits on Redis::

    acquire()    closed: returns the shared epoch read from the local copy (no I/O)
    on_result()  appends one outcome byte to a local batch (no I/O)
    background   every flush_interval_s (or when a batch fills): one EVALSHA sends the batch and
                 returns the shared state, so the local copy is never older than staleness_s

Half-open trials are leases in a Redis ZSET (id -> expiry), so all replicas together run at most
``half_open_permits`` trials, and a replica that dies mid-trial gives its permit back when the lease
expires. A crowd at half-open costs one round trip per replica: :meth:`acquire_async` callers join
one request for permits (one in flight per breaker per replica; the next one gathers those who
came meanwhile), and the permits granted go to them in arrival order. A caller cancelled while it
waits, a reply lost to a timeout, or a permit nobody took is given back at the next sync.

When Redis stops answering (see :class:`RedisLink`) the replica switches to local state starting
from the last shared state it read: closed hands over to the wrapped breaker; open stays open for
the time that was left, then admits ``half_open_permits`` local trials (see ``_hold``); forced open
and disabled stay so. Outcomes not yet acknowledged are kept (at most ``64 x batch_size``) and sent
when Redis answers again; each batch carries a sequence number, so one resent after a lost reply
is counted once.
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
from collections import deque
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, NoReturn

from .. import events
from .._clock import Clock, monotonic
from .._errors import BreakerOpen, ConfigError
from ..breakers import BreakerState, CircuitBreaker, classify_outcome
from ..breakers._live import register_breaker
from ._hold import HoldTrial, LocalHold
from ._link import LinkBusy, Probe, RedisLink, Script, SharedStateUnavailable
from ._scripts import (
    BREAKER_REPORT,
    BREAKER_SET_STATE,
    BREAKER_TRIAL_ACQUIRE,
    BREAKER_TRIAL_DONE,
    breaker_option_args,
)

__all__ = ["SharedCircuitBreaker", "breaker_keys", "encode_key_part"]

log = logging.getLogger("ragguard.distributed")

_CLOSED = BreakerState.CLOSED
_OPEN = BreakerState.OPEN
_HALF_OPEN = BreakerState.HALF_OPEN
_FORCED_OPEN = BreakerState.FORCED_OPEN
_DISABLED = BreakerState.DISABLED

_FAILED = 1
_SLOW = 2
_OUTCOMES = ("success", "failure", "slow_success", "slow_failure", "rejection")
_IGNORED = -1

_UNSYNCED, _SHARED, _LOCAL = 0, 1, 2
_NO_EPOCH = -(2**63)  # matches no token: shared epochs are >= 0, local ones < 0 but far above this
_ROUND_TRIP = object()
_MAX_PENDING_BATCHES = 64
_SILENT = events.EventBus()


class _Trial:
    """Token of a shared half-open trial: its Redis lease, the epoch it was granted in, when (local
    clock), and the local hold's round that counts it if Redis goes away meanwhile."""

    __slots__ = ("epoch", "granted_at", "hold_round", "lease")

    def __init__(self, lease: str, epoch: int, granted_at: float) -> None:
        self.lease = lease
        self.epoch = epoch
        self.granted_at = granted_at
        self.hold_round: int | None = None


class _Early:
    """Token of a call admitted before the shared state was first read (the wrapped breaker's
    ``token``): whenever it ends, its outcome counts in the shared window too."""

    __slots__ = ("token",)

    def __init__(self, token: int) -> None:
        self.token = token


class _TrialBatch:
    """Callers waiting for one request of trial permits (``prefetch``: a synchronous caller asked
    for one to be fetched for the next)."""

    __slots__ = ("prefetch", "sent", "waiters")

    def __init__(self) -> None:
        self.waiters: list[asyncio.Future[_Trial | None]] = []
        self.prefetch = False
        self.sent = False


Token = int | _Trial | HoldTrial | _Early | None
"""int >= 0: shared epoch (closed); int < 0: ``-1 - token`` of the wrapped breaker (local mode);
a trial lease while half-open (a HoldTrial on local state); an _Early before the first read; None
while disabled (nothing recorded)."""


def encode_key_part(text: str) -> str:
    """``text`` with ``%``, ``{`` and ``}`` percent-encoded: any name fits inside a hash tag, and
    two names never share a key."""
    return text.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def breaker_keys(name: str, key_prefix: str = "ragguard") -> list[str]:
    """The Redis keys of breaker ``name``: ``{<prefix>:breaker:<name>}:state|window|trials``, the
    name percent-encoded (:func:`encode_key_part`) so that any name keeps one valid hash tag."""
    tag = f"{{{key_prefix}:breaker:{encode_key_part(name)}}}"
    return [f"{tag}:state", f"{tag}:window", f"{tag}:trials"]


def _seconds(option: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{option} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class SharedCircuitBreaker:
    """``breaker``'s state machine, shared by every replica through ``redis``.

    ``breaker``: the in-memory :class:`~ragguard.breakers.CircuitBreaker` (or a typed one) whose
    options, classifier and error class apply; it decides while Redis is unreachable.
    ``redis``: a ``redis.asyncio.Redis`` or ``RedisCluster`` client (see ``docs/distributed.md``).
    Any breaker name works: it is percent-encoded into the keys.

    Options (keyword-only, seconds):
    ``key_prefix`` (default ``"ragguard"``, no braces): keys are ``{<prefix>:breaker:<name>}:...``.
    ``staleness_s`` (default 1.0): the local copy of the shared state is at most this old while
    Redis answers; must be >= ``flush_interval_s + redis_timeout_s``.
    ``flush_interval_s`` (default 0.1): how often outcomes are sent and the state read.
    ``batch_size`` (1..10,000, default 1024): a batch this full is sent at once.
    ``trial_lease_s`` (default 10): a half-open trial permit returns to the pool this long after it
    was granted if its result never arrives (the replica died); keep it above the call timeout.
    ``key_ttl_s`` (default 3600): the keys expire this long after the last write (plus the time
    left open), so an abandoned breaker leaves nothing behind.
    ``redis_timeout_s`` (default 0.25), ``probe_every_s`` (default 1.0): see :class:`RedisLink`.
    ``clock``: None (default) computes every shared time on the Redis server's clock (``TIME``),
    so no replica's wall clock matters; tests pass a ``FakeClock`` (seconds) shared by replicas.
    ``local_clock`` (monotonic seconds; default ``clock`` when given, else ``time.monotonic``):
    the replica's countdowns (time left open, staleness). ``link_clock``: monotonic seconds that
    time an outage for :class:`SharedStateRestored`.

    Raises :class:`ragguard.ConfigError` naming the option when a value is out of range.
    Use it as ``async with SharedCircuitBreaker(...) as b:`` or call :meth:`start` and
    :meth:`aclose`; it also starts itself on first use inside a running event loop.
    """

    # Slots, as the in-memory breaker has: with its fifty attributes, an instance dict would no longer
    # share its keys (CPython shares up to 30), and every attribute read on the closed path would
    # cost a dict lookup.
    __slots__ = (
        "__weakref__",
        "_base",
        "_batch",
        "_batch_size",
        "_birth",
        "_birth_arg",
        "_closing",
        "_config",
        "_epoch",
        "_error_class",
        "_flush_interval_s",
        "_hold",
        "_jitter",
        "_lease_ids",
        "_link",
        "_mode",
        "_no_permit_until",
        "_now",
        "_oks",
        "_oks_room",
        "_option_args",
        "_pending",
        "_permits",
        "_prefetched",
        "_report",
        "_report_keys",
        "_rng",
        "_script_keys",
        "_seq",
        "_seq_key",
        "_set_state",
        "_side_tasks",
        "_slow_classifier",
        "_slow_s",
        "_state",
        "_sync_lock",
        "_task",
        "_trial_acquire",
        "_trial_done",
        "_trial_lease_s",
        "_trial_lock",
        "_trial_outbox",
        "_trials",
        "_ttl_arg",
        "_ttl_ms",
        "_unacked",
        "_until",
        "_wake",
        "bus",
        "classifier",
        "clock",
        "keys",
        "name",
        "replica_id",
        "staleness_s",
        "wrapped",
    )

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
        clock: Clock | None = None,
        local_clock: Clock | None = None,
        link_clock: Clock = monotonic,
    ) -> None:
        if not isinstance(breaker, CircuitBreaker):
            raise ConfigError(f"breaker must be a ragguard CircuitBreaker, got {type(breaker).__name__}")
        name = breaker.name
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
        for option, fn in (("clock", clock), ("local_clock", local_clock), ("link_clock", link_clock)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{option} must be a callable returning seconds, got {fn!r}")
        self.clock = clock
        self._now: Clock = local_clock if local_clock is not None else (clock or monotonic)
        self.wrapped = breaker
        self.name = name
        self.bus = breaker.bus
        # the wrapped breaker's options, validated once (by it): every decision here reads them
        config = self._config = breaker.config
        self.classifier: Callable[[BaseException], bool] = config.classifier
        self._slow_classifier = config.slow_classifier
        self._slow_s = config.slow_call_duration_s
        self._error_class: type[BreakerOpen] = config.error_class
        self._rng: random.Random = breaker.rng
        self._jitter = config.open_jitter
        self._permits = config.half_open_permits
        self._ttl_arg = str(self._ttl_ms).encode()
        self._option_args = breaker_option_args(config)  # what the scripts run on, named by field
        # The epoch a state's first change moves to: random per replica (never the seeded rng), so
        # that tokens from before a Redis restart never match an epoch after it.
        self._birth = random.SystemRandom().randrange(1, 2**46)
        self._birth_arg = str(self._birth).encode()
        self.replica_id = f"{os.getpid():x}-{random.SystemRandom().getrandbits(40):010x}"
        self.keys = breaker_keys(name, key_prefix)
        self._seq_key = f"{self.keys[0].rsplit(':', 1)[0]}:seq:{self.replica_id}"
        # the probe's key: one of the breaker's hash tag that no script uses (the probe writes to it)
        probe = Probe(redis, f"{self.keys[0].rsplit(':', 1)[0]}:probe",
                      (BREAKER_REPORT, BREAKER_TRIAL_ACQUIRE, BREAKER_TRIAL_DONE, BREAKER_SET_STATE))
        self._link = RedisLink(redis, f"breaker:{name}", timeout_s=timeout_s,
                               probe_every_s=probe_every_s, clock=link_clock, probe=probe)
        self._link.on_degraded.append(self._go_local)
        self._link.on_restored.append(self._wake_up)
        self._report = Script(redis, BREAKER_REPORT, 4)
        self._trial_acquire = Script(redis, BREAKER_TRIAL_ACQUIRE, 3)
        self._trial_done = Script(redis, BREAKER_TRIAL_DONE, 3)
        self._set_state = Script(redis, BREAKER_SET_STATE, 3)
        # the keys and the arguments every script sends, encoded once (redis-py passes bytes as they are)
        self._script_keys = [key.encode() for key in self.keys]
        self._report_keys = [*self._script_keys, self._seq_key.encode()]
        self._lease_ids = (f"{self.replica_id}-{n}" for n in itertools.count())

        # The local copy of the shared state, replaced wholesale by every script reply.
        self._mode = _UNSYNCED
        self._state = _CLOSED
        self._epoch = _NO_EPOCH
        self._until = 0.0  # local clock; open while now < _until
        self._base = 0.0
        self._no_permit_until = -math.inf  # every permit was taken at the last look, until then
        self._hold: LocalHold | None = None

        self._pending = bytearray()  # outcome codes of the current epoch, not yet sent
        self._oks = 0  # fast successes recorded after the last code in _pending (see _fold)
        self._oks_room = batch_size  # batch_size - len(_pending): the batch is full when _oks reaches it
        self._unacked: tuple[int, int, bytes] | None = None  # (seq, epoch, codes) sent, no reply yet
        self._seq = 0
        self._trials: dict[str, _Trial] = {}  # granted to a caller of this replica, result not back
        self._trial_outbox: dict[str, tuple[int, float]] = {}  # lease -> (code, drop after)
        self._prefetched: deque[_Trial] = deque()
        self._batch: _TrialBatch | None = None
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._sync_lock = asyncio.Lock()
        self._trial_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        register_breaker(self)

    # -- reading ---------------------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        """The shared state as last read; on local state, the held or the wrapped breaker's."""
        if self._mode is _SHARED:
            return self._state
        hold = self._hold
        return self.wrapped.state if hold is None else hold.state

    @property
    def shared(self) -> bool:
        """True while this replica uses the shared state; False on local fallback."""
        return self._mode is _SHARED

    @property
    def synced(self) -> bool:
        """False until this replica first read the shared state or fell back to local state (a
        breaker no call has used yet): not on Redis, but not cut off from it either."""
        return self._mode is not _UNSYNCED

    @property
    def retry_after_s(self) -> float | None:
        """Seconds left open (>= 0) while open; None in any other state."""
        if self._mode is not _SHARED:
            hold = self._hold
            return self.wrapped.retry_after_s if hold is None else hold.retry_after_s(self._now())
        if self._state is not _OPEN:
            return None
        return max(0.0, self._until - self._now())

    def add_listener(self, listener: Any) -> Callable[[], None]:
        """Subscribe ``listener`` to this breaker's events (shared transitions, rejections,
        outcomes, and the local breaker's own while on local state); returns an unsubscribe."""
        return self.wrapped.add_listener(listener)

    def __repr__(self) -> str:
        where = "shared" if self._mode is _SHARED else "local"
        return f"<SharedCircuitBreaker {self.name!r} {self.state.value} ({where})>"

    # -- the Breaker protocol used by @guard -----------------------------------------------

    def acquire(self) -> Token:
        """Ask to run one call; returns a token for :meth:`on_result` or :meth:`release`.

        Never waits. Raises the wrapped breaker's ``error_class`` (a :class:`ragguard.BreakerOpen`)
        when open or forced open. While half-open it hands out a permit fetched earlier, or raises
        with ``state="half_open"`` and ``retry_after_s`` 0.0 after asking for one: a caller that
        can wait then awaits :meth:`acquire_async` (the guard does), which takes its permit from
        Redis in the same round trip.
        """
        if self._mode is _SHARED:
            if self._state is _CLOSED:
                return self._epoch
            token = self._acquire_shared()
            if token is _ROUND_TRIP:
                self._request_trials(None)
                raise self._error_class(self.name, 0.0, state=_HALF_OPEN.value)
            return token  # type: ignore[no-any-return]
        if self._task is None:
            self._autostart()
        if self._mode is _UNSYNCED and self._hold is None:
            return _Early(self.wrapped.acquire())  # may end after the first read: see on_result
        return self._acquire_local()

    async def acquire_async(self) -> Token:
        """Like :meth:`acquire`, but while half-open it waits for a trial permit from Redis: one
        round trip shared by every caller of this replica that arrives meanwhile, bounded by
        ``redis_timeout_s``. Cancelling the wait gives back a permit granted to it.

        Raises ``error_class`` when open, forced open, or half-open with every permit taken.
        """
        if self._mode is not _SHARED or self._state is _CLOSED:
            return self.acquire()
        token = self._acquire_shared()
        if token is not _ROUND_TRIP:
            return token  # type: ignore[no-any-return]
        future: asyncio.Future[_Trial | None] = asyncio.get_running_loop().create_future()
        self._request_trials(future)
        try:
            trial = await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.result() is not None:
                self.release(future.result())
            raise
        if trial is not None:
            return trial
        return self._after_no_permit()

    def on_result(self, token: Token, duration_s: float, exc: BaseException | None,
                  now: float | None = None) -> None:
        """Record the end of a call admitted with ``token`` (as ``CircuitBreaker.on_result``).

        ``duration_s`` in seconds; ``exc`` the ``Exception`` raised or None. Never waits: the
        outcome joins the batch the background task sends.
        """
        if exc is None and token == self._epoch and duration_s <= self._slow_s and self._mode is _SHARED:
            # A fast success, the common case: counted, and folded into the batch as zero bytes
            # when the batch is read (as the in-memory breaker folds its own). Only an int equals
            # the epoch; a trial or a hold token never does.
            self._oks = oks = self._oks + 1
            if oks >= self._oks_room:
                self._batch_full()
            if self.bus.active:
                self.bus.emit(events.CallOutcome(self.name, "success", duration_s, None))
            return
        if type(token) is int:
            if token == self._epoch and self._mode is _SHARED:
                code = self._code_of(duration_s, exc)
                if code < 0:
                    return
                pending = self._fold()
                pending.append(code)
                self._oks_room = room = self._batch_size - len(pending)
                if room <= 0:
                    self._batch_full()
                if self.bus.active:
                    self.bus.emit(events.CallOutcome(self.name, _OUTCOMES[code], duration_s,
                                                     None if exc is None else type(exc).__name__))
            elif token < 0:
                self.wrapped.on_result(-1 - token, duration_s, exc, now)
                if self._mode is _UNSYNCED:  # before the first read: for the shared window too
                    code = self._code_of(duration_s, exc)
                    if code >= 0:
                        pending = self._fold()
                        pending.append(code)
                        self._oks_room = self._batch_size - len(pending)
            elif token == self._epoch and self._hold is None:
                # admitted on shared state, ended on local state: the local breaker counts it
                wrapped = self.wrapped
                if wrapped.state is _CLOSED:
                    wrapped.on_result(wrapped.acquire(), duration_s, exc, now)
            return  # else it started before a shared transition: the old epoch is over
        if isinstance(token, _Trial):
            self._trial_ended(token, self._code_of(duration_s, exc))
        elif isinstance(token, _Early):
            self.wrapped.on_result(token.token, duration_s, exc, now)
            code = self._code_of(duration_s, exc)
            if code >= 0 and self._mode is not _LOCAL:  # for the shared window too, read or not yet
                pending = self._fold()
                pending.append(code)
                self._oks_room = room = self._batch_size - len(pending)
                if room <= 0 and self._mode is _SHARED:
                    self._batch_full()
        elif isinstance(token, HoldTrial) and self._hold is not None:
            self._hold.record(token.round, self._code_of(duration_s, exc), self._now())
            self._settle_hold()

    def release(self, token: Token) -> None:
        """Give back ``token`` without recording an outcome (cancelled, or never ran)."""
        if type(token) is int:
            if token < 0:
                self.wrapped.release(-1 - token)
        elif isinstance(token, _Early):
            self.wrapped.release(token.token)
        elif isinstance(token, _Trial):
            self._trial_ended(token, _IGNORED)
        elif isinstance(token, HoldTrial) and self._hold is not None:
            self._hold.release(token.round)

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
        self._hold = None
        local()
        try:
            reply = await self._link.call(functools.partial(self._script, self._set_state, target))
        except SharedStateUnavailable:
            log.warning("ragguard breaker %r: %s applied locally only (Redis unreachable)", self.name, target)
            return
        self._apply(reply)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, *, strict: bool = False) -> SharedCircuitBreaker:
        """Check Redis with the health probe, read the shared state (writing nothing) and start the
        background task; returns self.

        When Redis does not answer, the breaker starts on local state and keeps trying. When Redis
        refuses the configuration (a wrong password, a missing ACL permission, an untrusted TLS
        certificate) it is logged at ERROR and the same happens, or with ``strict=True``
        :class:`~ragguard.ConfigError` names the cause (never the secret).
        """
        await self._link.start(strict=strict)
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(), name=f"ragguard-breaker-{self.name}")
            await self._sync()
        return self

    async def refresh(self) -> None:
        """Wait for the trial permit requests in flight, then send the pending outcomes and trial
        results and read the shared state now."""
        if self._side_tasks:
            await asyncio.wait(list(self._side_tasks))
        await self._sync()

    async def _sync(self) -> None:
        async with self._sync_lock:  # one sync at a time: the background task's or a caller's
            await self._refresh()

    async def aclose(self) -> None:
        """Send what is pending (best effort), give back unused permits, stop the background work."""
        if self._closing:
            return
        self._closing = True
        tasks = [t for t in (self._task, *self._side_tasks) if t is not None]
        self._task = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        while self._prefetched:
            self._trial_ended(self._prefetched.popleft(), _IGNORED)
        if not self._link.degraded:
            await self.refresh()
        await self._link.aclose()

    async def __aenter__(self) -> SharedCircuitBreaker:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    # -- shared state ------------------------------------------------------------------------

    def _acquire_shared(self) -> Any:
        """A token, or _ROUND_TRIP when a trial permit must come from Redis; raises on rejection."""
        state = self._state
        if state is _CLOSED:
            return self._epoch
        if state is _DISABLED:
            return None
        if state is _FORCED_OPEN:
            self._reject(state, None)
        now = self._now()
        if state is _OPEN and now < self._until:
            self._reject(state, self._until - now)
        prefetched = self._prefetched
        while prefetched:
            trial = prefetched.popleft()
            if trial.epoch == self._epoch:
                self._trials[trial.lease] = trial
                return trial
        if now < self._no_permit_until:
            self._reject(_HALF_OPEN, 0.0)
        return _ROUND_TRIP

    def _after_no_permit(self) -> Token:
        """Decide for a caller whose request got no permit, from the state the reply left."""
        if self._mode is not _SHARED:
            return self._acquire_local()
        state = self._state
        if state is _CLOSED:
            return self._epoch
        if state is _DISABLED:
            return None
        if state is _FORCED_OPEN:
            self._reject(state, None)
        left = self._until - self._now()
        if state is _OPEN and left > 0:
            self._reject(state, left)
        self._reject(_HALF_OPEN, 0.0)

    def _request_trials(self, waiter: asyncio.Future[_Trial | None] | None) -> None:
        batch = self._batch
        if batch is None or batch.sent:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop to ask on (a synchronous caller): refused, nothing fetched
            batch = self._batch = _TrialBatch()
            task = loop.create_task(self._send_trials(batch))
            self._side_tasks.add(task)
            task.add_done_callback(self._side_tasks.discard)
        if waiter is None:
            batch.prefetch = True
        else:
            # A waiter is usually the synchronous caller that asked for the prefetch, now waiting
            # (the guard calls acquire, then acquire_async): it takes the permit itself, and a
            # permit it no longer wants goes back at once rather than waiting as a prefetch.
            batch.prefetch = False
            batch.waiters.append(waiter)

    async def _send_trials(self, batch: _TrialBatch) -> None:
        leases: list[str] = []
        granted: list[_Trial] = []
        try:
            async with self._trial_lock:  # one request in flight; the next batch gathers meanwhile
                batch.sent = True
                if self._batch is batch:
                    self._batch = None
                want = min(sum(1 for w in batch.waiters if not w.done()) or int(batch.prefetch),
                           self._permits)
                if want == 0 or self._mode is not _SHARED or self._now() < self._no_permit_until:
                    return
                leases = [next(self._lease_ids) for _ in range(want)]
                try:
                    reply = await self._link.call(functools.partial(
                        self._script, self._trial_acquire, repr(self._trial_lease_s), *leases))
                except LinkBusy:
                    return  # nothing was sent: the callers are refused (half-open, retry at once)
                except BaseException as exc:
                    for lease in leases:  # the script may have run: give the leases back
                        self._trial_outbox[lease] = (_IGNORED, self._now() + self._trial_lease_s)
                    self._wake.set()
                    if not isinstance(exc, SharedStateUnavailable):
                        raise
                    return
                n = self._apply(reply)
                now = self._now()
                granted = [_Trial(lease, self._epoch, now) for lease in leases[:n]]
        finally:
            self._hand_out(batch, granted, leases)

    def _hand_out(self, batch: _TrialBatch, granted: list[_Trial], asked: list[str]) -> None:
        for waiter in batch.waiters:
            if waiter.done():
                continue
            if granted:
                trial = granted.pop(0)
                self._trials[trial.lease] = trial
                waiter.set_result(trial)
            else:
                waiter.set_result(None)
        if granted and batch.prefetch and not self._closing:
            self._prefetched.extend(granted)
        else:
            for trial in granted:  # nobody is left to use it
                self._trial_ended(trial, _IGNORED)

    def _trial_ended(self, trial: _Trial, code: int) -> None:
        self._trials.pop(trial.lease, None)
        self._trial_outbox[trial.lease] = (code, trial.granted_at + self._trial_lease_s)
        if code < 0:
            self._no_permit_until = -math.inf  # a permit came back
        hold = self._hold
        if hold is not None and trial.hold_round is not None:
            hold.record(trial.hold_round, code, self._now())
            self._settle_hold()
        self._wake.set()

    def _code_of(self, duration_s: float, exc: BaseException | None) -> int:
        if exc is None:
            return _SLOW if duration_s > self._slow_s else 0
        return self._code(duration_s, exc)

    def _code(self, duration_s: float, exc: BaseException) -> int:
        # the one outcome classification, shared with the in-memory breaker
        return classify_outcome(self._config, exc, duration_s, breaker=self.name)

    def _reject(self, state: BreakerState, retry_after_s: float | None) -> NoReturn:
        if self.bus.active:
            self.bus.emit(events.CallRejected(self.name, state.value, retry_after_s))
        if state is _OPEN:
            raise self._error_class(self.name, retry_after_s)
        raise self._error_class(self.name, retry_after_s, state=state.value)

    def _args(self, *extra: Any) -> list[Any]:
        spread = self._jitter * (2.0 * self._rng.random() - 1.0) if self._jitter else 0.0
        now = "" if self.clock is None else repr(float(self.clock()))
        return [now, self._ttl_arg, repr(spread), self._birth_arg, *self._option_args, *extra]

    def _script(self, script: Script, *extra: Any) -> Awaitable[Any]:
        return script(*self._script_keys, *self._args(*extra))

    def _apply(self, reply: Any) -> int:
        """Adopt a snapshot ``'extra state epoch open_left_s open_base_s permits_left reason'``;
        returns extra."""
        extra, state_s, epoch_s, left_s, base_s, permits_left, reason = _text(reply).split(" ", 6)
        state = BreakerState(state_s)
        epoch = int(epoch_s)
        now = self._now()
        if epoch != self._epoch and self._epoch != _NO_EPOCH:
            self._pending.clear()  # recorded in an epoch that is over
            self._oks = 0
            self._oks_room = self._batch_size
            self._prefetched.clear()  # their leases died with the epoch
        # Half-open with every permit taken: refuse without asking again until the next sync.
        full = state is _HALF_OPEN and int(permits_left) <= 0
        self._no_permit_until = now + self._flush_interval_s if full else -math.inf
        old = self._state
        self._state, self._epoch, self._base = state, epoch, float(base_s)
        self._until = now + float(left_s) if state is _OPEN else 0.0
        if old is not state and self._mode is _SHARED and self.bus.active:
            self.bus.emit(events.BreakerTransition(self.name, old.value, state.value, now,
                                                   f"shared: {reason}"))
        return int(extra)

    # -- sync ----------------------------------------------------------------------------------

    async def _refresh(self) -> None:
        link = self._link
        if link.degraded:
            self._go_local()
            return
        try:
            await self._send_trial_results()
            if self._unacked is None and (self._pending or self._oks):
                self._seq += 1
                self._unacked = (self._seq, self._epoch, bytes(self._fold()))
                self._pending = bytearray()
                self._oks_room = self._batch_size
            seq, epoch, codes = self._unacked or (0, self._epoch, b"")
            reply = await link.call(self._report, *self._report_keys,
                                    *self._args(epoch if epoch != _NO_EPOCH else -1, codes, seq))
            self._unacked = None
            was = self.state
            self._apply(reply)
            if self._mode is not _SHARED:
                self._mode = _SHARED
                self._hold = None
                if was is not self._state and self.bus.active:
                    self.bus.emit(events.BreakerTransition(self.name, was.value, self._state.value,
                                                           self._now(), "shared state read"))
            await self._give_back_stale_permits()
        except LinkBusy:
            return  # the pool is busy: try again at the next flush
        except SharedStateUnavailable:
            # One failed sync only ages the local copy (the batch is resent, counted once); the link
            # decides when Redis is gone (failures_to_degrade in a row) and calls _go_local.
            if link.degraded:
                self._go_local()

    async def _send_trial_results(self) -> None:
        outbox = self._trial_outbox
        if not outbox:
            return
        now = self._now()
        for lease in [lease for lease, (_, drop_at) in outbox.items() if drop_at <= now]:
            del outbox[lease]  # its lease has expired in Redis: nothing left to give back
        if not outbox:
            return
        sent = list(outbox.items())
        pairs: list[Any] = []
        for lease, (code, _) in sent:
            pairs += [lease, code]
        reply = await self._link.call(functools.partial(self._script, self._trial_done, *pairs))
        for lease, entry in sent:
            if outbox.get(lease) is entry:
                del outbox[lease]
        self._apply(reply)

    async def _give_back_stale_permits(self) -> None:
        now = self._now()
        prefetched = self._prefetched
        while prefetched and now - prefetched[0].granted_at > self.staleness_s:
            self._trial_ended(prefetched.popleft(), _IGNORED)  # nobody came for it
        if self._trial_outbox:
            await self._send_trial_results()

    def _fold(self) -> bytearray:
        """The batch of outcome codes, with the fast successes counted since its last code appended."""
        pending = self._pending
        if self._oks:
            pending += bytes(self._oks)  # success is code 0
            self._oks = 0
        return pending

    def _batch_full(self) -> None:
        pending = self._fold()
        if len(pending) >= _MAX_PENDING_BATCHES * self._batch_size:
            del pending[: len(pending) // 2]  # Redis is slow: keep the newest outcomes, bounded
        self._oks_room = self._batch_size - len(pending)  # <= 0 until the batch is sent: each
        self._wake.set()  # outcome wakes the background task again

    # -- local state -----------------------------------------------------------------------------

    def _acquire_local(self) -> Token:
        hold = self._hold
        if hold is not None:
            return hold.acquire(self._now())
        return -1 - self.wrapped.acquire()

    def _go_local(self) -> None:
        """Redis is unreachable: decide locally, starting from the last shared state read."""
        if self._mode is _LOCAL:
            return
        was_shared = self._mode is _SHARED
        self._mode = _LOCAL
        if not was_shared:
            return  # never read the shared state: the wrapped breaker decides from the start
        state = self._state
        now = self._now()
        if state is _CLOSED:
            self._hold = None
            if self.wrapped.state is not _CLOSED:
                self._silently(self.wrapped.reset)
            return
        running = [t for t in self._trials.values() if t.epoch == self._epoch]
        self._hold = LocalHold(
            state, self._config, now=now, open_left_s=max(0.0, self._until - now), open_base_s=self._base,
            trials_running=len(running) if state is _HALF_OPEN else 0, rng=self._rng,
            reject=self._reject, moved=self._hold_moved,
        )
        if state is _HALF_OPEN:
            for trial in running:
                trial.hold_round = self._hold.round

    def _hold_moved(self, old: BreakerState, new: BreakerState, now: float, reason: str) -> None:
        if self.bus.active:
            self.bus.emit(events.BreakerTransition(self.name, old.value, new.value, now, reason))

    def _settle_hold(self) -> None:
        hold = self._hold
        if hold is not None and hold.resolved:
            self._hold = None
            self._silently(self.wrapped.reset)

    def _silently(self, operation: Callable[[], None]) -> None:
        wrapped = self.wrapped
        bus, wrapped.bus = wrapped.bus, _SILENT
        try:
            operation()
        finally:
            wrapped.bus = bus

    # -- background ----------------------------------------------------------------------------

    def _wake_up(self) -> None:
        self._wake.set()

    def _autostart(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if not self._closing:
            self._task = loop.create_task(self._run(first=True), name=f"ragguard-breaker-{self.name}")

    async def _run(self, *, first: bool = False) -> None:
        if first:
            await self._sync()
        wake = self._wake
        while not self._closing:
            try:
                async with asyncio.timeout(self._flush_interval_s):
                    await wake.wait()
            except TimeoutError:
                pass
            wake.clear()
            try:
                await self._sync()
            except Exception:  # a bug here must not stop the replica from syncing later
                log.exception("ragguard breaker %r: sync failed", self.name)
