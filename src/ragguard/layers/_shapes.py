"""What a layer reads of its stage and of the decorated function, as Protocols.

A layer's file annotates its ``build(stage, bound)`` and helpers with :class:`Stage` and
:class:`Bound` from here, never with the runtime classes of :mod:`ragguard.layers._stage`: the
runtime builds its stages from the layers' files (the registry's builders, the breaker, the retry
budget, the keys, the fallbacks), so the layers' dependency runs one way, runtime -> layers ->
these shapes. The objects a layer is given are always :class:`ragguard.layers._stage.Stage` and
:class:`ragguard.layers._stage.Bound` (a stage's own runtime or a key's), which match these
Protocols: mypy checks it wherever one is passed. This module imports no layer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, Self, TypeVar, runtime_checkable

from .._clock import Clock
from ..breakers import Breaker
from ..options import StagePolicy
from ..pipeline import BuildContext, Call, Layer
from ..pipeline._chain import Chain

__all__ = ["Bound", "Budget", "Fallback", "Keys", "Named", "Stage"]

T = TypeVar("T")


@runtime_checkable
class Fallback(Protocol):
    """One way to answer a failed call: ``name`` (reported by :func:`ragguard.degraded`) and
    ``serve(call, exc)``, which returns the answer or raises
    (:class:`~ragguard.layers._fallback.FallbackMiss` to pass)."""

    name: str

    async def serve(self, call: Call, exc: Exception) -> Any: ...


class Budget(Protocol):
    """A retry budget (:class:`ragguard.layers._retry.RetryBudget`): ``on_call(now)`` counts a
    first attempt at clock time ``now``, ``try_spend()`` takes one retry (False: spent),
    ``refund()`` gives one back."""

    def on_call(self, now: float) -> None: ...

    def try_spend(self) -> bool: ...

    def refund(self) -> None: ...


class Named(Protocol):
    """A stage's preset as a layer reads it: its name (:class:`ragguard.layers.StagePreset`)."""

    @property
    def name(self) -> str: ...


class Keys(Protocol):
    """A stage's keys as a keyed function reads them (:class:`ragguard.layers._keys.KeyedStages`):
    ``get(key)`` is the key's runtime (the stage's own past ``max_keys``)."""

    max_keys: int

    def get(self, key: str) -> Stage: ...


class Bound(Protocol):
    """What a layer reads of one decorated function (:class:`ragguard.layers._stage.Bound`)."""

    fn: Callable[..., Any]
    stream: bool
    threaded: bool
    routes: dict[str, tuple[Fallback, ...]]


class Stage(Protocol):
    """What a layer reads of a stage's runtime (:class:`ragguard.layers._stage.Stage`, whose
    docstring says what each member is); the counters are written by a key's calls
    (:mod:`ragguard.layers._keys`)."""

    context: BuildContext
    name: str
    key: str | None
    label: str
    policy: StagePolicy
    clock: Clock
    declared: bool
    in_flight: int
    calls: int
    timed: bool
    calls_seen: int
    quiet_since: float
    latency_s: float | None
    breaker: Breaker | None
    counts: Callable[[BaseException], bool]

    @property
    def preset(self) -> Named | None: ...

    @property
    def budget(self) -> Budget | None: ...

    @property
    def counts_tokens(self) -> bool: ...

    def keyed(self) -> Keys: ...

    def for_key(self, key: str, declared: Mapping[str, Any] | None = None) -> Self: ...

    def on_forget(self, forget: Callable[[], Any]) -> None: ...

    def forget(self) -> None: ...

    def part(self, key: str, make: Callable[[], T]) -> T: ...

    # ``bound`` is the runtime's Bound, which the runtime hands on to its preset (the preset's
    # contract names the runtime's classes): a layer passes the one it was given.
    def preset_layers(self, bound: Any) -> Sequence[Layer]: ...

    def preset_attempt_layers(self, bound: Any) -> Sequence[Layer]: ...

    def fallbacks_for(self, bound: Any) -> Sequence[Fallback]: ...

    def admits_before_attempt(self, bound: Any) -> bool: ...

    def chain(self, bound: Any, *, observed: bool = False, first: Layer | None = None) -> Chain: ...
