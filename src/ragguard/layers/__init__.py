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

from collections.abc import Callable, Sequence
from typing import Any

from .. import _inject
from .._errors import ConfigError
from .._validate import shown
from ..pipeline import Layer
from . import adaptive, breaker, chaos, deadline, fallback, hedge, observe, quota, retry, throttle, timeout
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

Builder = Callable[[Stage, Bound], Any]


def _preset(stage: Stage, bound: Bound) -> Sequence[Layer]:
    return stage.preset_layers(bound)


def _preset_attempt(stage: Stage, bound: Bound) -> Sequence[Layer]:
    return stage.preset_attempt_layers(bound)


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
    ("preset_attempt", _preset_attempt),
    ("timeout", timeout.build),
    ("chaos", chaos.build),
)


_BUILT_IN = frozenset(name for name, _ in REGISTRY)
_POLICIES: dict[str, type[Any]] = {}


def register_layer(
    name: str,
    build: Builder,
    *,
    policy: type[Any] | None = None,
    before: str | None = None,
    after: str | None = None,
) -> None:
    """Add a layer of your own to every stage's chain, next to the layer named ``before`` or
    ``after`` (exactly one; see :data:`REGISTRY` for the names and their order, outermost first).

    ``build(stage, bound) -> layer | None`` is called once per decorated function and Guard (None
    leaves the layer out of that chain); ``policy`` is the layer's policy model (a pydantic model
    or any class taking the options as keywords): a stage's ``layers: {name: {...}}`` entry is
    validated by it when the policy loads, and ``stage.layer_policy(name)`` returns it (None when
    the stage has no entry). Registering a name again replaces it in place. Chains compiled before
    are rebuilt on their next call. Raises ConfigError for a built-in name, a bad position or a
    builder that is not callable.
    """
    global REGISTRY
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"register_layer: name must be an identifier, got {name!r:.60}")
    if name in _BUILT_IN:
        raise ConfigError(f"register_layer: {name!r} is a built-in layer")
    if not callable(build):
        raise ConfigError(
            f"register_layer: build must be a function (stage, bound) -> layer | None, got {build!r:.60}"
        )
    if policy is not None and not callable(policy):
        raise ConfigError(f"register_layer: policy must be a model class, got {policy!r:.60}")
    names = [n for n, _ in REGISTRY if n != name]
    if (before is None) == (after is None):
        raise ConfigError(
            f"register_layer: give exactly one of before= or after= (one of {', '.join(names)})"
        )
    anchor = before if before is not None else after
    if anchor not in names:
        raise ConfigError(
            f"register_layer: no layer {anchor!r:.60} to place {name!r} by; known: {', '.join(names)}"
        )
    registry = [entry for entry in REGISTRY if entry[0] != name]
    at = [n for n, _ in registry].index(anchor) + (0 if before is not None else 1)
    registry.insert(at, (name, build))
    REGISTRY = tuple(registry)
    if policy is None:
        _POLICIES.pop(name, None)
    else:
        _POLICIES[name] = policy
    _inject.epoch += 1  # compiled chains are rebuilt with the new layer


def unregister_layer(name: str) -> None:
    """Take a layer added with :func:`register_layer` out of every chain (no-op when absent)."""
    global REGISTRY
    if name in _BUILT_IN:
        raise ConfigError(f"unregister_layer: {name!r} is a built-in layer")
    if any(n == name for n, _ in REGISTRY):
        REGISTRY = tuple(entry for entry in REGISTRY if entry[0] != name)
        _inject.epoch += 1
    _POLICIES.pop(name, None)


def layer_policy_model(name: str) -> type[Any]:
    """The policy model of the registered layer ``name``; ValueError naming the registered ones."""
    model = _POLICIES.get(name)
    if model is None:
        known = ", ".join(sorted(_POLICIES)) or "none registered"
        raise ValueError(f"unknown layer {shown(name)} (layers with options: {known})")
    return model


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
