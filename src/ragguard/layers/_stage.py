"""A stage's shared runtime (:class:`Stage`), one decorated function (:class:`Bound`), and the
preset contract (:class:`StagePreset`) through which the RAG presets add their layers."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from .._clock import Clock
from ..breakers import Breaker, counts_by_default
from ..pipeline import Chain, Layer
from ..pipeline._threads import held
from ..policy import StagePolicy
from .breaker import make_breaker
from .fallback import Fallback, UserFallback
from .retry import RetryBudget, make_budget

if TYPE_CHECKING:
    from ..guard import Guard

__all__ = ["Bound", "Stage", "StagePreset"]

T = TypeVar("T")


class StagePreset(Protocol):
    """What a named preset (``ragguard.rag``: embedding, vector_store, rerank, ...) adds to a stage.

    - ``name``; ``streams``: whether an async generator function may use it;
    - ``option_names``: the ``@guard(...)`` keywords it takes; ``resolve(fn, given)`` validates
      them against the decorated function at decoration (ConfigError naming the option) and
      returns what its layers need (where the texts or candidates are...);
    - ``state(stage)``: the state shared by every function of the stage (a cache, a batch limit);
    - ``layers(stage, bound)``: layers placed inside the fallbacks and outside the retries;
    - ``attempt_layers(stage, bound)``: layers placed inside each attempt (inside the retries and
      the breaker, which count what they raise);
    - ``fallbacks(stage, bound, users)``: the full fallback chain, the user's among the preset's.
    """

    name: str
    streams: bool
    option_names: frozenset[str]

    def resolve(self, fn: Callable[..., Any], given: Mapping[str, Any]) -> Any: ...

    def state(self, stage: Stage) -> Any: ...

    def layers(self, stage: Stage, bound: Bound) -> Sequence[Layer]: ...

    def attempt_layers(self, stage: Stage, bound: Bound) -> Sequence[Layer]: ...

    def fallbacks(self, stage: Stage, bound: Bound, users: Sequence[Fallback]) -> Sequence[Fallback]: ...


class Bound:
    """One decorated function: its stage name and the options given to ``@guard``.

    ``fallbacks`` are the user's, in order; ``breaker`` the one given (adapted), False for none,
    or None (the policy's);
    ``options`` the preset keywords as given, resolved per preset on first use (:meth:`resolved`);
    ``threaded``: a sync function, run in worker threads (:mod:`ragguard.pipeline._threads`).
    """

    __slots__ = ("_resolved", "breaker", "fallbacks", "fn", "options", "stage", "stream", "threaded")

    def __init__(
        self,
        stage: str,
        fn: Callable[..., Any],
        *,
        stream: bool,
        fallbacks: Sequence[Callable[..., Any]] = (),
        breaker: Breaker | Literal[False] | None = None,
        options: Mapping[str, Any] | None = None,
        threaded: bool = False,
    ) -> None:
        self.stage = stage
        self.fn = fn
        self.stream = stream
        self.threaded = threaded
        self.fallbacks: tuple[Fallback, ...] = tuple(UserFallback(f) for f in fallbacks)
        self.breaker = breaker
        self.options: dict[str, Any] = dict(options or {})
        self._resolved: dict[str, Any] = {}

    def resolved(self, preset: StagePreset) -> Any:
        """What ``preset`` made of this function's options (validated once per preset)."""
        got = self._resolved.get(preset.name)
        if got is None and preset.name not in self._resolved:
            got = self._resolved[preset.name] = preset.resolve(self.fn, self.options)
        return got


class Stage:
    """The shared runtime of one named stage in one Guard: its policy, breaker, retry budget and
    preset state. Every function decorated with the stage's name shares it; each gets its own
    compiled chain (:meth:`chain`), since fallbacks are given per function."""

    def __init__(
        self,
        guard: Guard,
        name: str,
        policy: StagePolicy,
        preset: StagePreset | None,
        breaker: Breaker | Literal[False] | None = None,
    ) -> None:
        self.guard = guard
        self.name = name
        self.policy = policy
        self.clock: Clock = guard.clock
        self.preset = preset
        self.breaker: Breaker | None = make_breaker(self, breaker)
        self.counts: Callable[[BaseException], bool] = (
            self.breaker.classifier if self.breaker is not None else counts_by_default
        )
        self.budget: RetryBudget | None = make_budget(self)
        self.preset_state: Any = None if preset is None else preset.state(self)
        self._parts: dict[str, Any] = {}
        self.users: weakref.WeakSet[Any] = weakref.WeakSet()
        """The decorated functions' compiled chains that run this stage (held weakly): a stage
        with users is never forgotten by its Guard's ``max_stages`` bound."""

    def part(self, key: str, make: Callable[[], T]) -> T:
        """The per-stage state ``key`` of a layer (a user layer's own), made by ``make()`` on first
        use and shared by every function of the stage; forgotten with the stage."""
        got = self._parts.get(key)
        if got is None:
            got = self._parts[key] = make()
        return got

    @property
    def timeout_s(self) -> float | None:
        """The stage's attempt timeout in seconds (None: only the deadline bounds an attempt)."""
        return self.policy.timeout_s

    def layer_policy(self, name: str) -> Any:
        """The stage's options for the registered layer ``name`` (its policy model), or None when
        the stage's policy has no ``layers`` entry for it (see :func:`ragguard.layers.register_layer`)."""
        return self.policy.layer(name)

    def preset_layers(self, bound: Bound) -> Sequence[Layer]:
        return () if self.preset is None else self.preset.layers(self, bound)

    def preset_attempt_layers(self, bound: Bound) -> Sequence[Layer]:
        return () if self.preset is None else self.preset.attempt_layers(self, bound)

    def fallbacks_for(self, bound: Bound) -> Sequence[Fallback]:
        """The fallback chain of ``bound``'s calls: the preset's around the user's."""
        if self.preset is None:
            return bound.fallbacks
        return self.preset.fallbacks(self, bound, bound.fallbacks)

    def admits_before_attempt(self, bound: Bound) -> bool:
        """Whether a call can wait or work before its first attempt (an admission, a preset
        layer): then it checks its deadline first."""
        return self.guard.per_call_quota or bool(self.preset_layers(bound))

    def chain(self, bound: Bound, *, observed: bool = False) -> Chain:
        """Compile ``bound``'s chain of layers (see :mod:`ragguard.layers`)."""
        from . import build_layers

        layers = build_layers(self, bound, observed=observed)
        return Chain(held(layers) if bound.threaded else layers)

    def __repr__(self) -> str:
        return f"<Stage {self.name!r} preset={None if self.preset is None else self.preset.name!r}>"
