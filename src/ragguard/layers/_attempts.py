"""A span per attempt, the stage span's child, while tracing is on.

A gate of attempt scope inside the retries and the hedge (each retry and each hedged leg passes
it) and outside the throttle, the adaptive limit and the breaker (an attempt they refuse is an
attempt too, ended by their refusal). Built only into the observed chain, and only while
:func:`ragguard.metrics.enable_tracing` is on (turning tracing on or off rebuilds the chains), so
a call that nobody traces runs none of it.

Its span, ``ragguard.attempt``, carries the attempt's number (``ragguard.attempt``: 1, then 2
for the first retry...), where it ran (the stage, the deployment's key, the GenAI provider and
model when known) and how it ended: ``ragguard.outcome``, the kind the chain's classifier gave
its error (``failure``, ``timeout``, ``rejection``, ``caller_error``, ``refused``, ``deadline``,
``unknown``; ``success``; ``cancelled``), ``ragguard.reason`` (the classifier's reason:
``connection``, ``http_503``, ``context_length``...) and ``error.type``; what followed (a retry,
a fallback, a model group's next deployment) is the stage span's, and the group's caller's,
span events. A call's attempt span is current while the attempt runs (the SDK's and httpx's spans
are its children); a stream's is not (the stage span is current while the stream's own code
runs: see :mod:`ragguard.layers._observe`), and lasts from its opening to its end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .. import events
from ..pipeline import Call, Scope
from ._observe import span_attributes, where

if TYPE_CHECKING:
    from ._shapes import Bound, Stage

__all__ = ["AttemptSpans", "build"]


class AttemptSpans:
    """Opens and ends each attempt's span through ``tracer`` (``ragguard.metrics``'s), with the
    fixed ``attributes`` of the stage's chain; ``current``: make it current while it runs (a
    call's attempt, not a stream's)."""

    scope: ClassVar[Scope] = "attempt"
    __slots__ = ("attributes", "current", "tracer")

    def __init__(self, tracer: Any, attributes: dict[str, Any], *, current: bool) -> None:
        self.tracer = tracer
        self.attributes = attributes
        self.current = current

    def enter(self, call: Call) -> Any:
        tracer = self.tracer
        span = tracer.start_attempt({**self.attributes, "ragguard.attempt": call.attempt})
        return span, tracer.attach(span) if self.current else None

    async def enter_async(self, call: Call) -> Any:  # pragma: no cover - enter never waits
        return self.enter(call)

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        span, attached = token
        tracer = self.tracer
        if attached is not None:
            tracer.detach(attached)
        tracer.end_attempt(span, exc)
        return None


def build(stage: Stage, bound: Bound) -> AttemptSpans | None:
    """The attempt spans of ``bound``'s observed chain while tracing is on (else None)."""
    tracer = events.tracer
    if tracer is None or not hasattr(tracer, "start_attempt"):
        return None
    attributes: dict[str, Any] = {"ragguard.stage": stage.name, **span_attributes(where(stage, bound))}
    return AttemptSpans(tracer, attributes, current=not bound.stream)
