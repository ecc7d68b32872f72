"""Hedged requests: a second attempt after about the stage's P95, the first success wins.

A wrapper inside the retries, around each attempt (and outside the adaptive limit, the breaker and
the attempt timer, so each leg takes its own slot, permit and timer). For each call:

- while fewer than ``min_samples`` latencies are known, the attempt simply runs (and is timed);
- otherwise the first leg runs in the caller's task and, after the hedge delay (the ``quantile``
  of recent latencies, on the Guard's clock), if the first leg has not answered, the request's
  deadline still leaves an attempt its ``min_attempt_s``, and the hedge budget (``budget_ratio`` of
  the stage's calls) allows, a second leg runs through the same inner layers, with its own copy of
  the call record. A hedge counts (``fired``, :class:`~ragguard.overload.HedgeFired`) once its leg
  reaches the dependency: a leg an inner layer refuses first (the adaptive limit shed it, the
  breaker is open) or that is cancelled before, gives its budget back (``blocked``);
- the first *success* wins and the other leg is cancelled (its slot, permit and timer released
  before the call returns). An error never wins: a leg that fails while the other still runs is
  set aside; the call fails only when both failed (with the first leg's error), or when the first
  leg failed before any hedge was sent (a retry is the retry layer's business).

On asyncio the hedge's start is a timer (the loop's, or a :class:`~ragguard.FakeClock`'s own, which
never moves fake time by itself), and a task is made only when a hedge is sent; on trio a nursery
holds the hedge's helper task for the call.

Only for idempotent stages (retrieval, rerank): both legs may reach the dependency. Streams are
not hedged. grpcio's core does not implement gRPC's hedging policy; this fills that gap for any
async dependency.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from .._compat import current_task, running_loop
from .._context import current_tenant
from .._deadline import current_expiry
from ..events import EventBus, bus
from ..overload import HedgeFired
from ..overload._hedge import HedgeState, LatencyTracker
from ..pipeline import Call
from ._retry import RetryBudget

if TYPE_CHECKING:
    from ._shapes import Bound, Stage

Proceed = Callable[[Call], Awaitable[Any]]
"""A forking wrapper's ``proceed``: the inner layers run with the record given."""

__all__ = ["HedgeLayer", "build", "hedge_state"]


class _Race:
    __slots__ = (
        "cancel_first",
        "error",
        "launched",
        "primary_failed",
        "result",
        "scope",
        "sent",
        "settled",
        "task",
        "timer",
        "won",
    )

    def __init__(self) -> None:
        self.settled = False  # the first leg's outcome is taken: the hedge must not cancel it
        self.primary_failed = False
        self.launched = False  # a second leg was started (budget spent)
        self.sent = False  # ...and reached the dependency (counted as fired)
        self.won = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.timer: Any = None  # the hedge's start: a loop or FakeClock timer (asyncio)
        self.task: asyncio.Task[Any] | None = None  # the second leg (asyncio)
        self.scope: Any = None  # the first leg's cancel scope (trio)
        self.cancel_first: Callable[[], Any] | None = None  # stops the first leg


def _twin(call: Call, fn: Callable[..., Any]) -> Call:
    """A fresh record for the second leg: same arguments and attempt number, ``fn`` as its function,
    none of the per-attempt state the inner layers write (timer, start, budget, task)."""
    twin = Call(call.stage, fn, call.args, call.kwargs, call.stream)
    twin.attempt = call.attempt
    twin.recoverable = call.recoverable
    return twin


