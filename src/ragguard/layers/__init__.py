"""The layers of a guarded stage, one file each, and the registry that orders them.

:data:`REGISTRY` lists every layer's builder, outermost first; a stage's chain holds the layers
whose builder returns one (a layer that is not configured is left out)::

    observe    span + StageCompleted (only in the observed chain)
    fallback   the fallback chain (the preset's and the user's)
    deadline   refuse a call that cannot finish in time, before it queues
    quota      the default tenant's admission for calls outside a request
    preset     the RAG preset's layers around the attempts (embedding-cache tap, chunked rerank,
               the generation stage's token meter)
    retry      tenacity, deadline-aware, within the retry budget
    hedge      a second attempt after about the stage's P95 (idempotent stages)
    throttle   client-side adaptive throttling of a rejecting dependency
    adaptive   the adaptive concurrency limit: a slot per attempt, priority shedding
    breaker    a permit before each attempt, the outcome after
    preset_attempt  the RAG preset's layers inside each attempt (the generation stage's
               first-item, idle and total budgets: retried and counted like the attempt)
    timeout    each attempt bounded by min(stage timeout, deadline left)
    chaos      faults injected into the call (only while an injector is installed)

A new layer is one file with a ``build(stage, bound) -> layer | None`` function, one policy model
(a field of :class:`ragguard.StagePolicy`), and one line here. From outside the package, the same
three things: a file, a policy model, and one :func:`register_layer` line, which inserts the
builder next to a named layer; the stage's options then live under ``layers: {name: {...}}`` in
its policy (``StagePolicy.layers``), validated by that model, and ``stage.layer_policy(name)``
hands them to the builder (see ``examples/custom_layer.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _registry
from ..pipeline import Layer
from ._stage import Bound, Stage, StagePreset

__all__ = [
    "REGISTRY",
    "Bound",
    "Stage",
    "StagePreset",
    "build_layers",
    "layer_policy_model",
    "register_layer",
    "unregister_layer",
]

register_layer = _registry.register
unregister_layer = _registry.unregister


def _preset(stage: Stage, bound: Bound) -> Sequence[Layer]:
    return stage.preset_layers(bound)


def _preset_attempt(stage: Stage, bound: Bound) -> Sequence[Layer]:
    return stage.preset_attempt_layers(bound)


def __getattr__(name: str) -> Any:
    if name == "REGISTRY":  # the leaf registry's order, as (name, builder) pairs
        return tuple((entry.name, entry.build) for entry in _registry.entries())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def layer_policy_model(name: str) -> type[Any]:
    """The policy model of the registered layer ``name``; ValueError naming the registered ones."""
    model = _registry.model(name)
    if model is None:
        raise ValueError(_registry.unknown(name))
    return model


def build_layers(stage: Stage, bound: Bound, *, observed: bool = False) -> list[Layer]:
    """The layers of ``bound``'s chain, outermost first (``observe`` only when ``observed``)."""
    layers: list[Layer] = []
    for entry in _registry.entries():
        if entry.name == "observe" and not observed:
            continue
        made = entry.build(stage, bound)
        if made is None:
            continue
        if isinstance(made, (list, tuple)):
            layers.extend(made)
        else:
            layers.append(made)
    return layers
