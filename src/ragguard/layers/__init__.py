"""The layers of a guarded stage, one file each, in the order of the layer registry.

:data:`REGISTRY` lists every layer's builder, outermost first (read from
:mod:`ragguard.options._layers`, the one table); a stage's chain holds the layers whose builder returns
one (a layer that is not configured is left out). docs/layers.md gives the order and its reasons.

A new layer is one file with its options model at the top and a ``build(stage, bound) -> layer |
None`` function, and one entry in the registry. From outside the package: a file, a model, and one
:func:`register_layer` call, which inserts the builder next to a named layer, before or after a
policy naming it is loaded; the stage's options live under ``layers: {name: {...}}`` in its
policy, validated by that model, and ``stage.layer_policy(name)`` hands them to the builder (see
``examples/custom_layer.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..options import _layers as _registry
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