class HedgeLayer:
    """Hedges the attempts of stage ``stage`` (see the module docstring).

    ``clock``: the Guard's; ``sleep``: its sleep (the hedge delay on trio with a clock that has no
    timers of its own); ``min_attempt_s``: the least deadline left for a hedge to be sent."""

    forks: ClassVar[bool] = True  # proceed(call): the second leg runs the inner layers with its own record
    __slots__ = ("_bus", "_fake", "clock", "min_attempt_s", "sleep", "stage", "state")

    def __init__(
        self,
        stage: str,
        state: HedgeState,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[Any]],
        min_attempt_s: float = 0.0,
        event_bus: EventBus = bus,
    ) -> None:
        self.stage = stage
        self.state = state
        self._bus = event_bus
        self.clock = clock
        self.sleep = sleep
        self.min_attempt_s = min_attempt_s
        later = getattr(clock, "call_later", None)
        self._fake: Callable[..., Any] | None = later if callable(later) else None  # a FakeClock's timers

    async def around(self, call: Call, proceed: Proceed) -> Any:
        state = self.state
        clock = self.clock
        state.budget.on_call(clock())  # type: ignore[attr-defined]
        delay = state.delay()
        started = clock()
        if delay is not None:
            loop = running_loop()
            if loop is None:
                return await self._race_trio(call, proceed, delay, started)
            owner = current_task(loop)
            if owner is not None:
                return await self._race_asyncio(call, proceed, delay, started, loop, owner)
        result = await proceed(call)
        state.tracker.add(clock() - started)
        return result

    # -- asyncio -----------------------------------------------------------------------------------

    async def _race_asyncio(
        self,
        call: Call,
        proceed: Proceed,
        delay: float,
        started: float,
        loop: asyncio.AbstractEventLoop,
        owner: asyncio.Task[Any],
    ) -> Any:
        state = self.state
        clock = self.clock
        race = _Race()
        race.cancel_first = owner.cancel
        later = self._fake if self._fake is not None else loop.call_later
        race.timer = later(delay, self._launch, race, delay, proceed, call, loop)
        before = owner.cancelling()
        try:
            result = await proceed(call)
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
        delay: float,
        proceed: Proceed,
        call: Call,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        race.timer = None
        if self._allowed(race):
            race.task = loop.create_task(self._leg(race, self._fork(race, delay, proceed, call)))

    # -- trio --------------------------------------------------------------------------------------

    async def _race_trio(
        self, call: Call, proceed: Proceed, delay: float, started: float
    ) -> Any:
        """The race on trio: the first leg in the caller's task under its own cancel scope, the
        hedge in a helper task of a nursery that ends before the call returns. Nothing is raised
        inside the nursery (its errors would come out wrapped in an exception group)."""
        import trio

        state = self.state
        clock = self.clock
        race = _Race()
        race.scope = trio.CancelScope()
        race.cancel_first = race.scope.cancel
        helper = trio.CancelScope()
        failure: BaseException | None = None
        result: Any = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._hedge_trio, race, helper, delay, proceed, call)
            try:
                with race.scope:
                    result = await proceed(call)
            except BaseException as exc:  # re-raised below, once the helper is done
                failure = exc
            if failure is None or not isinstance(failure, Exception):
                race.settled = True
                helper.cancel()  # answered (or cancelled, or the hedge won): stop the other leg
            else:
                race.primary_failed = True
                if not race.launched:
                    race.settled = True
                    helper.cancel()
                # else: the hedge is under way, an error cannot win; the nursery waits for it
        if failure is not None:
            if race.won and isinstance(failure, Exception):
                return race.result
            raise failure
        state.tracker.add(clock() - started)  # the hedge's win: a lower bound, the loser's time so far
        return race.result if race.scope.cancelled_caught else result

    async def _hedge_trio(
        self,
        race: _Race,
        helper: Any,
        delay: float,
        proceed: Proceed,
        call: Call,
    ) -> None:
        import trio

        try:
            with helper:
                if self._fake is not None:  # a FakeClock: its timer, which never moves fake time itself
                    due = trio.Event()
                    timer = self._fake(delay, due.set)
                    try:
                        await due.wait()
                    finally:
                        timer.cancel()
                else:
                    await self.sleep(delay)
                if self._allowed(race):
                    await self._leg(race, self._fork(race, delay, proceed, call))
        except trio.Cancelled:
            return  # cancelled from outside: the first leg raises it for the call

    # -- both --------------------------------------------------------------------------------------

    def _allowed(self, race: _Race) -> bool:
        """Whether to start the hedge now: the first leg has not answered, the deadline leaves an
        attempt its ``min_attempt_s`` (the timeout layer would refuse it), and the budget allows."""
        if race.settled:
            return False
        state = self.state
        expiry = current_expiry()
        if expiry is not None:
            left = expiry.left()
            if left <= 0.0 or left < self.min_attempt_s:
                state.skipped += 1
                return False
        if not state.budget.try_spend():  # type: ignore[attr-defined]
            state.refused += 1
            return False
        race.launched = True
        return True

    def _fork(self, race: _Race, delay: float, proceed: Proceed, call: Call) -> Callable[[], Awaitable[Any]]:
        """The second leg: the inner layers run with a twin of ``call`` whose function counts the
        hedge as sent when the leg reaches it (after every inner layer admitted it)."""
        fn = call.fn

        async def sent(*args: Any, **kwargs: Any) -> Any:
            self._sent(race, delay)
            return await fn(*args, **kwargs)

        return partial(proceed, _twin(call, sent))

    def _sent(self, race: _Race, delay: float) -> None:
        race.sent = True
        self.state.fired += 1
        if self._bus.active:
            self._bus.emit(HedgeFired(self.stage, current_tenant(), delay))

    async def _leg(self, race: _Race, leg: Callable[[], Awaitable[Any]]) -> None:
        state = self.state
        started = self.clock()
        try:
            result = await leg()
        except Exception as exc:
            race.error = exc  # set aside: an error never wins the race
            return
        finally:
            if not race.sent:  # refused by an inner layer, or cancelled, before the dependency
                state.budget.refund()  # type: ignore[attr-defined]
                state.blocked += 1
        state.tracker.add(self.clock() - started)
        if race.settled and not race.primary_failed:
            return  # the first leg answered meanwhile
        race.won = True
        race.result = result
        state.won += 1
        if not race.primary_failed and race.cancel_first is not None:
            race.cancel_first()  # stop the first leg: its layers release what it holds


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
        budget = RetryBudget.of(p, stage.clock)
        return HedgeState(tracker, budget, min_delay_s=p.min_delay_s, max_delay_s=p.max_delay_s)

    return stage.part("hedge", make)


def build(stage: Stage, bound: Bound) -> HedgeLayer | None:
    if stage.policy.hedge is None or bound.stream:
        return None
    ctx = stage.context
    min_attempt_s = max(stage.policy.min_attempt_s, 0.0)
    return HedgeLayer(stage.name, hedge_state(stage), stage.clock, ctx.sleep, min_attempt_s, ctx.bus)
