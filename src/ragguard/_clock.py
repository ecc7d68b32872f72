"""Time as a parameter: one time source per :class:`~ragguard.Guard`.

A *clock* is a callable returning monotonic seconds as a float. Production uses
:func:`time.monotonic`; tests use :class:`FakeClock` and advance it. A Guard's clock drives its
breakers, quotas, deadlines, retry budgets and backoff, and its attempt timeouts, the way Polly v8's
``TimeProvider`` drives a whole resilience pipeline:

- reading the time: ``clock()``;
- waiting: ``await sleep(seconds)`` (:func:`sleep_of`: the clock's own ``sleep`` when it has one,
  else ``anyio.sleep``);
- attempt timers: ``arm(task, timeout_s) -> handle`` cancels ``task`` when the time is up,
  ``disarm(handle) -> fired`` (:func:`timers_of`: the clock's own when it has them, else the event
  loop's timer wheel in :mod:`ragguard._timeouts`);
- bounded waits: ``with move_on_after(clock, seconds) as scope:`` (anyio's, on the clock).

:class:`FakeClock` has all three, so a test advances one clock and every wait and timer of the
Guard follows it, without sleeping.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = ["Clock", "FakeClock", "Timers", "monotonic", "move_on_after", "sleep_of", "timers_of"]

Clock = Callable[[], float]
monotonic: Clock = time.monotonic


class Timers(Protocol):
    """Attempt timers: cancel a task when its time is up (see :class:`ragguard._timeouts.Wheel`)."""

    def arm(self, task: Any, timeout_s: float) -> int:
        """Cancel ``task`` in ``timeout_s`` seconds unless disarmed first; returns a handle."""
        ...

    def disarm(self, handle: int) -> bool:
        """Stop the timer ``handle``; True when it had already fired (the task was cancelled)."""
        ...


class FakeClock:
    """A manual monotonic clock for tests: ``clock()`` returns the current time in seconds.

    ``await clock.sleep(s)`` lets ``s`` seconds pass: by default it advances the clock itself (time
    passes at once for code that waits, as in a discrete-event simulation: a retry's backoff, a
    rate limit's wait); with ``auto_advance=False`` it returns once the test has advanced the clock
    by ``s``. Timers armed with :meth:`arm` (attempt timeouts) cancel their task when the clock
    passes them, whoever advances it. Timers need asyncio (trio tasks have no ``cancel``: on trio,
    attempt timeouts run on trio's own clock).

    >>> clock = FakeClock()
    >>> clock.advance(2.5)
    >>> clock()
    2.5
    """

    __slots__ = ("_armed", "_fired", "_numbers", "_sleepers", "auto_advance", "now")

    def __init__(self, start: float = 0.0, *, auto_advance: bool = True) -> None:
        self.now = float(start)
        self.auto_advance = auto_advance
        self._numbers = itertools.count(1)
        self._sleepers: list[tuple[float, int, Any]] = []  # heap of (due, number, event)
        self._armed: dict[int, tuple[float, Any]] = {}  # handle -> (due, task)
        self._fired: set[int] = set()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0): wake the sleepers and fire the timers that are
        due. Raises ValueError when negative. Woken tasks run when the caller next awaits."""
        if not seconds >= 0:
            raise ValueError(f"FakeClock.advance: seconds must be >= 0, got {seconds}")
        self.now += seconds
        now = self.now
        sleepers = self._sleepers
        while sleepers and sleepers[0][0] <= now:
            heapq.heappop(sleepers)[2].set()
        for handle, (due, task) in list(self._armed.items()):
            if due <= now:
                del self._armed[handle]
                self._fired.add(handle)
                task.cancel()

    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass on this clock (see the class docstring); always a checkpoint."""
        import anyio.lowlevel

        if seconds <= 0 or self.auto_advance:
            if seconds > 0:
                self.advance(seconds)
            await anyio.lowlevel.checkpoint()
            return
        event = anyio.Event()
        heapq.heappush(self._sleepers, (self.now + seconds, next(self._numbers), event))
        await event.wait()

    def arm(self, task: Any, timeout_s: float) -> int:
        """Cancel ``task`` once the clock passes ``timeout_s`` from now; returns a handle."""
        handle = next(self._numbers)
        self._armed[handle] = (self.now + timeout_s, task)
        return handle

    def disarm(self, handle: int) -> bool:
        """Stop timer ``handle``; True when it had fired (its task was cancelled by it)."""
        if self._armed.pop(handle, None) is not None:
            return False
        if handle in self._fired:
            self._fired.discard(handle)
            return True
        return False

    @property
    def sleepers(self) -> int:
        """How many ``sleep`` calls are waiting for the clock to move."""
        return len(self._sleepers)

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now})"


def sleep_of(clock: Clock) -> Callable[[float], Awaitable[Any]]:
    """How to wait ``seconds`` on ``clock``: its own ``sleep`` when it has one, else ``anyio.sleep``."""
    own = getattr(clock, "sleep", None)
    if callable(own):
        return own  # type: ignore[no-any-return]
    import anyio

    return anyio.sleep


def timers_of(clock: Clock) -> Timers | None:
    """``clock`` itself when it has attempt timers (``arm``/``disarm``), else None (use the loop's)."""
    if callable(getattr(clock, "arm", None)) and callable(getattr(clock, "disarm", None)):
        return clock  # type: ignore[return-value]
    return None


class _FakeMoveOnAfter:
    """``anyio.move_on_after`` on a clock with timers (a FakeClock), for one asyncio task."""

    __slots__ = ("_handle", "_seconds", "_task", "_timers", "cancelled_caught")

    def __init__(self, timers: Timers, seconds: float) -> None:
        self._timers = timers
        self._seconds = seconds
        self._task: Any = None
        self._handle = 0
        self.cancelled_caught = False

    def __enter__(self) -> _FakeMoveOnAfter:
        import asyncio

        self._task = asyncio.current_task()
        self._handle = self._timers.arm(self._task, self._seconds)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        import asyncio

        if not self._timers.disarm(self._handle):
            return False
        # the timer fired: its cancellation was ours unless somebody else cancelled the task too
        if self._task.uncancel() == 0 and isinstance(exc, asyncio.CancelledError):
            self.cancelled_caught = True
            return True
        return False


def move_on_after(clock: Clock, seconds: float) -> Any:
    """``with move_on_after(clock, s) as scope:`` stop waiting after ``s`` seconds of ``clock``
    (``scope.cancelled_caught`` tells whether the time ran out), like ``anyio.move_on_after``.

    On a clock with timers (a FakeClock) under asyncio, the clock's timers end the wait, so a test
    advancing the clock times it out; otherwise it is ``anyio.move_on_after`` (the event loop's
    time)."""
    timers = timers_of(clock)
    if timers is not None:
        from ._compat import running_loop

        if running_loop() is not None:
            return _FakeMoveOnAfter(timers, seconds)
    import anyio

    return anyio.move_on_after(seconds)
