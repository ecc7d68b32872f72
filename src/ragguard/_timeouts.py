"""Attempt timers that cost almost nothing when the call finishes in time.

``asyncio.timeout`` schedules and cancels one TimerHandle per call (about 4 µs here, more than a
whole guarded call should cost). Most guarded calls finish long before their timeout, so on asyncio
ragguard keeps one timer wheel per event loop instead, after the hashed timing wheels of Varghese and
Lauck (1987): arming a timer is a dict insert into its 1 ms bucket, disarming a delete, and a single
loop timer, armed for the earliest live bucket, cancels the tasks whose bucket expired (see
:class:`Wheel`). Timers fire at most one bucket width (1 ms) late. On trio, a native CancelScope is
cheap and is used directly.

The API is two calls (the :class:`ragguard._clock.Timers` protocol, which :class:`~ragguard.FakeClock`
implements too)::

    handle = wheel.arm(task, timeout_s)     # cancel ``task`` in timeout_s seconds
    ...
    fired = wheel.disarm(handle)            # True: the timer cancelled the task
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ._compat import current_task, running_loop

T = TypeVar("T")

__all__ = ["MAX_TIMEOUT_S", "AttemptTimeout", "Wheel", "call_with_timeout", "wheel_for"]

MAX_TIMEOUT_S = 1e8
"""Timeouts at or above this many seconds (about three years) arm no timer: they never fire."""


class AttemptTimeout(TimeoutError):
    """Raised by :func:`call_with_timeout` when the awaitable ran past its timeout."""


_TICKS_PER_S = 1000  # bucket width: 1 ms
_SEQ_BITS = 20  # a handle is (tick << 20 | sequence): its bucket is found without a lookup table
_SEQ_MASK = (1 << _SEQ_BITS) - 1


class Wheel:
    """The attempt timers of one event loop.

    ``buckets`` maps a tick (``int(expiry_s * 1000) + 1``) to the timers expiring in it, as
    ``{handle: task}``; a handle carries its tick in its high bits. Buckets are created at most once
    per millisecond and stay until their tick is due or they are found empty when the loop timer
    is re-armed, so back-to-back calls do not create and drop a bucket each. One loop timer is armed
    for the earliest bucket; when it fires it cancels the tasks of the due buckets (their handles go
    into ``expired``, so :meth:`disarm` can tell a timeout from a foreign cancellation) and is
    re-armed for the next non-empty bucket: in steady traffic about one wake-up per timeout period.
    """

    __slots__ = (
        "_armed_tick",
        "_handle",
        "_heap",
        "_last_base",
        "_last_bucket",
        "_last_hi",
        "_last_lo",
        "_loop",
        "_sequence",
        "buckets",
        "expired",
        "now",
    )


    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.buckets: dict[int, dict[int, asyncio.Task[Any]]] = {}
        self.expired: set[int] = set()
        self._heap: list[int] = []
        self._handle: asyncio.TimerHandle | None = None
        self._armed_tick = math.inf
        self._sequence = 0
        # the bucket the last timer went into, and the times [lo, hi) that land in it: timers armed
        # microseconds apart share a bucket, and a float comparison is cheaper than int() of a float
        self._last_lo = self._last_hi = 0.0
        self._last_base = 0
        self._last_bucket: dict[int, asyncio.Task[Any]] = {}
        # asyncio's own loops tell time with time.monotonic; reading it directly skips a method frame
        self.now: Callable[[], float] = (
            time.monotonic if type(loop).time is asyncio.BaseEventLoop.time else loop.time
        )

    def arm(self, task: asyncio.Task[Any], timeout_s: float) -> int:
        """Cancel ``task`` in ``timeout_s`` seconds (at most 1 ms late) unless :meth:`disarm`-ed.

        ``timeout_s`` must be below :data:`MAX_TIMEOUT_S` (callers do not arm longer ones).
        Returns the timer's handle."""
        return self.arm_at(task, self.now() + timeout_s)

    def arm_at(self, task: asyncio.Task[Any], when_s: float) -> int:
        """Cancel ``task`` at time ``when_s`` of :attr:`now` (at most 1 ms late) unless
        :meth:`disarm`-ed: :meth:`arm` for a caller that has read the clock already."""
        if self._last_lo <= when_s < self._last_hi:
            bucket = self._last_bucket
            base = self._last_base
        else:
            tick = int(when_s * _TICKS_PER_S) + 1
            bucket = self.buckets.get(tick)  # type: ignore[assignment]
            if bucket is None:
                bucket = self._add_bucket(tick)
            # the range is kept strictly inside the tick's, so a time near its edge (where float
            # rounding could disagree) takes the path above instead: a timer never fires early
            self._last_lo = (tick - 1) / _TICKS_PER_S + 1e-9
            self._last_hi = tick / _TICKS_PER_S - 1e-9
            self._last_bucket = bucket
            self._last_base = base = tick << _SEQ_BITS
        self._sequence = sequence = (self._sequence + 1) & _SEQ_MASK
        handle = base | sequence
        bucket[handle] = task
        return handle

    def disarm(self, handle: int) -> bool:
        """Stop timer ``handle``; True when it had already fired (it cancelled its task)."""
        bucket = self.buckets.get(handle >> _SEQ_BITS)
        if bucket is not None and bucket.pop(handle, None) is not None:
            return False
        expired = self.expired
        if handle in expired:
            expired.discard(handle)
            return True
        return False

    def _add_bucket(self, tick: int) -> dict[int, asyncio.Task[Any]]:
        bucket: dict[int, asyncio.Task[Any]] = {}
        self.buckets[tick] = bucket
        heapq.heappush(self._heap, tick)
        if tick < self._armed_tick:
            self._arm_loop_timer(tick)
        return bucket

    def _arm_loop_timer(self, tick: int) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed_tick = tick
        self._handle = self._loop.call_at(tick / _TICKS_PER_S, self._fire)

    def _fire(self) -> None:
        self._last_lo = self._last_hi = 0.0  # the cached bucket may be gone after this
        self._handle = None
        self._armed_tick = math.inf
        now_tick = int(self._loop.time() * _TICKS_PER_S)
        heap, buckets = self._heap, self.buckets
        while heap and heap[0] <= now_tick:
            bucket = buckets.pop(heapq.heappop(heap), None)
            if bucket:
                for handle, task in list(bucket.items()):
                    self.expired.add(handle)
                    task.cancel()
        while heap and not buckets.get(heap[0]):
            buckets.pop(heapq.heappop(heap), None)
        if heap:
            self._arm_loop_timer(heap[0])


