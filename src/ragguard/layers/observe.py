"""Observation: an OpenTelemetry span and a :class:`ragguard.metrics.StageCompleted` event per call.

A gate of call scope, outermost in the chain, so it sees the call as its caller does (fallbacks
included) and, for a stream, the whole stream. The observed chain is a separate compiled chain that
a guarded function picks only while tracing is on or the event bus has listeners: unobserved calls
pay nothing for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .. import metrics as _metrics
from .._clock import Clock
from .._context import current_tenant, degraded
from ..pipeline import Call, Scope

if TYPE_CHECKING:
    from ..breakers import Breaker
    from ._stage import Bound, Stage

__all__ = ["ObserveLayer", "build"]


class ObserveLayer:
    """Opens a span when a call of ``stage`` enters; closes it with the outcome and emits
    StageCompleted when it exits."""

    scope: ClassVar[Scope] = "call"
    __slots__ = ("breaker", "clock", "stage")

    def __init__(self, stage: str, breaker: Breaker | None, clock: Clock) -> None:
        self.stage = stage
        self.breaker = breaker
        self.clock = clock

    def enter(self, call: Call) -> Any:
        breaker = self.breaker
        state = "" if breaker is None else str(getattr(breaker.state, "value", breaker.state))
        span = _metrics.otel_span(self.stage, current_tenant(), breaker_state=state, clock=self.clock)
        span.__enter__()
        return span, len(degraded())

    async def enter_async(self, call: Call) -> Any:  # pragma: no cover - enter never waits
        return self.enter(call)

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        span, before = token
        served = degraded()
        if len(served) > before:
            span.set_fallback(served[-1])
        span.__exit__(None if exc is None else type(exc), exc, None)
        return None


def build(stage: Stage, bound: Bound) -> ObserveLayer | None:
    return ObserveLayer(stage.name, stage.breaker, stage.clock)
