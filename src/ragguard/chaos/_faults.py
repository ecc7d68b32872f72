"""Faults applied at a guarded stage, after Polly's Simmy strategies.

Every fault has an ``enabled`` switch, an ``injection_rate`` (the share of matching calls it
hits, drawn from a seeded :class:`random.Random`) and an optional :class:`Schedule` of time
windows. When it fires, it wraps the stage's real call:

======================  ==========================================================================
latency                 :class:`Latency` (fixed, or drawn: :meth:`Latency.long_tail`)
hang / timeout          :class:`Hang` (until cancelled), :class:`Timeout` (``TimeoutError`` after a delay)
error                   :class:`Error`: a given exception, or a typed ``kind`` the breakers classify
outcome                 :class:`PartialResults`, :class:`EmptyResults`, :class:`StaleResults`,
                        :class:`CorruptPayload` (bit flips, truncation)
behaviour               :class:`BlockLoop` (``time.sleep`` on the loop thread),
                        :class:`HoldConnections` (keep N connections of a redis.asyncio pool)
======================  ==========================================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import functools
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from .. import _validate as v
from .._clock import Clock, monotonic
from .._errors import ConfigError

__all__ = [
    "BlockLoop",
    "CorruptPayload",
    "EmptyResults",
    "Error",
    "ErrorKind",
    "Fault",
    "FaultContext",
    "Hang",
    "HoldConnections",
    "Latency",
    "PartialResults",
    "Schedule",
    "StaleResults",
    "Timeout",
    "batch_size",
    "call_batch_size",
    "corrupt_bytes",
    "make_error",
]

Call = Callable[[], Awaitable[Any]]
Sleep = Callable[[float], Awaitable[Any]]

ErrorKind = Literal[
    "connection_refused",
    "connection_reset",
    "grpc_unavailable",
    "grpc_deadline_exceeded",
    "timeout",
    "memory",
    "cuda_oom",
]
ERROR_KINDS: tuple[str, ...] = ErrorKind.__args__  # type: ignore[attr-defined]

_batch_size: ContextVar[int | None] = ContextVar("ragguard_chaos_batch_size", default=None)


@contextlib.contextmanager
def batch_size(n: int) -> Any:
    """Declare the size of the batch the enclosed guarded calls process (for ``min_batch`` faults).

    ``with batch_size(len(docs)): await rerank(query, docs)``. Raises ValueError when ``n`` < 0.
    """
    v.count("batch_size n", n, 0)
    token = _batch_size.set(n)
    try:
        yield
    finally:
        _batch_size.reset(token)


def call_batch_size(call: Call | None) -> int | None:
    """The batch size of a guarded call: the enclosing ``batch_size(n)``, else the length of the
    longest list or tuple argument of ``call`` when it is a ``functools.partial`` (as ``@guard``
    passes it), else None."""
    size = _batch_size.get()
    if size is not None or not isinstance(call, functools.partial):
        return size
    lengths = [len(a) for a in (*call.args, *call.keywords.values()) if isinstance(a, list | tuple)]
    return max(lengths) if lengths else None


def _check_seconds(name: str, value: float, *, allow_inf: bool = False) -> float:
    if allow_inf and value == math.inf:
        return math.inf
    return v.seconds(name, value, allow_zero=True)


class Schedule:
    """Time windows in which a fault may fire, in seconds since ``start`` on ``clock``.

    ``windows`` is a sequence of ``(from_s, to_s)`` pairs (``to_s`` None: open-ended).
    ``start`` defaults to ``clock()`` when the schedule is made. With ``period_s``, the window
    pattern repeats: times are taken modulo the period (a flapping dependency).
    Raises ConfigError for an empty or reversed window.
    """

    __slots__ = ("clock", "period_s", "start", "windows")

    def __init__(
        self,
        windows: Sequence[tuple[float, float | None]],
        *,
        clock: Clock = monotonic,
        start: float | None = None,
        period_s: float | None = None,
    ) -> None:
        parsed: list[tuple[float, float]] = []
        for i, (lo, hi) in enumerate(windows):
            lo_f = _check_seconds(f"windows[{i}] from_s", lo)
            hi_f = math.inf if hi is None else _check_seconds(f"windows[{i}] to_s", hi, allow_inf=True)
            if hi_f <= lo_f:
                raise ConfigError(f"windows[{i}]: to_s ({hi}) must be > from_s ({lo})")
            parsed.append((lo_f, hi_f))
        if not parsed:
            raise ConfigError("Schedule: windows must not be empty")
        if period_s is not None and not (period_s > 0 and math.isfinite(period_s)):
            raise ConfigError(f"Schedule: period_s must be > 0, got {period_s!r}")
        self.windows = tuple(parsed)
        self.clock = clock
        self.start = clock() if start is None else float(start)
        self.period_s = period_s

    def active(self, now: float | None = None) -> bool:
        """True when ``now`` (default ``clock()``) falls in a window."""
        t = (self.clock() if now is None else now) - self.start
        if t < 0:
            return False
        if self.period_s is not None:
            t %= self.period_s
        return any(lo <= t < hi for lo, hi in self.windows)


@dataclass(slots=True)
class FaultContext:
    """What a firing fault knows about the call it wraps."""

    stage: str
    tenant: str
    rng: random.Random
    sleep: Sleep


class Fault:
    """Base of every fault: the ``enabled`` switch, ``injection_rate`` and ``schedule``.

    ``injection_rate`` in [0, 1] is the share of matching calls the fault hits; the draw uses
    ``rng`` when given, else the injector's. ``min_batch`` restricts it to calls whose batch
    (see :func:`call_batch_size`) holds at least ``min_batch`` items. Raises ConfigError for an
    out-of-range value.
    """

    kind: ClassVar[str] = "fault"
    rewrites_result: ClassVar[bool] = False
    """True for faults that change what the call returned (not applied to a stream's opening)."""

    def __init__(
        self,
        *,
        injection_rate: float = 1.0,
        enabled: bool = True,
        schedule: Schedule | None = None,
        rng: random.Random | None = None,
        min_batch: int | None = None,
    ) -> None:
        self.injection_rate = v.fraction("injection_rate", injection_rate)
        if min_batch is not None:
            v.count("min_batch", min_batch, 0)
        self.enabled = bool(enabled)
        self.schedule = schedule
        self.rng = rng
        self.min_batch = min_batch

    def fires(self, rng: random.Random, call: Call | None = None) -> bool:
        """Decide for one call: enabled, inside the schedule, big enough a batch, and the dice."""
        if not self.enabled:
            return False
        if self.schedule is not None and not self.schedule.active():
            return False
        if self.min_batch is not None:
            size = call_batch_size(call)
            if size is None or size < self.min_batch:
                return False
        rate = self.injection_rate
        if rate >= 1.0:
            return True
        if rate <= 0.0:
            return False
        return (self.rng or rng).random() < rate

    async def wrap(self, call: Call, ctx: FaultContext) -> Any:
        """Run in place of ``call()`` when the fault fires; subclasses override."""
        return await call()

    def observe(self, ctx: FaultContext, result: Any) -> None:
        """Called with the result of each matching call the fault did not hit (default: nothing)."""

    def release(self) -> None:
        """Free what the fault holds (connections); called when it is removed."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rate={self.injection_rate}, enabled={self.enabled})"


# -- latency, hang, timeout ---------------------------------------------------------------------


class Latency(Fault):
    """Delay the call by ``seconds`` (fixed) or by ``distribution(rng)`` seconds, then run it."""

    kind = "latency"

    def __init__(
        self,
        seconds: float | None = None,
        *,
        distribution: Callable[[random.Random], float] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        if (seconds is None) == (distribution is None):
            raise ConfigError("Latency: give exactly one of seconds or distribution")
        self.seconds = None if seconds is None else _check_seconds("Latency seconds", seconds)
        self.distribution = distribution

    @classmethod
    def long_tail(
        cls, *, median_s: float, p99_s: float, max_s: float | None = None, **options: Any
    ) -> Latency:
        """Log-normal delays: half the calls wait less than ``median_s``, 1 % more than ``p99_s``.

        sigma = ln(p99_s / median_s) / 2.326 (2.326 is the standard normal's 99th percentile);
        each delay is capped at ``max_s`` (default 10 x ``p99_s``).
        """
        median = _check_seconds("median_s", median_s)
        p99 = _check_seconds("p99_s", p99_s)
        if not 0 < median < p99:
            raise ConfigError(f"long_tail: need 0 < median_s < p99_s, got {median_s}, {p99_s}")
        cap = 10 * p99 if max_s is None else _check_seconds("max_s", max_s)
        mu, sigma = math.log(median), math.log(p99 / median) / 2.326

        def draw(rng: random.Random) -> float:
            return min(cap, rng.lognormvariate(mu, sigma))

        return cls(distribution=draw, **options)

    def delay_s(self, rng: random.Random) -> float:
        if self.seconds is not None:
            return self.seconds
        assert self.distribution is not None
        return max(0.0, float(self.distribution(self.rng or rng)))

    async def wrap(self, call: Call, ctx: FaultContext) -> Any:
        await ctx.sleep(self.delay_s(ctx.rng))
        return await call()


class Hang(Fault):
    """Never return: wait until the caller cancels (a deadline, a timeout). The call never runs."""

    kind = "hang"

    async def wrap(self, call: Call, ctx: FaultContext) -> Any:
        while True:  # bounded by cancellation, which is the point of the fault
            await ctx.sleep(3600.0)


class Timeout(Fault):
    """Wait ``after_s`` seconds, then raise a builtin ``TimeoutError``; the call never runs."""

    kind = "timeout"

    def __init__(self, after_s: float = 0.0, **options: Any) -> None:
        super().__init__(**options)
        self.after_s = _check_seconds("Timeout after_s", after_s)

    async def wrap(self, call: Call, ctx: FaultContext) -> Any:
        if self.after_s:
            await ctx.sleep(self.after_s)
        raise TimeoutError(f"chaos: {ctx.stage} timed out after {self.after_s:.3f}s")


# -- errors ---------------------------------------------------------------------------------------


def make_error(kind: str, stage: str = "stage") -> BaseException:
    """A fresh exception of a typed ``kind`` (one of :data:`ErrorKind`), as real code raises it.

    connection_refused / connection_reset: ``ConnectionRefusedError`` / ``ConnectionResetError``
    with the real errno; grpc_unavailable / grpc_deadline_exceeded: a ``grpc.aio.AioRpcError``
    with that status code; timeout: ``TimeoutError``; memory: ``MemoryError``; cuda_oom: the
    ``RuntimeError`` PyTorch raises. Raises ConfigError for an unknown kind.
    """
    if kind == "connection_refused":
        return ConnectionRefusedError(errno.ECONNREFUSED, os.strerror(errno.ECONNREFUSED))
    if kind == "connection_reset":
        return ConnectionResetError(errno.ECONNRESET, os.strerror(errno.ECONNRESET))
    if kind in ("grpc_unavailable", "grpc_deadline_exceeded"):
        import grpc
        from grpc import aio

        if kind == "grpc_unavailable":
            code, details = grpc.StatusCode.UNAVAILABLE, "chaos: failed to connect to all addresses"
        else:
            code, details = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
        err: BaseException = aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), details=details,
                                             debug_error_string=f"chaos fault at stage {stage!r}")
        return err
    if kind == "timeout":
        return TimeoutError(f"chaos: {stage} timed out")
    if kind == "memory":
        return MemoryError(f"chaos: {stage} ran out of memory")
    if kind == "cuda_oom":
        return RuntimeError(
            "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity; "
            f"14.90 GiB already allocated) [chaos fault at stage {stage!r}]"
        )
    raise ConfigError(f"unknown error kind {kind!r}; expected one of {', '.join(ERROR_KINDS)}")


class Error(Fault):
    """Raise an exception instead of running the call.

    ``exception`` is an exception instance (a copy is raised each time), an exception class
    (instantiated with a message), or a zero-argument factory; or give ``kind`` (see
    :func:`make_error`). With ``after_call=True`` the call runs first and its result is lost
    (the side effect happened, the reply did not arrive).
    """

    kind = "error"

    def __init__(
        self,
        exception: BaseException | type[BaseException] | Callable[[], BaseException] | None = None,
        *,
        kind: str | None = None,
        after_call: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        if (exception is None) == (kind is None):
            raise ConfigError("Error: give exactly one of exception or kind")
        if kind is not None:
            make_error(kind)  # validates the kind
        self.exception = exception
        self.error_kind = kind
        self.after_call = after_call

    def build(self, stage: str) -> BaseException:
        exc = self.exception
        if exc is None:
            return make_error(self.error_kind or "", stage)
        if isinstance(exc, BaseException):
            return copy.copy(exc)
        if isinstance(exc, type):
            built: BaseException = exc(f"chaos: fault injected at stage {stage!r}")
            return built
        made = exc()
        if not isinstance(made, BaseException):
            raise TypeError(f"Error: the factory returned {made!r}, not an exception")
        return made

    async def wrap(self, call: Call, ctx: FaultContext) -> Any:
        if self.after_call:
            await call()
        raise self.build(ctx.stage)


# -- outcomes -------------------------------------------------------------------------------------


class PartialResults(Fault):
    """Return fewer hits than asked: keep ``keep`` (a share in [0, 1]) or at most ``max_hits``.

    The result must be a list or tuple; other results pass through unchanged.
    """

    kind = "partial"
    rewrites_result = True

    def __init__(self, *, keep: float | None = 0.5, max_hits: int | None = None, **options: Any) -> None:
        super().__init__(**options)
        if max_hits is not None:
            v.count("PartialResults max_hits", max_hits, 0)
            keep = None
        elif keep is None:
            raise ConfigError("PartialResults: give keep or max_hits")
        self.keep = None if keep is None else v.fraction("PartialResults keep", keep)
        self.max_hits = max_hits

    async def wrap(self, call: Call, ctx: FaultContext) -> Any:
        result = await call()
        if not isinstance(result, list | tuple):
            return result
        n = self.max_hits if self.max_hits is not None else math.floor(len(result) * (self.keep or 0.0))
        n = min(n, max(len(result) - 1, 0))  # always fewer than the real answer when it had any
        return result[:n]


class EmptyResults(Fault):
    """Run the call and return an empty value of the same type ([] / () / b"" / "" / {})."""

    kind = "empty"
    rewrites_result = True

    async def wrap(self, call: Call, ctx: FaultContext) -> Any:
        result = await call()
        try:
            return type(result)()
        except TypeError:
            return None


class StaleResults(Fault):
    """Serve an old answer: ``value`` when given, else the first result seen for the stage+tenant.

    Without ``value`` and before any result was seen, the fresh result passes through.
    """

    kind = "stale"
    rewrites_result = True
    _MISSING: ClassVar[object] = object()

    def __init__(self, value: Any = _MISSING, **options: Any) -> None:
        super().__init__(**options)
        self.value = value
        self._seen: dict[tuple[str, str], Any] = {}

    def observe(self, ctx: FaultContext, result: Any) -> None:
        key = (ctx.stage, ctx.tenant)
        if key not in self._seen and len(self._seen) < 10_000:
            self._seen[key] = result

    async def wrap(self, call: Call, ctx: FaultContext) -> Any:
        if self.value is not self._MISSING:
            return self.value
        key = (ctx.stage, ctx.tenant)
        if key in self._seen:
            return self._seen[key]
        result = await call()
        self.observe(ctx, result)
        return result


def corrupt_bytes(
    data: bytes | bytearray | memoryview,
    rng: random.Random,
    *,
    flips: int = 1,
    truncate_to: float | None = None,
) -> bytes:
    """A corrupted copy of ``data``: ``flips`` random bits flipped, then cut to ``truncate_to``.

    ``truncate_to`` is the share of the length kept, in [0, 1) (None: no cut). The original is
    never modified. Raises ConfigError for a negative ``flips`` or a share out of range.
    """
    v.count("corrupt_bytes flips", flips, 0)
    out = bytearray(data)
    if out:
        for _ in range(flips):
            bit = rng.randrange(len(out) * 8)
            out[bit >> 3] ^= 1 << (bit & 7)
    if truncate_to is not None:
        if not 0.0 <= truncate_to < 1.0:
            raise ConfigError(f"corrupt_bytes: truncate_to must be in [0, 1), got {truncate_to!r}")
        del out[math.floor(len(out) * truncate_to):]
    return bytes(out)


class CorruptPayload(Fault):
    """Run the call and corrupt its bytes result (bit flips, truncation), for codec tests.

    Results that are not bytes-like pass through unchanged.
    """

    kind = "corrupt"
    rewrites_result = True

    def __init__(self, *, flips: int = 1, truncate_to: float | None = None, **options: Any) -> None:
        super().__init__(**options)
        corrupt_bytes(b"x", random.Random(0), flips=flips, truncate_to=truncate_to)  # validates
        self.flips = flips
        self.truncate_to = truncate_to

    async def wrap(self, call: Call, ctx: FaultContext) -> Any:
        result = await call()
        if isinstance(result, bytes | bytearray | memoryview):
            return corrupt_bytes(result, self.rng or ctx.rng, flips=self.flips, truncate_to=self.truncate_to)
        return result


# -- behaviour ------------------------------------------------------------------------------------


class BlockLoop(Fault):
    """Block the event loop: a real ``time.sleep(ms / 1000)`` on the loop thread, then run the call.

    Every other task on the loop stalls for that long, as with CPU-bound code in a handler.
    """

    kind = "block_loop"

    def __init__(self, ms: float, **options: Any) -> None:
        super().__init__(**options)
        self.ms = _check_seconds("BlockLoop ms", ms)

    async def wrap(self, call: Call, ctx: FaultContext) -> Any:
        time.sleep(self.ms / 1000.0)  # noqa: ASYNC251 - blocking the loop is this fault's purpose
        return await call()


class HoldConnections(Fault):
    """Hold ``connections`` connections of a redis.asyncio ``pool`` until released (pool exhaustion).

    Use it directly (``await hold.acquire()`` ... ``await hold.release_async()``, or
    ``async with hold:``), or inject it: the first call it hits acquires the connections, then runs.
    Removing the fault from :class:`~ragguard.chaos.Chaos` releases them.
    """

    kind = "hold_connections"

    def __init__(self, pool: Any, connections: int, **options: Any) -> None:
        super().__init__(**options)
        if not hasattr(pool, "get_connection") or not hasattr(pool, "release"):
            raise ConfigError("HoldConnections: pool must be a redis.asyncio ConnectionPool")
        v.count("HoldConnections connections", connections, 1)
        self.pool = pool
        self.connections = connections
        self.held: list[Any] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        """Take the connections (no-op when already held); waits as a blocking pool would."""
        async with self._lock:
            if self.held:
                return
            self._loop = asyncio.get_running_loop()
            try:
                for _ in range(self.connections):
                    self.held.append(await self.pool.get_connection())
            except BaseException:
                await self._give_back()
                raise

    async def release_async(self) -> None:
        """Give every held connection back to the pool."""
        async with self._lock:
            await self._give_back()

    async def _give_back(self) -> None:
        held, self.held = self.held, []
        for conn in held:
            await self.pool.release(conn)

    def release(self) -> None:
        """Give the connections back from sync code: scheduled on their loop if it still runs."""
        loop = self._loop
        if not self.held or loop is None or loop.is_closed():
            self.held = []
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            task = loop.create_task(self.release_async())
            _background.add(task)
            task.add_done_callback(_background.discard)
        else:
            asyncio.run_coroutine_threadsafe(self.release_async(), loop)

    async def __aenter__(self) -> HoldConnections:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release_async()

    async def wrap(self, call: Call, ctx: FaultContext) -> Any:
        await self.acquire()
        return await call()


_background: set[asyncio.Task[Any]] = set()


def _as_names(value: str | Iterable[str] | None, what: str) -> frozenset[str] | None:
    if value is None:
        return None
    names = frozenset([value]) if isinstance(value, str) else frozenset(value)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"{what} must be a non-empty str, an iterable of them, or None; got {value!r}")
    return names
