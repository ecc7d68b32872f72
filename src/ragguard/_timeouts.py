"""Attempt timeouts that cost almost nothing when the call finishes in time.

``asyncio.timeout`` schedules and cancels one TimerHandle per call (about 4 µs here, more than a
whole guarded call should cost). Most guarded calls finish long before their timeout, so on asyncio
ragguard keeps one timer wheel per event loop instead, after the hashed timing wheels of Varghese and
Lauck (1987): a call registers its expiry in a 1 ms bucket (a dict insert), unregisters on exit (a
delete), and a single loop timer, armed for the earliest live bucket, cancels the tasks whose bucket
expired. Timeouts fire at most one bucket width (1 ms) late. On trio, a native CancelScope is cheap
and is used directly.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["AttemptTimeout", "call_with_timeout"]


class AttemptTimeout(TimeoutError):
    """An attempt ran past its timeout (a TimeoutError, so breakers classify it as one)."""

_RESOLUTION_S = 0.001


class _Entry:
    __slots__ = ("expired", "task", "tick")

    def __init__(self, task: asyncio.Task[Any], tick: int) -> None:
        self.task = task
        self.tick = tick
        self.expired = False


class _Wheel:
    __slots__ = ("_armed_tick", "_buckets", "_handle", "_heap", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buckets: dict[int, dict[_Entry, None]] = {}
        self._heap: list[int] = []
        self._handle: asyncio.TimerHandle | None = None
        self._armed_tick = math.inf

    def register(self, task: asyncio.Task[Any], expires_at: float) -> _Entry:
        tick = math.ceil(expires_at / _RESOLUTION_S)
        entry = _Entry(task, tick)
        bucket = self._buckets.get(tick)
        if bucket is None:
            bucket = self._buckets[tick] = {}
            heapq.heappush(self._heap, tick)
            if tick < self._armed_tick:
                self._arm(tick)
        bucket[entry] = None
        return entry

    def unregister(self, entry: _Entry) -> None:
        bucket = self._buckets.get(entry.tick)
        if bucket is not None:
            bucket.pop(entry, None)
            if not bucket:
                del self._buckets[entry.tick]

    def _arm(self, tick: int) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed_tick = tick
        self._handle = self._loop.call_at(tick * _RESOLUTION_S, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._armed_tick = math.inf
        now_tick = math.floor(self._loop.time() / _RESOLUTION_S)
        heap, buckets = self._heap, self._buckets
        while heap and heap[0] <= now_tick:
            bucket = buckets.pop(heapq.heappop(heap), None)
            if bucket:
                for entry in bucket:
                    entry.expired = True
                    entry.task.cancel()
        while heap and heap[0] not in buckets:
            heapq.heappop(heap)
        if heap:
            self._arm(heap[0])


_last_loop: asyncio.AbstractEventLoop | None = None
_last_wheel: _Wheel | None = None
_wheels: dict[int, tuple[asyncio.AbstractEventLoop, _Wheel]] = {}


def _wheel_for(loop: asyncio.AbstractEventLoop) -> _Wheel:
    global _last_loop, _last_wheel
    if loop is _last_loop and _last_wheel is not None:
        return _last_wheel
    found = _wheels.get(id(loop))
    if found is None or found[0] is not loop:
        if len(_wheels) > 64:
            for key, (old, _) in list(_wheels.items()):
                if old.is_closed():
                    del _wheels[key]
        found = (loop, _Wheel(loop))
        _wheels[id(loop)] = found
    _last_loop, _last_wheel = loop, found[1]
    return found[1]


async def call_with_timeout(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    """Await ``awaitable``, raising TimeoutError if it takes longer than ``timeout_s`` seconds.

    None means no timeout. A cancellation that did not come from this timeout propagates unchanged.
    Works under asyncio (and uvloop) and trio.
    """
    if timeout_s is None:
        return await awaitable
    loop = asyncio._get_running_loop()
    if loop is None:
        return await _trio_timeout(awaitable, timeout_s)
    task = asyncio.current_task(loop)
    if task is None:  # pragma: no cover - awaited outside a task
        try:
            async with asyncio.timeout(timeout_s):
                return await awaitable
        except TimeoutError:
            raise AttemptTimeout(f"attempt timed out after {timeout_s:.3f}s") from None
    wheel = _wheel_for(loop)
    entry = wheel.register(task, loop.time() + timeout_s)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if entry.expired and task.uncancel() == 0:
            raise AttemptTimeout(f"attempt timed out after {timeout_s:.3f}s") from None
        raise
    finally:
        wheel.unregister(entry)


async def _trio_timeout(awaitable: Awaitable[T], timeout_s: float) -> T:
    import trio

    with trio.move_on_after(timeout_s) as scope:
        return await awaitable
    if scope.cancelled_caught:
        raise AttemptTimeout(f"attempt timed out after {timeout_s:.3f}s")
    raise AssertionError("unreachable")  # pragma: no cover
