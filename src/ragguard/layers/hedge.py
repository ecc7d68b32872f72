"""Hedged requests: a second attempt after about the stage's P95, the first success wins.

A wrapper inside the retries, around each attempt (and outside the adaptive limit, the breaker and
the attempt timer, so each leg takes its own slot, permit and timer). For each call:

- while fewer than ``min_samples`` latencies are known, the attempt simply runs (and is timed);
- otherwise the first leg runs in the caller's task while a helper task waits the hedge delay (the
  ``quantile`` of recent latencies, on the Guard's clock). If the first leg has not answered by
  then and the hedge budget (``budget_ratio`` of the stage's calls) allows, the helper runs a second
  leg through the same inner layers, with its own copy of the call record;
- the first *success* wins and the other leg is cancelled (its slot, permit and timer released
  before the call returns). An error never wins: a leg that fails while the other still runs is
  set aside; the call fails only when both failed (with the first leg's error), or when the first
  leg failed before any hedge was sent (a retry is the retry layer's business).

Only for idempotent stages (retrieval, rerank): both legs may reach the dependency. Streams are
not hedged. grpcio's core does not implement gRPC's hedging policy; this fills that gap for any
async dependency.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from .._clock import timers_of
from .._compat import current_task, running_loop
from .._context import current_tenant
from ..events import bus
from ..overload import HedgeFired, LatencyTracker
from ..overload._hedge import HedgeState
from ..overload._registry import shared
from ..pipeline import Call
from .retry import RetryBudget

if TYPE_CHECKING:
    from ._stage import Bound, Stage

__all__ = ["HedgeLayer", "build", "hedge_state"]


class _Race:
    __slots__ = ("error", "launched", "primary_failed", "result", "settled", "task", "timer", "won")

    def __init__(self) -> None:
        self.settled = False  # the first leg's outcome is taken: the hedge must not cancel it
        self.primary_failed = False
        self.launched = False
        self.won = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.timer: asyncio.TimerHandle | None = None  # the hedge's start, on the loop's clock
        self.task: asyncio.Task[Any] | None = None  # the hedge (or, on a FakeClock, its sleeper)


def _twin(call: Call) -> Call:
    """A fresh record for the second leg: same function, arguments and attempt number, none of the
    per-attempt state the inner layers write (timer, start, budget, task)."""
    twin = Call(call.stage, call.fn, call.args, call.kwargs, call.stream)
    twin.attempt = call.attempt
    twin.recoverable = call.recoverable
    return twin


def _fork(proceed: Callable[[], Awaitable[Any]], call: Call) -> Callable[[], Awaitable[Any]]:
    """``proceed`` for the second leg: the inner node run with a twin of ``call``.

    The drivers hand a wrapper ``partial(inner_run, call)`` (or the bare call when nothing is
    inside); the twin keeps two legs from sharing the per-attempt fields of one record."""
    if isinstance(proceed, partial) and proceed.args and proceed.args[0] is call:
        return partial(proceed.func, _twin(call), *proceed.args[1:], **proceed.keywords)
    return proceed


class HedgeLayer:
    """Hedges the attempts of stage ``stage`` (see the module docstring).

    The hedge's start is a loop timer (``call_later``: a task is made only when a hedge is sent)
    when the Guard's clock is the loop's monotonic time; on a clock with its own sleep and timers
    (:class:`~ragguard.FakeClock`) a helper task sleeps on it instead."""

    streams: ClassVar[bool] = False
    __slots__ = ("_own_clock", "clock", "sleep", "stage", "state")

    def __init__(
        self,
        stage: str,
        state: HedgeState,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[Any]],
    ) -> None:
        self.stage = stage
        self.state = state
        self.clock = clock
        self.sleep = sleep
        self._own_clock = timers_of(clock) is not None

    async def around(self, call: Call, proceed: Callable[[], Awaitable[Any]]) -> Any:
        state = self.state
        clock = self.clock
        state.budget.on_call(clock())  # type: ignore[attr-defined]
        delay = state.delay()
        loop = running_loop()
        owner = None if loop is None or delay is None else current_task(loop)
        started = clock()
        if owner is None or delay is None or loop is None:
            result = await proceed()
            state.tracker.add(clock() - started)
            return result
        race = _Race()
        if self._own_clock:
            race.task = loop.create_task(self._sleep_then_hedge(race, owner, delay, proceed, call))
        else:
            race.timer = loop.call_later(delay, self._launch, race, owner, delay, proceed, call, loop)
        before = owner.cancelling()
        try:
            result = await proceed()
        except asyncio.CancelledError:
            race.settled = True
            if race.won and owner.uncancel() <= before:
                state.tracker.add(clock() - started)  # a lower bound: the loser's time so far
                return race.result
            await _stop(race)
            raise
        except Exception:
            race.primary_failed = True
            if not race.launched:
                race.settled = True
                await _stop(race)
                raise
            assert race.task is not None
            await asyncio.wait((race.task,))  # the hedge is under way: an error cannot win
            if race.won:
                return race.result
            raise
        race.settled = True
        state.tracker.add(clock() - started)
        if race.task is None:  # the usual case: no hedge was sent, only its timer to stop
            if race.timer is not None:
                race.timer.cancel()
            return result
        await _stop(race)
        return result

    def _launch(
        self,
        race: _Race,
        owner: asyncio.Task[Any],
        delay: float,
        proceed: Callable[[], Awaitable[Any]],
        call: Call,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        race.timer = None
        if self._allowed(race, delay):
            race.task = loop.create_task(self._leg(race, owner, _fork(proceed, call)))

    async def _sleep_then_hedge(
        self,
        race: _Race,
        owner: asyncio.Task[Any],
        delay: float,
        proceed: Callable[[], Awaitable[Any]],
        call: Call,
    ) -> None:
        await self.sleep(delay)
        if self._allowed(race, delay):
            await self._leg(race, owner, _fork(proceed, call))

    def _allowed(self, race: _Race, delay: float) -> bool:
        """Whether to send the hedge now (the first leg has not answered, the budget allows)."""
        if race.settled:
            return False
        state = self.state
        if not state.budget.try_spend():  # type: ignore[attr-defined]
            state.refused += 1
            return False
        race.launched = True
        state.fired += 1
        if bus.active:
            bus.emit(HedgeFired(self.stage, current_tenant(), delay))
        return True

    async def _leg(
        self, race: _Race, owner: asyncio.Task[Any], proceed: Callable[[], Awaitable[Any]]
    ) -> None:
        state = self.state
        started = self.clock()
        try:
            result = await proceed()
        except Exception as exc:
            race.error = exc  # set aside: an error never wins the race
            return
        state.tracker.add(self.clock() - started)
        if race.settled and not race.primary_failed:
            return  # the first leg answered meanwhile
        race.won = True
        race.result = result
        state.won += 1
        if not race.primary_failed:
            owner.cancel()  # stop the first leg: its layers release what it holds


async def _stop(race: _Race) -> None:
    """Cancel the hedge (its timer, or its task) and wait until it has released what it held."""
    if race.timer is not None:
        race.timer.cancel()
        race.timer = None
    task = race.task
    if task is not None:
        if not task.done():
            task.cancel()
        await asyncio.wait((task,))


def hedge_state(stage: Stage) -> HedgeState:
    """The hedging state of ``stage`` (built once from its policy's ``hedge``)."""

    def make() -> HedgeState:
        p = stage.policy.hedge
        assert p is not None
        tracker = LatencyTracker(quantile=p.quantile, size=p.samples, min_samples=p.min_samples)
        budget = RetryBudget(
            ratio=p.budget_ratio, min_per_s=p.budget_min_per_s, window_s=p.budget_window_s, clock=stage.clock
        )
        return HedgeState(tracker, budget, min_delay_s=p.min_delay_s, max_delay_s=p.max_delay_s)

    return shared(stage, "hedge", make)


def build(stage: Stage, bound: Bound) -> HedgeLayer | None:
    if stage.policy.hedge is None or bound.stream:
        return None
    return HedgeLayer(stage.name, hedge_state(stage), stage.clock, stage.guard.sleep)
