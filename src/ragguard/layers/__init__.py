"""The layers of a guarded stage, one file each, and the registry that orders them.

:data:`REGISTRY` lists every layer's builder, outermost first; a stage's chain holds the layers
whose builder returns one (a layer that is not configured is left out)::

    observe    span + StageCompleted (only in the observed chain)
    fallback   the fallback chain (the preset's and the user's)
    deadline   refuse a call that cannot finish in time, before it queues
    quota      the default tenant's admission for calls outside a request
    preset     the RAG preset's wrappers (embedding-cache tap, chunked rerank)
    retry      tenacity, deadline-aware, within the retry budget
    hedge      a second attempt after about the stage's P95 (idempotent stages)
    throttle   client-side adaptive throttling of a rejecting dependency
    adaptive   the adaptive concurrency limit: a slot per attempt, priority shedding
    breaker    a permit before each attempt, the outcome after
    timeout    each attempt bounded by min(stage timeout, deadline left)
    chaos      faults injected into the call (only while an injector is installed)

A new layer is one file with a ``build(stage, bound) -> layer | None`` function, one policy model
(a field of :class:`ragguard.StagePolicy`), and one line here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..pipeline import Layer
from . import adaptive, breaker, chaos, deadline, fallback, hedge, observe, quota, retry, throttle, timeout
from ._stage import Bound, Stage, StagePreset

__all__ = ["REGISTRY", "Bound", "Stage", "StagePreset", "build_layers"]

Builder = Callable[[Stage, Bound], Any]


def _preset(stage: Stage, bound: Bound) -> Sequence[Layer]:
    return stage.preset_layers(bound)


REGISTRY: tuple[tuple[str, Builder], ...] = (
    ("observe", observe.build),
    ("fallback", fallback.build),
    ("deadline", deadline.build),
    ("quota", quota.build),
    ("preset", _preset),
    ("retry", retry.build),
    ("hedge", hedge.build),
    ("throttle", throttle.build),
    ("adaptive", adaptive.build),
    ("breaker", breaker.build),
    ("timeout", timeout.build),
    ("chaos", chaos.build),
)


def build_layers(stage: Stage, bound: Bound, *, observed: bool = False) -> list[Layer]:
    """The layers of ``bound``'s chain, outermost first (``observe`` only when ``observed``)."""
    layers: list[Layer] = []
    for name, build in REGISTRY:
        if name == "observe" and not observed:
            continue
        made = build(stage, bound)
        if made is None:
            continue
        if isinstance(made, (list, tuple)):
            layers.extend(made)
        else:
            layers.append(made)
    return layers