_last_loop: asyncio.AbstractEventLoop | None = None
_last_wheel: Wheel | None = None
_wheels: dict[int, tuple[asyncio.AbstractEventLoop, Wheel]] = {}


def wheel_for(loop: asyncio.AbstractEventLoop) -> Wheel:
    """The timer wheel of ``loop`` (created on first use)."""
    global _last_loop, _last_wheel
    if loop is _last_loop and _last_wheel is not None:
        return _last_wheel
    found = _wheels.get(id(loop))
    if found is None or found[0] is not loop:
        if len(_wheels) > 64:
            for key, (old, _) in list(_wheels.items()):
                if old.is_closed():
                    del _wheels[key]
        found = (loop, Wheel(loop))
        _wheels[id(loop)] = found
    _last_loop, _last_wheel = loop, found[1]
    return found[1]


async def call_with_timeout(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    """Await ``awaitable``, raising :class:`AttemptTimeout` (a TimeoutError) if it takes longer
    than ``timeout_s`` seconds.

    None means no timeout. A cancellation that did not come from this timeout propagates unchanged.
    Works under asyncio (and uvloop) and trio.
    """
    if timeout_s is None or timeout_s >= MAX_TIMEOUT_S:
        return await awaitable
    loop = running_loop()
    if loop is None:
        return await _trio_timeout(awaitable, timeout_s)
    task = current_task(loop)
    if task is None:  # pragma: no cover - awaited outside a task
        try:
            async with asyncio.timeout(timeout_s):
                return await awaitable
        except TimeoutError:
            raise AttemptTimeout(f"attempt timed out after {timeout_s:.3f}s") from None
    wheel = wheel_for(loop)
    handle = wheel.arm(task, timeout_s)
    try:
        result = await awaitable
    except asyncio.CancelledError:
        if wheel.disarm(handle) and task.uncancel() == 0:
            raise AttemptTimeout(f"attempt timed out after {timeout_s:.3f}s") from None
        raise
    except BaseException:
        # however the awaitable ended, its timer must not outlive it (it would cancel the task
        # later, in the middle of something else); one that fired while the awaitable turned the
        # cancellation into another error has its cancellation request taken back
        if wheel.disarm(handle):
            task.uncancel()
        raise
    if wheel.disarm(handle):
        task.uncancel()  # fired as the awaitable finished: its cancellation was never delivered
    return result


async def _trio_timeout(awaitable: Awaitable[T], timeout_s: float) -> T:
    import trio

    with trio.move_on_after(timeout_s) as scope:
        return await awaitable
    if scope.cancelled_caught:
        raise AttemptTimeout(f"attempt timed out after {timeout_s:.3f}s")
    raise AssertionError("unreachable")  # pragma: no cover
