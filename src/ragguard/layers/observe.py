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
from .._context import DEFAULT_TENANT, _scope, current_tenant, degraded, degraded_count
from ..breakers import BreakerState
from ..events import bus
from ..pipeline import Call, Scope

if TYPE_CHECKING:
    from ..breakers import Breaker
    from ._stage import Bound, Stage

__all__ = ["ObserveLayer", "build"]


class ObserveLayer:
    """Opens a span when a call of ``stage`` enters (only while tracing: listeners alone need no
    span object); closes it with the outcome and emits StageCompleted when it exits."""

    scope: ClassVar[Scope] = "call"
    __slots__ = ("breaker", "clock", "stage")

    def __init__(self, stage: str, breaker: Breaker | None, clock: Clock) -> None:
        self.stage = stage
        self.breaker = breaker
        self.clock = clock

    def enter(self, call: Call) -> Any:
        breaker = self.breaker
        if breaker is None:
            state = ""
        else:
            st = breaker.state
            state = _STATE_NAMES.get(st) or str(getattr(st, "value", st))
        if _metrics._tracer is None:
            # listeners only: no span object, the StageCompleted is made on exit from this token;
            # current_tenant() and degraded_count(), inlined for a call inside a request
            scope = _scope.get()
            if scope is None:
                return None, DEFAULT_TENANT, state, self.clock(), degraded_count()
            served = scope.fallbacks
            return None, scope.tenant, state, self.clock(), 0 if served is None else len(served)
        span = _metrics.otel_span(self.stage, current_tenant(), breaker_state=state, clock=self.clock)
        span.__enter__()
        return span, "", state, 0.0, degraded_count()

    async def enter_async(self, call: Call) -> Any:  # pragma: no cover - enter never waits
        return self.enter(call)

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        span, tenant, state, started, before = token
        scope = _scope.get()
        if scope is not None:  # degraded() of a request, inlined
            served = scope.fallbacks
            fallback = served[-1] if served is not None and len(served) > before else ""
        else:
            fallback = degraded()[-1] if degraded_count() > before else ""
        if span is not None:
            if fallback:
                span.set_fallback(fallback)
            span.__exit__(None if exc is None else type(exc), exc, None)
        elif bus.active:  # what StageSpan.__exit__ emits (see ragguard.metrics.otel_span)
            if exc is None:
                outcome = "fallback" if fallback else "success"
            else:
                outcome = "error" if isinstance(exc, Exception) else "cancelled"
            duration_s = self.clock() - started
            bus.emit(_metrics.StageCompleted(self.stage, tenant, outcome, duration_s, fallback, state))
        return None


_STATE_NAMES: dict[Any, str] = {state: state.value for state in BreakerState}


def build(stage: Stage, bound: Bound) -> ObserveLayer | None:
    return ObserveLayer(stage.name, stage.breaker, stage.clock)
