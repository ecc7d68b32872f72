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

:class:`FakeClock` has all three (and ``call_later`` for callbacks), so a test advances one clock
and every wait and timer of the Guard follows it, without sleeping; it is a discrete-event clock,
whose concurrent sleepers wake in time order by themselves (see its docstring).
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import math
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = ["Clock", "FakeClock", "FakeTimer", "Timers", "monotonic", "move_on_after", "sleep_of", "timers_of"]

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
    """A discrete-event clock for tests: ``clock()`` returns the current time in seconds, and time
    moves only when the test says so or when every task is waiting.

    What waits on it:

    - ``await clock.sleep(s)``: a *sleeper*, due ``s`` seconds from now;
    - timers: :meth:`arm` (cancel a task: attempt timeouts, queue waits) and :meth:`call_later`
      (run a callback: a hedge's start), due at their own times.

    How time moves (``auto_advance=True``, the default, what :func:`ragguard.testing.fresh_guard`
    and the pytest ``guard`` fixture use): while at least one task sleeps on the clock and no task
    can run (every task waits: on the clock, on an event, on I/O), the clock jumps to the next due
    event (a sleeper or a timer, whichever comes first), wakes or fires everything due then, lets
    the woken tasks run until all wait again, and repeats. So concurrent sleepers wake in time
    order, each reading its own due time: ten ``sleep(0.1)`` and one ``sleep(0.5)`` started together
    wake at 0.1 (all ten) and 0.5. A timer alone never moves time (an attempt timeout around a call
    that waits on real I/O does not fire early); it fires when time passes it.

    How a test drives it:

    - do nothing (auto-advance): code that sleeps on the clock, a retry's backoff, a rate wait, a
      paced stream, lets its time pass by itself, in order with every other sleeper and timer;
    - ``clock.advance(s)``: move time forward at once; every sleeper and timer due by then wakes or
      fires (timers in time order); the woken tasks run when the test next awaits (and read the
      new time). With ``auto_advance=False`` this is the only way time moves;
    - ``await clock.run_for(s)``: move time forward by ``s`` through each event in turn, letting
      the woken tasks run until all wait again before the next one (a manual clock's discrete-event
      step);
    - ``await clock.settle()``: let every task run until all wait, without moving time.

    "No task can run" is read from the asyncio loop's ready queue (two looks in a row, with an I/O
    poll between them), on trio from ``trio.testing.wait_all_tasks_blocked``. A task that never
    waits (a loop of ``sleep(0)``) keeps time still. One event loop at a time per clock. Timers
    that cancel a task need asyncio (trio tasks have no ``cancel``: on trio, attempt timeouts run
    on trio's own clock); ``sleep``, ``call_later`` and the auto-advance work on both.

    >>> clock = FakeClock()
    >>> clock.advance(2.5)
    >>> clock()
    2.5
    """

    __slots__ = ("__weakref__", "_armed", "_driver", "_fired", "_heap", "_numbers", "_sleeping", "_waiting",
                 "auto_advance", "now")

    def __init__(self, start: float = 0.0, *, auto_advance: bool = True) -> None:
        self.now = float(start)
        self.auto_advance = auto_advance
        self._numbers = itertools.count(1)
        self._heap: list[tuple[float, int, _Event]] = []  # sleepers and timers, by (due, number)
        self._armed: dict[int, _Event] = {}  # handle -> pending timer
        self._fired: set[int] = set()  # handles of task timers that fired and were not disarmed yet
        self._sleeping = 0  # sleepers not yet woken or abandoned
        self._waiting: list[Any] = []  # settle() futures (asyncio) to resolve when all tasks wait
        self._driver: Any = None  # the loop (asyncio) or trio token whose watcher moves the time

    def __call__(self) -> float:
        return self.now

    # -- moving time -------------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0) at once: wake the sleepers and fire the timers
        due by then (timers in time order, each with the clock at its own time). Raises ValueError
        when negative. Woken tasks run when the caller next awaits, and read the new time."""
        if not seconds >= 0:
            raise ValueError(f"FakeClock.advance: seconds must be >= 0, got {seconds}")
        self._advance_to(self.now + seconds)

    async def run_for(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0) through each sleeper and timer due on the way,
        in time order: at each, the woken tasks run until every task waits again before the next.
        Raises ValueError when negative."""
        if not seconds >= 0:
            raise ValueError(f"FakeClock.run_for: seconds must be >= 0, got {seconds}")
        end = self.now + seconds
        await self.settle()
        while True:
            due = self._next_due()
            if due is None or due > end:
                break
            self._advance_to(due)
            await self.settle()
        self._advance_to(end)
        await self.settle()

    async def settle(self) -> None:
        """Return once every other task waits (none can run), without moving time itself (an
        auto-advancing clock may still move for its sleepers meanwhile)."""
        loop = _asyncio_loop()
        if loop is None:
            from trio.testing import wait_all_tasks_blocked

            await wait_all_tasks_blocked()
            return
        waiter = loop.create_future()
        self._waiting.append(waiter)
        _watcher(loop).add(self)
        await waiter

    def _advance_to(self, t: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= t:
            due, _, event = heapq.heappop(heap)
            if event.state != _PENDING:
                continue
            if due > self.now:
                self.now = due
            self._fire(event)
        if t > self.now:
            self.now = t

    def _next_due(self) -> float | None:
        """When the next pending sleeper or timer is due (None: nothing is, or only at infinity)."""
        heap = self._heap
        while heap and heap[0][2].state != _PENDING:
            heapq.heappop(heap)
        if not heap or not math.isfinite(heap[0][0]):
            return None
        return heap[0][0]

    def _jump(self) -> bool:
        """Auto-advance: move to the next due event while a task sleeps; False when there is none."""
        if not self._sleeping:
            return False
        due = self._next_due()
        if due is None:
            return False
        self._advance_to(due)
        return True

    def _fire(self, event: _Event) -> None:
        event.state = _DONE
        kind = event.kind
        if kind == _SLEEPER:
            self._sleeping -= 1
            try:
                event.target.set()
            except RuntimeError:  # pragma: no cover - a sleeper of an event loop that is closed
                pass
            return
        handle = event.number
        self._armed.pop(handle, None)
        if kind == _CANCEL:
            self._fired.add(handle)
            event.target.cancel()
            return
        try:
            event.context.run(event.target, *event.args)
        except Exception as exc:  # a failing callback never stops the clock
            _report(exc, event.target)

    # -- waiting -----------------------------------------------------------------------------------

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock reaches ``seconds`` from now (see the class docstring); always a
        checkpoint. ``seconds`` <= 0 (or NaN) only checkpoints; ``inf`` waits until cancelled."""
        if not seconds > 0:
            import anyio.lowlevel

            await anyio.lowlevel.checkpoint()
            return
        import anyio

        event = _Event(_SLEEPER, next(self._numbers), anyio.Event())
        heapq.heappush(self._heap, (self.now + seconds, event.number, event))
        self._sleeping += 1
        if self.auto_advance:
            self._drive()
        try:
            await event.target.wait()
        finally:
            if event.state == _PENDING:  # cancelled before its time: forget it
                event.state = _DROPPED
                self._sleeping -= 1

    def arm(self, task: Any, timeout_s: float) -> int:
        """Cancel ``task`` (an asyncio task) once the clock passes ``timeout_s`` from now; returns
        a handle for :meth:`disarm`."""
        return self._schedule(timeout_s, _CANCEL, task, (), None)

    def disarm(self, handle: int) -> bool:
        """Stop timer ``handle``; True when it had fired (its task was cancelled by it)."""
        event = self._armed.pop(handle, None)
        if event is not None:
            event.state = _DROPPED
            return False
        if handle in self._fired:
            self._fired.discard(handle)
            return True
        return False

    def call_later(self, seconds: float, callback: Callable[..., Any], *args: Any) -> FakeTimer:
        """Run ``callback(*args)`` once the clock passes ``seconds`` from now, in the context of
        this call (as ``loop.call_later`` does); returns a handle with ``cancel()``. A callback that
        raises is reported to the event loop's exception handler."""
        return FakeTimer(self, self._schedule(seconds, _CALL, callback, args, contextvars.copy_context()))

    def _schedule(self, seconds: float, kind: int, target: Any, args: tuple[Any, ...], context: Any) -> int:
        event = _Event(kind, next(self._numbers), target, args, context)
        self._armed[event.number] = event
        heapq.heappush(self._heap, (self.now + seconds, event.number, event))
        if self._sleeping and self.auto_advance:
            self._drive()
        return event.number

    def _drive(self) -> None:
        """Make sure something moves the time when every task waits (auto-advance)."""
        loop = _asyncio_loop()
        if loop is not None:
            self._driver = loop
            _watcher(loop).add(self)  # idempotent; the watcher drops a clock once it wants nothing
            return
        import trio

        token = trio.lowlevel.current_trio_token()
        if self._driver is not token:
            self._driver = token
            trio.lowlevel.spawn_system_task(self._drive_trio, token)

    async def _drive_trio(self, token: Any) -> None:
        from trio.testing import wait_all_tasks_blocked

        try:
            while self._driver is token:
                await wait_all_tasks_blocked()
                if self._driver is not token or not self._jump():
                    break
        finally:
            if self._driver is token:
                self._driver = None

    def _serve(self, loop: Any) -> int:
        """The loop's watcher found every task waiting: release the settle() waiters (1), else
        auto-advance to the next event (1), else nothing left to do here (0)."""
        if self._waiting:
            waiting, self._waiting = self._waiting, []
            for waiter in waiting:
                if not waiter.done():
                    waiter.set_result(None)
            return 1
        if self._driver is loop and self.auto_advance and self._jump():
            return 1
        if self._driver is loop:
            self._driver = None
        return 0

    def _wants(self, loop: Any) -> bool:
        return bool(self._waiting) or (self._driver is loop and self._sleeping > 0)

    # -- inspection --------------------------------------------------------------------------------

    @property
    def sleepers(self) -> int:
        """How many ``sleep`` calls are waiting for the clock to move."""
        return self._sleeping

    @property
    def next_due(self) -> float | None:
        """The clock time of the next sleeper or timer due, None when nothing waits on the clock."""
        return self._next_due()

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now})"


