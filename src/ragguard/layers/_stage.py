"""A stage's shared runtime (:class:`Stage`), one decorated function (:class:`Bound`), and the
preset contract (:class:`StagePreset`) through which the RAG presets add their layers."""

from __future__ import annotations

import inspect
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar

from .._clock import Clock
from .._errors import ConfigError
from ..breakers import Breaker, counts_by_default
from ..options import StagePolicy
from ..pipeline import BuildContext, Layer
from ..pipeline._chain import Chain
from ..pipeline._threads import held
from ._breaker import make_breaker
from ._fallback import Fallback, UserFallback
from ._keys import KeyedStages
from ._registry import build_layers
from ._retry import RetryBudget, make_budget

__all__ = ["Bound", "Stage", "StagePreset", "forget_idle"]

log = logging.getLogger("ragguard")

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

    ``fallbacks`` are the user's, in order; ``routes`` the user's routed fallbacks (a caller's-error
    reason such as ``context_length`` -> its fallbacks, in order); ``breaker`` the one given
    (adapted), False for none, or None (the policy's);
    ``options`` the preset keywords as given, resolved per preset on first use (:meth:`resolved`);
    ``threaded``: a sync function, run in worker threads (:mod:`ragguard.pipeline._threads`).
    """

    __slots__ = (
        "_resolved", "breaker", "fallbacks", "fn", "options", "routes", "stage", "stream", "threaded",
    )

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
        routes: Mapping[str, Sequence[Callable[..., Any]]] | None = None,
    ) -> None:
        self.stage = stage
        self.fn = fn
        self.stream = stream
        self.threaded = threaded
        self.fallbacks: tuple[Fallback, ...] = tuple(UserFallback(f) for f in fallbacks)
        self.routes: dict[str, tuple[Fallback, ...]] = {
            reason: tuple(UserFallback(f) for f in chain) for reason, chain in (routes or {}).items() if chain
        }
        _check_error_parameter(stage, fn, (*self.fallbacks, *(f for c in self.routes.values() for f in c)))
        self.breaker = breaker
        self.options: dict[str, Any] = dict(options or {})
        self._resolved: dict[str, Any] = {}

    def check(self, chosen: StagePreset | None) -> None:
        """Validate the preset options against ``chosen``, the preset the stage runs (at
        decoration, and again if a new policy gives the stage another preset); ConfigError."""
        given = set(self.options)
        if chosen is None:
            if given:
                raise ConfigError(
                    f"guard({self.stage!r}): option(s) {sorted(given)} belong to a stage preset, and "
                    "this stage has none (set its policy's preset)"
                )
            return
        foreign = given - chosen.option_names
        if foreign:
            raise ConfigError(
                f"guard({self.stage!r}): option(s) {sorted(foreign)} do not apply to the "
                f"{chosen.name!r} preset (its options: {sorted(chosen.option_names) or 'none'})"
            )
        if self.stream and not chosen.streams:
            raise ConfigError(
                f"guard({self.stage!r}): the {chosen.name!r} preset does not guard async generators"
            )
        self.resolved(chosen)

    def resolved(self, preset: StagePreset) -> Any:
        """What ``preset`` made of this function's options (validated once per preset)."""
        got = self._resolved.get(preset.name)
        if got is None and preset.name not in self._resolved:
            got = self._resolved[preset.name] = preset.resolve(self.fn, self.options)
        return got


def _check_error_parameter(stage: str, fn: Callable[..., Any], fallbacks: Sequence[Fallback]) -> None:
    """ConfigError when a fallback asks for ``error=`` (the exception it replaces) and the guarded
    function takes an argument of that name too: the two could not both be passed."""
    wanting = [f.name for f in fallbacks if getattr(f, "wants_error", False)]
    if not wanting:
        return
    try:
        taken = "error" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    if taken:
        raise ConfigError(
            f"guard({stage!r}): fallback {wanting[0]!r} declares error= to receive the exception it "
            "replaces, and the guarded function has a parameter named error too: rename one",
            field="fallback",
        )


class Stage:
    """The shared runtime of one named stage in one Guard: its policy, breaker, retry budget,
    preset state and the parts its layers keep (:meth:`part`). Every function decorated with the
    stage's name shares it; each gets its own compiled chain (:meth:`chain`), since fallbacks are
    given per function. ``context`` is the Guard's :class:`~ragguard.pipeline.BuildContext`: the
    services a layer is built with (a layer never reaches the Guard itself).

    A keyed stage (:mod:`ragguard.layers._keys`) has one more runtime per key (:meth:`for_key`):
    ``key`` is its key id (None for the stage's own), ``label`` the name of its breaker
    (``stage[key]``); it shares the stage's ``preset_state``. ``keys`` is the stage's map of them
    (None until a keyed function runs it); ``in_flight``, ``calls`` and ``latency_s`` (the
    average latency of its successes while ``timed``, seconds, None before one) are kept by its
    calls (:mod:`ragguard.layers._keys`)."""

    def __init__(
        self,
        context: BuildContext,
        name: str,
        policy: StagePolicy,
        preset: StagePreset | None,
        breaker: Breaker | Literal[False] | None = None,
        *,
        key: str | None = None,
        parent: Stage | None = None,
    ) -> None:
        self.context = context
        self.name = name
        self.key = key
        self.label = name if key is None else f"{name}[{key}]"
        self.policy = policy
        self.clock: Clock = context.clock
        self._parts: dict[str, Any] = {}
        self._forget: list[Callable[[], Any]] = []
        self.preset = preset
        self.alive = True
        self.declared = False
        self.in_flight = 0
        self.calls = 0
        self.timed = False  # the key's calls are timed (a group's latency strategy reads it)
        self.calls_seen = 0  # the calls counted when its map last looked (see KeyedStages._sweep)
        self.quiet_since = self.clock()
        self.latency_s: float | None = None
        self.keys: KeyedStages | None = None
        self.breaker: Breaker | None = make_breaker(self, breaker)
        close = getattr(self.breaker, "aclose", None)
        if key is not None and close is not None:
            self.on_forget(lambda: context.release(close))
        self.counts: Callable[[BaseException], bool] = (
            self.breaker.classifier if self.breaker is not None else counts_by_default
        )
        self.budget: RetryBudget | None = make_budget(self)
        if parent is not None:
            self.preset_state: Any = parent.preset_state
        else:
            self.preset_state = None if preset is None else preset.state(self)
        self.users: weakref.WeakSet[Any] = weakref.WeakSet()
        """The decorated functions' compiled chains that run this stage (held weakly): a stage
        with users is never forgotten by its Guard's ``max_stages`` bound."""

    # -- keys ---------------------------------------------------------------------------------

    def keyed(self) -> KeyedStages:
        """The stage's keys (made on first use: a function keyed in code, or by the policy's ``key``)."""
        keys = self.keys
        if keys is None:
            keys = self.keys = KeyedStages(self)
        return keys

    def for_key(self, key: str, declared: Mapping[str, Any] | None = None) -> Stage:
        """A new runtime for key ``key`` (a key id): the stage's policy with the key's options
        over it (the policy's ``keys`` entry, then ``declared``: layer name -> options, when
        the key is declared)."""
        policy = self.policy.for_key(key)
        if declared:  # layers' options (a model group's deployment limits)
            policy = policy.model_copy(update={"layers": {**policy.layers, **declared}})
        breaker: Literal[False] | None = None if self.breaker is not None else False  # as the stage
        made = Stage(self.context, self.name, policy, self.preset, breaker, key=key, parent=self)
        made.declared = declared is not None
        return made

    def on_forget(self, forget: Callable[[], Any]) -> None:
        """Call ``forget()`` when this key's runtime is forgotten (its map made room)."""
        self._forget.append(forget)

    def forget(self) -> None:
        """This key's runtime is no longer used: release what it holds (its shared breaker, its
        limits) and mark it dead, so the chains compiled for it are dropped."""
        self.alive = False
        forgets, self._forget = self._forget, []
        for forget in forgets:
            forget()

    @property
    def counts_tokens(self) -> bool:
        """Whether the stage's streams count their tokens (the generation preset's do)."""
        return bool(getattr(self.preset, "counts_tokens", False))

    def check_breaker(self, given: Breaker | Literal[False] | None) -> None:
        """ConfigError when a function of the stage gives a breaker the stage does not have:
        ``False`` for a stage that has one, or a second, different one."""
        if given is False:
            if self.breaker is not None:
                raise ConfigError(f"stage {self.name!r} has a breaker; breaker=False needs a stage without")
        elif not any(given is b for b in (None, self.breaker, getattr(self.breaker, "wrapped", None))):
            raise ConfigError(f"stage {self.name!r} already has a breaker; give one breaker per stage")

    def part(self, key: str, make: Callable[[], T]) -> T:
        """The per-stage state ``key`` of a layer (``"limiter"``, ``"throttle"``, ``"hedge"``, a
        user layer's own), made by ``make()`` on first use and shared by every function of the
        stage; forgotten with the stage. What must be stopped is registered with
        ``stage.context.on_close`` (closed with the Guard)."""
        got = self._parts.get(key)
        if got is None:
            got = self._parts[key] = make()
        return got

    def parts(self) -> dict[str, Any]:
        """The parts made so far (key -> object), for status snapshots."""
        return dict(self._parts)

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
        return self.context.per_call_quota or bool(self.preset_layers(bound))

    def chain(self, bound: Bound, *, observed: bool = False, first: Layer | None = None) -> Chain:
        """Compile ``bound``'s chain of layers (see :mod:`ragguard.layers`), ``first`` outermost."""
        layers = build_layers(self, bound, observed=observed)
        if first is not None:
            layers.insert(0, first)
        return Chain(held(layers) if bound.threaded else layers, self.context.classify)

    def __repr__(self) -> str:
        return f"<Stage {self.label!r} preset={None if self.preset is None else self.preset.name!r}>"


def forget_idle(stages: dict[str, Stage], max_stages: int, *, warn: bool) -> None:
    """Forget the oldest idle stages of ``stages`` down to 90% of ``max_stages`` (``warn``: log
    why, once per Guard). Idle: no live decorated function runs it (see :attr:`Stage.users`) and
    its breaker is closed (or absent), so a stage in use, or with an open, half-open or forced
    breaker, is never forgotten (health checks keep seeing it); a forgotten stage starts afresh
    if its name comes back."""
    if warn:
        log.warning(
            "Guard holds %d stages (max_stages): stage names should name code paths, not data; "
            "forgetting the oldest idle ones",
            len(stages),
        )
    target = int(max_stages * 0.9)
    for name, st in list(stages.items()):
        if len(stages) <= target:
            return
        if st.users:
            continue
        state = getattr(st.breaker, "state", None)
        if st.breaker is None or getattr(state, "value", state) == "closed":
            del stages[name]
            for _, key in () if st.keys is None else st.keys.items():
                key.forget()  # its keys go with it: their shared breakers stop
