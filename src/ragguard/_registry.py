"""The layer registry: every layer's name in chain order (outermost first), its options model and
its builder; and the names of the stage presets.

A leaf: it imports no layer, no preset and no Guard, so the policy validates a stage's options by
asking it (:func:`model`) while the layers import the policy. A built-in layer's model and builder
are written here by name (``"ragguard.layers.retry:RetryPolicy"``) and imported the first time
they are asked for; a user layer's are the objects given to :func:`register`. Each options model is
declared at the top of its layer's file. The order and its reasons are written in docs/layers.md
(tested against this table).

A layer is *present by default* when a stage that does not configure it still gets its options
model's defaults (``retry``: one attempt; ``breaker``: the generic breaker); the others are off
until configured. The built-in layers with options may be spelt at the top of a stage's policy
(``breaker: {...}``) as well as under its ``layers:`` mapping.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from . import _inject
from ._errors import ConfigError
from ._validate import shown

__all__ = [
    "BUILT_IN",
    "DEFAULT_ON",
    "PRESETS",
    "STAGE_FIELDS",
    "Entry",
    "add_preset",
    "entries",
    "model",
    "register",
    "registered",
    "unknown",
    "unregister",
]

Builder = Callable[[Any, Any], Any]


class Entry:
    """One layer: ``name``, its builder ``build(stage, bound) -> layer | None`` and its options
    model (None: it takes no options); each given as the object or as ``"module:attr"``."""

    __slots__ = ("_build", "_model", "name")

    def __init__(self, name: str, build: Builder | str, model: type[Any] | str | None = None) -> None:
        self.name = name
        self._build = build
        self._model = model

    @property
    def build(self) -> Builder:
        build = self._build
        if isinstance(build, str):
            build = self._build = _resolve(build)
        return build

    @property
    def model(self) -> type[Any] | None:
        model = self._model
        if isinstance(model, str):
            model = self._model = _resolve(model)
        return model

    def __repr__(self) -> str:
        return f"<layer {self.name!r}>"


def _resolve(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def _layer(name: str, model: str | None = None, build: str = "build") -> Entry:
    module = "ragguard.layers" if build.startswith("_") else f"ragguard.layers.{name}"
    return Entry(name, f"{module}:{build}", None if model is None else f"ragguard.layers.{name}:{model}")


_entries: tuple[Entry, ...] = (
    _layer("observe"),
    _layer("share"),
    _layer("fallback"),
    _layer("reserve"),
    _layer("deadline"),
    _layer("quota"),
    _layer("preset", build="_preset"),
    _layer("retry", "RetryPolicy"),
    _layer("hedge", "HedgePolicy"),
    _layer("throttle", "ThrottlePolicy"),
    _layer("adaptive", "AdaptivePolicy"),
    _layer("breaker", "BreakerPolicy"),
    _layer("preset_attempt", build="_preset_attempt"),
    _layer("timeout"),
    _layer("chaos"),
)

BUILT_IN = frozenset(e.name for e in _entries)
"""The names of the built-in layers (never replaced nor removed)."""
STAGE_FIELDS: tuple[str, ...] = tuple(e.name for e in _entries if e._model is not None)
"""The built-in layers with options: spelt at a stage policy's top level (``retry: {...}``)."""
DEFAULT_ON = frozenset({"retry", "breaker"})
"""The layers a stage gets with their model's defaults when it does not configure them."""
PRESETS: set[str] = {"embedding", "vector_store", "rerank", "generation"}
"""The names a stage policy's ``preset`` may take (the built-in ones and those registered)."""


def entries() -> tuple[Entry, ...]:
    """Every layer, outermost first."""
    return _entries


def model(name: str) -> type[Any] | None:
    """The options model of the registered layer ``name``; None when no layer of that name is
    registered (yet) or when it takes no options."""
    for entry in _entries:
        if entry.name == name:
            return entry.model
    return None


def registered(name: str) -> bool:
    return any(e.name == name for e in _entries)


def register(
    name: str,
    build: Builder,
    *,
    policy: type[Any] | None = None,
    before: str | None = None,
    after: str | None = None,
) -> None:
    """Add a layer of your own to every stage's chain, next to the layer named ``before`` or
    ``after`` (exactly one; see :data:`ragguard.layers.REGISTRY` for the names and their order,
    outermost first). This is :func:`ragguard.layers.register_layer`.

    ``build(stage, bound) -> layer | None`` is called once per decorated function and Guard (None
    leaves the layer out of that chain); ``policy`` is the layer's options model (a pydantic model
    or any class taking the options as keywords): a stage's ``layers: {name: {...}}`` entry is
    validated by it when the policy loads, or, for a policy loaded before this call, when a Guard
    builds the stage; ``stage.layer_policy(name)`` returns it (None when the stage has no entry).
    Registering a name again replaces it in place. Chains compiled before are rebuilt on their
    next call. Raises ConfigError for a built-in name, a bad position or a builder that is not
    callable."""
    global _entries
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"register_layer: name must be an identifier, got {name!r:.60}")
    if name in BUILT_IN:
        raise ConfigError(f"register_layer: {name!r} is a built-in layer")
    if not callable(build):
        raise ConfigError(
            f"register_layer: build must be a function (stage, bound) -> layer | None, got {build!r:.60}"
        )
    if policy is not None and not callable(policy):
        raise ConfigError(f"register_layer: policy must be a model class, got {policy!r:.60}")
    names = [e.name for e in _entries if e.name != name]
    if (before is None) == (after is None):
        raise ConfigError(
            f"register_layer: give exactly one of before= or after= (one of {', '.join(names)})"
        )
    anchor = before if before is not None else after
    if anchor not in names:
        raise ConfigError(
            f"register_layer: no layer {anchor!r:.60} to place {name!r} by; known: {', '.join(names)}"
        )
    kept = [e for e in _entries if e.name != name]
    at = [e.name for e in kept].index(anchor) + (0 if before is not None else 1)
    kept.insert(at, Entry(name, build, policy))
    _entries = tuple(kept)
    _inject.epoch += 1  # compiled chains are rebuilt with the new layer


def unregister(name: str) -> None:
    """Take a user layer out of every chain (no-op when absent)."""
    global _entries
    if name in BUILT_IN:
        raise ConfigError(f"unregister_layer: {name!r} is a built-in layer")
    if registered(name):
        _entries = tuple(e for e in _entries if e.name != name)
        _inject.epoch += 1


def unknown(name: str) -> str:
    """Why ``name`` is no layer's options: the message names the layers that take options."""
    known = ", ".join(e.name for e in _entries if e._model is not None)
    return f"unknown layer {shown(name)} (layers with options: {known})"


def add_preset(name: str) -> None:
    """Let stage policies name the preset ``name`` (see :func:`ragguard.rag.register_preset`)."""
    PRESETS.add(name)