class FakeTimer:
    """A callback scheduled with :meth:`FakeClock.call_later`: ``cancel()`` stops it."""

    __slots__ = ("_clock", "handle")

    def __init__(self, clock: FakeClock, handle: int) -> None:
        self._clock = clock
        self.handle = handle

    def cancel(self) -> None:
        self._clock.disarm(self.handle)


_PENDING, _DONE, _DROPPED = 0, 1, 2
_SLEEPER, _CANCEL, _CALL = 0, 1, 2


class _Event:
    """One thing due on a FakeClock: a sleeper (``target`` its anyio Event), a task timer
    (``target`` the task to cancel) or a callback timer."""

    __slots__ = ("args", "context", "kind", "number", "state", "target")

    def __init__(
        self, kind: int, number: int, target: Any, args: tuple[Any, ...] = (), context: Any = None
    ) -> None:
        self.kind = kind
        self.number = number
        self.target = target
        self.args = args
        self.context = context
        self.state = _PENDING


def _asyncio_loop() -> Any:
    from ._compat import running_loop

    return running_loop()


def _report(exc: Exception, callback: Any) -> None:
    loop = _asyncio_loop()
    if loop is not None:
        loop.call_exception_handler(
            {"message": f"FakeClock callback {callback!r} failed", "exception": exc}
        )
        return
    import traceback

    traceback.print_exception(exc)  # pragma: no cover - trio has no loop exception handler


