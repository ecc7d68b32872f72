"""The layers' builders by name, in the chain order the options keep.

The options side (:mod:`ragguard.options._layers`: each layer's name, chain position and options
model) is data the policy reads; this side is the code that builds the layers: the built-in
layers' ``build(stage, bound)`` functions, imported here from their files, and those given to
:func:`register_layer`. :data:`REGISTRY` is the chain as (name, builder) pairs, outermost first.

The stage presets have a registry of their own (:mod:`ragguard.layers._presets`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

from .. import _inject
from .._errors import ConfigError
from ..options import _layers as _options
from . import _adaptive as adaptive
from . import _attempts
from . import _breaker as breaker
from . import _chaos as chaos
from . import _deadline as deadline
from . import _fallback as fallback
from . import _hedge as hedge
from . import _limits as limits
from . import _observe as observe
from . import _quota as quota
from . import _reserve as reserve
from . import _retry as retry
from . import _share as share
from . import _throttle as throttle
from . import _timeout as timeout

if TYPE_CHECKING:
    from ..pipeline import Layer
    from ._shapes import Bound, Stage

__all__ = ["REGISTRY", "build_layers", "register_layer", "unregister_layer"]

Builder = Callable[[Any, Any], Any]


def _preset(stage: Stage, bound: Bound) -> Sequence[Layer]:
    return stage.preset_layers(bound)


def _preset_attempt(stage: Stage, bound: Bound) -> Sequence[Layer]:
    return stage.preset_attempt_layers(bound)


_builds: dict[str, Builder] = {
    "observe": observe.build,
    "share": share.build,
    "fallback": fallback.build,
    "reserve": reserve.build,
    "deadline": deadline.build,
    "quota": quota.build,
    "preset": _preset,
    "limits": limits.build,
    "retry": retry.build,
    "hedge": hedge.build,
    "attempt_span": _attempts.build,
    "throttle": throttle.build,
    "adaptive": adaptive.build,
    "breaker": breaker.build,
    "preset_attempt": _preset_attempt,
    "timeout": timeout.build,
    "chaos": chaos.build,
}
assert set(_builds) == _options.BUILT_IN, "every built-in layer has a builder, and only those"


class _Chain(Sequence[tuple[str, Builder]]):
    """The registered layers as (name, builder) pairs, outermost first, as they are now (a view:
    it follows :func:`register_layer` and :func:`unregister_layer`)."""

    def _pairs(self) -> list[tuple[str, Builder]]:
        return [(name, _builds[name]) for name in _options.names()]

    @overload
    def __getitem__(self, index: int) -> tuple[str, Builder]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[str, Builder]]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return self._pairs()[index]

    def __len__(self) -> int:
        return len(_options.names())

    def __iter__(self) -> Iterator[tuple[str, Builder]]:
        return iter(self._pairs())

    def __repr__(self) -> str:
        return f"REGISTRY({', '.join(_options.names())})"


REGISTRY: Sequence[tuple[str, Builder]] = _Chain()
"""Every layer's name and builder, outermost first (see docs/layers.md for the order)."""


_OBSERVING = frozenset({"observe", "attempt_span"})
"""The layers only an observed chain has (see :mod:`ragguard._decorate`)."""


def build_layers(stage: Stage, bound: Bound, *, observed: bool = False) -> list[Layer]:
    """The layers of ``bound``'s chain, outermost first (``observe`` and ``attempt_span`` only
    when ``observed``)."""
    layers: list[Layer] = []
    for name in _options.names():
        if not observed and name in _OBSERVING:
            continue
        made = _builds[name](stage, bound)
        if made is None:
            continue
        if isinstance(made, (list, tuple)):
            layers.extend(made)
        else:
            layers.append(made)
    return _fused(layers)


def _fused(layers: list[Layer]) -> list[Layer]:
    """``layers`` with a stage's share, its fallback and its reserve (adjacent, in that order, the
    reserve optional) made one gate just inside the fallback: the share's deadline and the
    reserve's in one :class:`~ragguard.layers._reserve.ReserveLayer`, and the fallback serving
    under the share's deadline itself (from ``Call.share_at``). Every layer reads the deadline
    it read before; a call pays one gate and one context variable instead of two, and no coroutine
    frame for a node of the share's own (a gate outside a recovery needs one: a node's recoveries
    come first). benchmarks/deadline_budget.py measures it."""
    for i in range(len(layers) - 1):
        outer, fallen = layers[i], layers[i + 1]
        if type(outer) is share.ShareLayer and type(fallen) is fallback.FallbackLayer:
            after = layers[i + 2] if i + 2 < len(layers) else None
            kept = after if type(after) is reserve.ReserveLayer and after.share == 1.0 else None
            gate = reserve.ReserveLayer(outer.stage, None if kept is None else kept.reserve, outer.share)
            layers[i : i + 2 + (kept is not None)] = [fallen, gate]
            break
    return layers


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
    leaves the layer out of that chain); ``policy`` is the layer's options model (a pydantic model
    or any class taking the options as keywords): a stage's ``layers: {name: {...}}`` entry is
    validated by it when the policy loads, or, for a policy loaded before this call, when a Guard
    builds the stage; ``stage.layer_policy(name)`` returns it (None when the stage has no entry).
    Registering a name again replaces it in place. Chains compiled before are rebuilt on their
    next call. Raises ConfigError for a built-in name, a bad position or a builder that is not
    callable."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"register_layer: name must be an identifier, got {name!r:.60}")
    if name in _options.BUILT_IN:
        raise ConfigError(f"register_layer: {name!r} is a built-in layer")
    if not callable(build):
        raise ConfigError(
            f"register_layer: build must be a function (stage, bound) -> layer | None, got {build!r:.60}"
        )
    if policy is not None and not callable(policy):
        raise ConfigError(f"register_layer: policy must be a model class, got {policy!r:.60}")
    names = [known for known in _options.names() if known != name]
    if (before is None) == (after is None):
        raise ConfigError(
            f"register_layer: give exactly one of before= or after= (one of {', '.join(names)})"
        )
    anchor = before if before is not None else after
    if anchor not in names:
        raise ConfigError(
            f"register_layer: no layer {anchor!r:.60} to place {name!r} by; known: {', '.join(names)}"
        )
    _builds[name] = build
    _options.place(name, policy, names.index(anchor) + (0 if before is not None else 1))
    _inject.epoch += 1  # compiled chains are rebuilt with the new layer


def unregister_layer(name: str) -> None:
    """Take a user layer out of every chain (no-op when absent)."""
    if name in _options.BUILT_IN:
        raise ConfigError(f"unregister_layer: {name!r} is a built-in layer")
    if _options.registered(name):
        _options.remove(name)
        del _builds[name]
        _inject.epoch += 1
