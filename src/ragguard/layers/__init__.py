"""The layers of a guarded stage, one file each, in the order of the layer registry.

:data:`REGISTRY` lists every layer's builder, outermost first (:mod:`ragguard.layers._registry`,
in the order :mod:`ragguard.options` keeps with each layer's options model); a stage's chain
holds the layers whose builder returns one (a layer that is not configured is left out).
docs/layers.md gives the order and its reasons.

A new layer is one file with a ``build(stage, bound) -> layer | None`` function, its options model
in :mod:`ragguard.options`, and one entry in each registry. From outside the package: a file, a
model, and one :func:`register_layer` call, which inserts the builder next to a named layer,
before or after a policy naming it is loaded; the stage's options live under ``layers: {name:
{...}}`` in its policy, validated by that model, and ``stage.layer_policy(name)`` hands them to
the builder (see ``examples/custom_layer.py``).

The stage presets (:class:`StagePreset`: ``ragguard.rag``'s embedding, vector_store, rerank and
generation) register themselves with :func:`ragguard.rag.register_preset`.
"""

from __future__ import annotations

from typing import Any

from ..options import _layers as _options
from ._registry import REGISTRY, register_layer
from ._stage import Bound, Stage, StagePreset

__all__ = ["REGISTRY", "Bound", "Stage", "StagePreset", "register_layer"]


def layer_policy_model(name: str) -> type[Any]:
    """The policy model of the registered layer ``name``; ValueError naming the registered ones."""
    model = _options.model(name)
    if model is None:
        raise ValueError(_options.unknown(name))
    return model