_IDLE_LOOKS = 2  # a loop found with nothing ready twice in a row, with an I/O poll between the looks
_BLIND_LOOKS = 16  # a loop whose ready queue cannot be read (uvloop): this many rounds instead


class _Watcher:
    """One per asyncio loop: a callback that re-queues itself behind everything ready and, when it
    finds nothing else ready (every task waits), serves one FakeClock that wants it (its settle()
    waiters first, else its auto-advance), in turn, so two clocks on one loop never keep each
    other from being idle."""

    __slots__ = ("clocks", "looks", "loop", "queued")

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.clocks: list[weakref.ref[FakeClock]] = []
        self.looks = 0
        self.queued = False

    def add(self, clock: FakeClock) -> None:
        if not any(ref() is clock for ref in self.clocks):
            self.clocks.append(weakref.ref(clock))
        if not self.queued:
            self.queued = True
            self.looks = 0
            self.loop.call_soon(self.tick)

    def tick(self) -> None:
        loop = self.loop
        self.clocks = [ref for ref in self.clocks if (c := ref()) is not None and c._wants(loop)]
        if not self.clocks:
            self.queued = False
            return
        ready = getattr(loop, "_ready", None)  # CPython's asyncio: the callbacks ready to run
        if ready is None:
            self.looks += 1
            quiet = self.looks >= _BLIND_LOOKS
        elif len(ready):
            self.looks = 0
            quiet = False
        else:
            self.looks += 1
            quiet = self.looks >= _IDLE_LOOKS
        if quiet:
            self.looks = 0
            for i, ref in enumerate(self.clocks):
                clock = ref()
                if clock is not None and clock._serve(loop):
                    self.clocks.append(self.clocks.pop(i))  # the next one goes first next time
                    break
        loop.call_soon(self.tick)


_watchers: weakref.WeakKeyDictionary[Any, _Watcher] = weakref.WeakKeyDictionary()


def _watcher(loop: Any) -> _Watcher:
    w = _watchers.get(loop)
    if w is None:
        w = _watchers[loop] = _Watcher(loop)
    return w


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
