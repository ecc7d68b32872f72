"""The attempt timeout: each attempt (each item, for a stream) gets min(stage timeout, deadline left).

A gate of item scope. On entry it computes the attempt's budget, refuses to start an attempt with
less than ``min_attempt_s`` left (:class:`~ragguard.DeadlineExceeded`), and arms a timer for the
running task: the Guard clock's own timers when it has them (:class:`~ragguard.FakeClock`), else the
event loop's timer wheel (:mod:`ragguard._timeouts`); on trio a native cancel scope. On exit a
timer that fired turns the cancellation into :class:`~ragguard.StageTimeout` (the stage's own
``timeout_s`` ran out: the dependency was slow) or :class:`~ragguard.DeadlineExceeded` (the
caller's budget ran out).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, ClassVar

from .._clock import Timers, timers_of
from .._compat import current_task, running_loop
from .._deadline import current_expiry
from .._errors import DeadlineExceeded, StageTimeout
from .._timeouts import MAX_TIMEOUT_S, AttemptTimeout, wheel_for
from ..pipeline import NO_EXIT, Call, Scope

if TYPE_CHECKING:
    from ._shapes import Bound, Stage

__all__ = ["TimeoutLayer", "build"]


class TimeoutLayer:
    """Bounds each attempt by ``timeout_s`` (None: only the deadline) and the request's deadline."""

    scope: ClassVar[Scope] = "item"
    __slots__ = ("_loop", "_min_left", "_timers", "_wheel", "stage", "timeout_s")

    def __init__(
        self, stage: str, timeout_s: float | None, min_attempt_s: float, timers: Timers | None
    ) -> None:
        self.stage = stage
        self.timeout_s = timeout_s
        self._min_left = min_attempt_s
        self._timers = timers  # the Guard clock's own (a FakeClock's), else the loop's wheel:
        self._loop: Any = None  # the loop whose wheel ``_wheel`` is (the last one seen)
        self._wheel: Any = None

    def _wheel_of(self, loop: Any) -> Any:
        self._wheel = wheel = wheel_for(loop)
        self._loop = loop
        return wheel

    def enter(self, call: Call) -> Any:
        timeout = self.timeout_s
        expiry = current_expiry()
        if expiry is None:
            if timeout is None or timeout >= MAX_TIMEOUT_S:
                return NO_EXIT  # no timer to arm
            by_deadline = False
        else:
            left = expiry.at - expiry.clock()  # expiry.left(), inlined: once per attempt
            if left <= 0.0 or left < self._min_left:  # exactly min_attempt_s left may still start
                whole, by = expiry.budget_s, expiry.set_by
                if call.items:  # mid-stream: the stream ran under the request's budget
                    cut = f"stream cut after {call.items} items"
                    raise DeadlineExceeded(self.stage, whole, cut, whole, set_by=by)
                budget = None if left <= 0.0 else left
                raise DeadlineExceeded(self.stage, budget, "no budget left for an attempt", whole, set_by=by)
            if timeout is None or left < timeout:
                timeout, by_deadline = left, True
            else:
                by_deadline = False
            if timeout >= MAX_TIMEOUT_S:
                return NO_EXIT
        call.budget_s = timeout
        call.by_deadline = by_deadline
        loop = running_loop()  # the one running-loop lookup of a call
        if loop is None:
            return _trio_scope(timeout)
        call.task = task = current_task(loop)
        if task is None:  # pragma: no cover - awaited outside a task: nothing to cancel
            return NO_EXIT
        timers = self._timers
        if timers is not None:
            return timers.arm(task, timeout)
        wheel = self._wheel if loop is self._loop else self._wheel_of(loop)
        if expiry is None or expiry.clock is not wheel.now:
            return wheel.arm(task, timeout)
        # the deadline's clock is the wheel's: no second clock read (the attempt ends its budget
        # before the deadline, or at it when the deadline is what bounds it)
        return wheel.arm_at(task, expiry.at - (left - timeout))

    async def enter_async(self, call: Call) -> Any:  # pragma: no cover - enter never waits
        return self.enter(call)

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        if type(token) is not int:
            return self._exit_trio(call, token, exc)
        # a Guard serves one event loop at a time, so the wheel enter used is ``_wheel``
        timers = self._timers
        if not (self._wheel if timers is None else timers).disarm(token):
            return None  # disarmed before it fired
        # the timer fired: take its cancellation request back; it was a timeout only if the call
        # ended cancelled and nobody else asked to cancel the task too
        outside = call.task.uncancel() > 0
        if isinstance(exc, asyncio.CancelledError) and not outside:
            return self._timed_out(call)
        return None

    def _exit_trio(self, call: Call, scope: Any, exc: BaseException | None) -> BaseException | None:
        scope.__exit__(type(exc) if exc is not None else None, exc, None)
        if exc is not None and scope.cancelled_caught:
            return self._timed_out(call)  # the scope caught its own cancellation
        return None

    def _timed_out(self, call: Call) -> BaseException:
        budget = call.budget_s if call.budget_s is not None else 0.0
        error: BaseException
        if call.by_deadline:
            expiry = current_expiry()
            whole, by = (None, None) if expiry is None else (expiry.budget_s, expiry.set_by)
            if call.items:  # mid-stream: the stream ran under the request's budget, not this item's
                detail, given = f"stream cut after {call.items} items", whole
            else:
                detail, given = "", budget
            error = DeadlineExceeded(self.stage, given, detail, whole, set_by=by)
            error.__cause__ = AttemptTimeout(f"attempt timed out after {budget:.3f}s")
        else:
            error = StageTimeout(self.stage, budget)
            error.__suppress_context__ = True  # the cancellation that stopped the call is ours
        return error


def _trio_scope(timeout_s: float) -> Any:
    import trio

    scope = trio.CancelScope(deadline=trio.current_time() + timeout_s)
    scope.__enter__()
    return scope


def build(stage: Stage, bound: Bound) -> TimeoutLayer | None:
    """The stage's timeout layer; every stage has one (a deadline bounds even an untimed stage)."""
    policy = stage.policy
    return TimeoutLayer(stage.name, policy.timeout_s, max(policy.min_attempt_s, 0.0), timers_of(stage.clock))
