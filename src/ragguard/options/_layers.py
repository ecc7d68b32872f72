"""What a stage's policy may configure: every layer's name in chain order (outermost first) with its
options model (None: it takes no options), and the names of the stage presets.

Data only, like the rest of :mod:`ragguard.options`: it imports no layer. The policy validates a
stage's options by asking it (:func:`model`); the layers' code keeps their builders by the same
names (:mod:`ragguard.layers._registry`), and :func:`ragguard.layers.register_layer` adds a user
layer to both (:func:`place`). The order and its reasons are written in docs/layers.md (tested
against :data:`ragguard.layers.REGISTRY`).

A layer is *present by default* when a stage that does not configure it still gets its options
model's defaults (``retry``: one attempt; ``breaker``: the generic breaker); the others are off
until configured. The built-in layers with options may be spelt at the top of a stage's policy
(``breaker: {...}``) as well as under its ``layers:`` mapping.
"""

from __future__ import annotations

import difflib
from typing import Any

from .._validate import shown
from ._adaptive import AdaptivePolicy
from ._breaker import BreakerPolicy
from ._hedge import HedgePolicy
from ._keyed import LimitsPolicy
from ._retry import RetryPolicy
from ._throttle import ThrottlePolicy

__all__ = [
    "BUILT_IN",
    "DEFAULT_ON",
    "PRESETS",
    "STAGE_FIELDS",
    "add_preset",
    "model",
    "names",
    "place",
    "registered",
    "remove",
    "unknown",
]

_table: tuple[tuple[str, type[Any] | None], ...] = (
    ("observe", None),
    ("share", None),
    ("fallback", None),
    ("reserve", None),
    ("deadline", None),
    ("quota", None),
    ("preset", None),
    ("limits", LimitsPolicy),
    ("retry", RetryPolicy),
    ("hedge", HedgePolicy),
    ("attempt_span", None),
    ("throttle", ThrottlePolicy),
    ("adaptive", AdaptivePolicy),
    ("breaker", BreakerPolicy),
    ("preset_attempt", None),
    ("timeout", None),
    ("chaos", None),
)

BUILT_IN = frozenset(name for name, _ in _table)
"""The names of the built-in layers (never replaced nor removed)."""
STAGE_FIELDS: tuple[str, ...] = tuple(name for name, model in _table if model is not None)
"""The built-in layers with options: spelt at a stage policy's top level (``retry: {...}``)."""
DEFAULT_ON = frozenset({"retry", "breaker"})
"""The layers a stage gets with their model's defaults when it does not configure them."""
PRESETS: set[str] = {"embedding", "vector_store", "rerank", "generation"}
"""The names a stage policy's ``preset`` may take: the standard stages' (:data:`STANDARD_STAGES
<ragguard.options.STANDARD_STAGES>`) and those registered (:func:`ragguard.rag.register_preset`)."""


def names() -> tuple[str, ...]:
    """Every layer's name, outermost first."""
    return tuple(name for name, _ in _table)


def model(name: str) -> type[Any] | None:
    """The options model of the registered layer ``name``; None when no layer of that name is
    registered (yet) or when it takes no options."""
    for known, held in _table:
        if known == name:
            return held
    return None


def registered(name: str) -> bool:
    return any(known == name for known, _ in _table)


def place(name: str, model: type[Any] | None, at: int) -> None:
    """Hold layer ``name`` (options ``model``) at position ``at`` of the chain, once (a layer of
    that name is taken out first); :func:`ragguard.layers.register_layer` checks both."""
    global _table
    kept = [entry for entry in _table if entry[0] != name]
    kept.insert(at, (name, model))
    _table = tuple(kept)


def remove(name: str) -> None:
    """Forget layer ``name`` (no-op when absent)."""
    global _table
    _table = tuple(entry for entry in _table if entry[0] != name)


def unknown(name: str) -> str:
    """Why ``name`` is no layer's options: the message names the layers that take options."""
    with_options = [known for known, held in _table if held is not None]
    near = difflib.get_close_matches(name, with_options, n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return f"unknown layer {shown(name)}{hint} (layers with options: {', '.join(with_options)})"


def add_preset(name: str) -> None:
    """Let stage policies name the preset ``name`` (see :func:`ragguard.rag.register_preset`)."""
    PRESETS.add(name)
