"""The request's deadline around a whole handler, for the front doors.

A guarded stage stops at the deadline; a handler that does unguarded work (parsing, a plain
``httpx`` call, CPU) would otherwise run on. ``with handler_deadline(expiry): ...`` cancels the
task running the block when the deadline passes and raises :class:`~ragguard.DeadlineExceeded`
in its place (the doors answer 504 / ``DEADLINE_EXCEEDED``). On asyncio it is one timer of the
loop's wheel (``_timeouts``), or of the deadline's own clock when that clock has timers (a
:class:`~ragguard.FakeClock`); under trio a cancel scope.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from ._clock import Timers, move_on_after, timers_of
from ._compat import current_task, running_loop
from ._deadline import Expiry
from ._errors import DeadlineExceeded
from ._timeouts import wheel_for

__all__ = ["handler_deadline"]

_PAST = "the handler ran past the request's deadline"


class handler_deadline:
    """Bound the enclosed block by ``expiry`` (see the module docstring); ``stage`` names it in
    the :class:`~ragguard.DeadlineExceeded` raised."""

    __slots__ = ("_budget", "_expiry", "_handle", "_scope", "_stage", "_task", "_timers")

    def __init__(self, expiry: Expiry, stage: str = "request") -> None:
        self._expiry = expiry
        self._stage = stage
        self._budget = 0.0
        self._scope: Any = None
        self._task: asyncio.Task[Any] | None = None
        self._timers: Timers | None = None
        self._handle = 0

    def __enter__(self) -> handler_deadline:
        budget = self._budget = self._expiry.left()
        if budget <= 0.0:
            raise self._exceeded(None, "no time left for the handler")
        loop = running_loop()
        task = None if loop is None else current_task(loop)
        if task is None:  # trio (or no task): a cancel scope on the deadline's clock
            self._scope = move_on_after(self._expiry.clock, budget)
            self._scope.__enter__()
            return self
        self._task = task
        timers = self._timers = timers_of(self._expiry.clock) or wheel_for(loop)  # type: ignore[arg-type]
        self._handle = timers.arm(task, budget)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        scope = self._scope
        if scope is not None:
            swallowed = bool(scope.__exit__(exc_type, exc, tb))
            if scope.cancelled_caught:
                raise self._exceeded(self._budget, _PAST) from None
            return swallowed
        task, timers = self._task, self._timers
        if task is None or timers is None or not timers.disarm(self._handle):
            return False
        if isinstance(exc, asyncio.CancelledError):
            if task.uncancel() == 0:
                raise self._exceeded(self._budget, _PAST) from None
            return False  # somebody else cancelled the task too: theirs goes on
        task.uncancel()  # fired as the block ended: its cancellation was never delivered
        return False

    def _exceeded(self, budget_s: float | None, detail: str) -> DeadlineExceeded:
        expiry = self._expiry
        return DeadlineExceeded(self._stage, budget_s, detail, expiry.budget_s, set_by=expiry.set_by)
