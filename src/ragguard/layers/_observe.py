"""Observation: a span and a :class:`ragguard.events.StageCompleted` event per guarded call or stream
(and a :class:`ragguard.events.StreamEnded` per stream, with its ending on the span).

Outermost in the chain, so it sees the call as its caller does (fallbacks included) and, for a
stream, the whole stream. The observed chain is a separate compiled chain that a guarded function
picks only while tracing is on or the event bus has listeners: unobserved calls pay nothing for it.

The span comes from :data:`ragguard.events.tracer` (set by :func:`ragguard.metrics.enable_tracing`)
and is *current* while the stage's own code runs, so spans made inside it (an SDK's, httpx's) are
its children: for a call, from its start to its end (a hedge's second leg, a task started inside,
inherits it); for a stream, while it opens, while each item is read, and while it closes, but never
while the caller holds an item (the caller's own spans are not the stage's children).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

from .. import events
from .._clock import Clock
from .._context import DEFAULT_TENANT, current_scope, current_tenant, degraded, degraded_count
from .._deadline import Expiry, current_expiry
from .._endings import StreamEnding, ended_by
from ..breakers import BreakerState
from ..events import EventBus, StageCompleted, StreamEnded, Where, bus, error_type
from ..pipeline import Call, Gate, Scope

if TYPE_CHECKING:
    from ..breakers import Breaker
    from ..pipeline._drivers import Head
    from ._shapes import Bound, Stage

__all__ = ["OPERATIONS", "ObserveLayer", "ObserveStream", "build", "span_attributes", "where"]

OPERATIONS: dict[str, str] = {"embedding": "embeddings", "vector_store": "retrieval", "generation": "chat"}
"""A stage preset -> its ``gen_ai.operation.name`` (OpenTelemetry GenAI semantic conventions);
stages of other presets (rerank has no such operation) or none carry no ``gen_ai`` attributes."""


def where(stage: Stage, bound: Bound) -> Where:
    """Where ``bound``'s calls in ``stage`` (a stage's own runtime, or a key's) run: its key, the
    operation its preset names (:data:`OPERATIONS`), the provider its function says it calls (an
    integration's ``__ragguard_provider__``) and, for a provider's key ``<endpoint>/<model>``, the
    model."""
    operation = "" if stage.preset is None else OPERATIONS.get(stage.preset.name, "")
    provider = getattr(bound.fn, "__ragguard_provider__", "")
    provider = provider if isinstance(provider, str) else ""
    key = stage.key or ""
    model = key.partition("/")[2] if provider and "/" in key else ""
    return Where(key, operation, provider, model)


def span_attributes(at: Where) -> dict[str, str]:
    """The span attributes ``at`` makes (those that are set)."""
    named = {"ragguard.key": at.key, "gen_ai.operation.name": at.operation,
             "gen_ai.provider.name": at.provider, "gen_ai.request.model": at.model}  # fmt: skip
    return {name: value for name, value in named.items() if value}


class _Observe:
    """What the call's and the stream's observe layers share: the stage and how to read its state."""

    __slots__ = ("_bus", "attributes", "breaker", "clock", "operation", "stage", "where")

    def __init__(
        self,
        stage: str,
        breaker: Breaker | None,
        clock: Clock,
        operation: str = "",
        event_bus: EventBus = bus,
        where: Where | None = None,
    ) -> None:
        self.stage = stage
        self.breaker = breaker
        self.clock = clock
        self.where = where if where is not None else Where(operation=operation)
        self.operation = self.where.operation
        self.attributes = span_attributes(self.where)
        self._bus = event_bus

    def _state(self) -> str:
        breaker = self.breaker
        if breaker is None:
            return ""
        st = breaker.state
        return _STATE_NAMES.get(st) or str(getattr(st, "value", st))


class ObserveLayer(_Observe):
    """The observe gate of a call: opens (and makes current) a span when the call enters, while
    tracing; closes it with the outcome and emits StageCompleted when it exits."""

    scope: ClassVar[Scope] = "call"
    __slots__ = ()

    def enter(self, call: Call) -> Any:
        breaker = self.breaker  # self._state(), inlined: every observed call pays it
        state = (
            "" if breaker is None else _STATE_NAMES.get(st := breaker.state) or str(getattr(st, "value", st))
        )
        tracer = events.tracer
        if tracer is None:
            # listeners only: no span object, the StageCompleted is made on exit from this token;
            # current_tenant() and degraded_count(), inlined for a call inside a request
            scope = current_scope()
            if scope is None:
                return None, DEFAULT_TENANT, state, self.clock(), degraded_count(), current_expiry()
            served = scope.fallbacks
            before = 0 if served is None else len(served)
            return None, scope.tenant, state, self.clock(), before, current_expiry()
        tenant = current_tenant()
        span = tracer.start(self.stage, tenant, state, self.operation, self.attributes)
        traced = (tracer, span, tracer.attach(span))
        return traced, tenant, state, self.clock(), degraded_count(), current_expiry()

    async def enter_async(self, call: Call) -> Any:  # pragma: no cover - enter never waits
        return self.enter(call)

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        traced, tenant, state, started, before, expiry = token
        scope = current_scope()
        if scope is not None:  # _served_since(before), inlined for a call inside a request
            served = scope.fallbacks
            fallback = served[-1] if served is not None and len(served) > before else ""
        else:
            fallback = _served_since(before)
        if traced is not None:
            tracer, span, attached = traced
            tracer.detach(attached)
            tracer.end(span, _outcome(exc, fallback), exc, fallback, None)
        event_bus = self._bus
        if event_bus.active:  # every observed call: _left and, for a success, _completed inlined
            clock = self.clock
            took = clock() - started
            left = None
            if expiry is not None:
                left = expiry.at - started if expiry.clock is clock else expiry.left()
                left = left if left > 0.0 else 0.0
            if exc is None:
                outcome = "fallback" if fallback else "success"
                completed = StageCompleted(self.stage, tenant, outcome, took, fallback, state, "", None, left,
                                           self.where)  # fmt: skip
                event_bus.emit(completed)
            else:
                _completed(event_bus, self.stage, self.where, tenant, exc, fallback, state, took, None, left)
        return None


class ObserveStream(_Observe):
    """The observe layer of a stream: a wrapper around its opening that keeps the span current
    while the stream's own code runs (see the module docstring) and ends it, with StageCompleted
    and StreamEnded, when the stream ends however it ends (the stream driver exits it with the
    others it holds, once it has set the stream's ending). A tracer with a ``stream_ended(span,
    ending)`` method is given the ending before the span ends."""

    scope: ClassVar[Scope] = "call"
    __slots__ = ()

    async def around(self, call: Call, proceed: Callable[[], Awaitable[Any]]) -> Any:
        state = self._state()
        tenant = current_tenant()
        before = degraded_count()
        started = self.clock()
        left = _left(current_expiry(), started, self.clock)
        tracer = events.tracer
        span = attached = None
        if tracer is not None:
            span = tracer.start(self.stage, tenant, state, self.operation, self.attributes)
            attached = tracer.attach(span)
        try:
            head: Head = await proceed()
        except BaseException as exc:
            if tracer is not None:
                tracer.detach(attached)
            ending = StreamEnding("incomplete", self.stage, 0, error=ended_by(exc))
            self._end(_Open(tracer, span, tenant, state, started, before, None, left), exc, ending)
            raise
        first_s = None if head.done else self.clock() - started
        opened = _Open(tracer, span, tenant, state, started, before, first_s, left)
        if tracer is not None:
            tracer.detach(attached)
            head.agen = _Traced(head.agen, tracer, span)
            # the span is current while the layers inside exit too (a generation stage settles its
            # tokens there): the stream driver exits what the head holds in order, innermost first
            head.held.insert(0, (_held(_Attach(tracer)), [opened]))
        head.held.append((_held(self), [opened]))
        return head

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        self._end(token, exc, call.ending)
        return None

    def _end(self, opened: _Open, exc: BaseException | None, ending: StreamEnding | None) -> None:
        fallback = _served_since(opened.before)
        tracer = opened.tracer
        if tracer is not None:
            if opened.attached is not None:
                tracer.detach(opened.attached)
                opened.attached = None
            stream_ended = getattr(tracer, "stream_ended", None)
            if stream_ended is not None and ending is not None:
                stream_ended(opened.span, ending)
            tracer.end(opened.span, _outcome(exc, fallback), exc, fallback, opened.first_item_s)
        if self._bus.active:
            took, first_s, left = self.clock() - opened.started, opened.first_item_s, opened.deadline_s
            _completed(self._bus, self.stage, self.where, opened.tenant, exc, fallback, opened.state, took,
                       first_s, left)  # fmt: skip
            if ending is not None:
                self._bus.emit(
                    StreamEnded(
                        self.stage, opened.tenant, ending.kind, ending.items, ending.continued_by,
                        ending.continued_after, ending.error,
                    )
                )  # fmt: skip


class _Open:
    """One observed stream between its opening and its end."""

    __slots__ = (
        "attached", "before", "deadline_s", "first_item_s", "span", "started", "state", "tenant", "tracer",
    )  # fmt: skip

    def __init__(
        self,
        tracer: events.StageTracer | None,
        span: Any,
        tenant: str,
        state: str,
        started: float,
        before: int,
        first_item_s: float | None,
        deadline_s: float | None,
    ) -> None:
        self.tracer = tracer
        self.span = span
        self.tenant = tenant
        self.state = state
        self.started = started
        self.before = before
        self.first_item_s = first_item_s
        self.deadline_s = deadline_s
        self.attached: Any = None


class _Attach:
    """Held first by an observed stream's head: when the stream ends, makes its span current for
    the exits of the layers inside (the :class:`ObserveStream` exit, held last, detaches it)."""

    scope: ClassVar[Scope] = "call"
    __slots__ = ("tracer",)

    def __init__(self, tracer: events.StageTracer) -> None:
        self.tracer = tracer

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        token.attached = self.tracer.attach(token.span)
        return None


def _held(layer: _Attach | ObserveStream) -> Sequence[Gate]:
    """``layer`` as the stream driver holds a gate until the stream ends (only its ``exit`` is called)."""
    return cast("Sequence[Gate]", (layer,))


class _Traced:
    """``agen``'s items, read with ``span`` current: attached and detached within each read (so in
    the reader's own context, and never left current while the reader holds an item), and while
    it closes. A class rather than an async generator: closing one that never started would not
    close ``agen``."""

    __slots__ = ("_agen", "_span", "_tracer")

    def __init__(self, agen: Any, tracer: events.StageTracer, span: Any) -> None:
        self._agen = agen
        self._tracer = tracer
        self._span = span

    def __aiter__(self) -> _Traced:
        return self

    async def __anext__(self) -> Any:
        attached = self._tracer.attach(self._span)
        try:
            return await self._agen.__anext__()
        finally:
            self._tracer.detach(attached)

    async def aclose(self) -> None:
        aclose = getattr(self._agen, "aclose", None)
        if aclose is not None:
            attached = self._tracer.attach(self._span)
            try:
                await aclose()
            finally:
                self._tracer.detach(attached)


def _served_since(before: int) -> str:
    """The last fallback that served the current request since it had served ``before`` ("" if none)."""
    scope = current_scope()
    if scope is not None:  # degraded() of a request, inlined
        served = scope.fallbacks
        return served[-1] if served is not None and len(served) > before else ""
    return degraded()[-1] if degraded_count() > before else ""


def _left(expiry: Expiry | None, now: float, clock: Clock) -> float | None:
    """What ``expiry`` (the request's deadline) had left at ``now`` on ``clock``, >= 0 (None: no
    deadline); read on the deadline's own clock when it is another."""
    if expiry is None:
        return None
    left = expiry.at - now if expiry.clock is clock else expiry.left()
    return left if left > 0.0 else 0.0


def _outcome(exc: BaseException | None, fallback: str) -> str:
    if exc is None:
        return "fallback" if fallback else "success"
    return "error" if isinstance(exc, Exception) else "cancelled"


def _completed(
    event_bus: EventBus,
    stage: str,
    at: Where,
    tenant: str,
    exc: BaseException | None,
    fallback: str,
    state: str,
    duration_s: float,
    first_item_s: float | None,
    deadline_s: float | None,
) -> None:
    outcome = _outcome(exc, fallback)
    error = error_type(exc) if outcome == "error" else ""
    event_bus.emit(
        StageCompleted(stage, tenant, outcome, duration_s, fallback, state, error, first_item_s, deadline_s,
                       at)
    )  # fmt: skip


_STATE_NAMES: dict[Any, str] = {state: state.value for state in BreakerState}


def build(stage: Stage, bound: Bound) -> ObserveLayer | ObserveStream:
    at = where(stage, bound)
    kind = ObserveStream if bound.stream else ObserveLayer
    return kind(stage.name, stage.breaker, stage.clock, at.operation, stage.context.bus, at)
