"""A stage keyed by deployment: a bounded map of key -> the key's own runtime.

A key (a model, an endpoint, a collection: what a call names) gets its own :class:`Stage`: its
breaker, adaptive limit, throttle, hedge statistics, retry budget, reserve and limits, built from
the stage's one policy with the key's own options over it (``StagePolicy.keys``); the preset's
state (the embedding cache, the rerank batch limit, the token accounts) stays the stage's. Each
function of the stage compiles one chain per key (:class:`KeyedChains`), so a call costs a
dictionary look-up more than an unkeyed one.

Bounded, because keys come from callers (:class:`KeyedStages`):

- the keys named in the policy (``keys``) or declared by a model group are always kept;
- besides those, at most ``max_keys`` at once; a new key past the bound runs on the stage's own
  instance (the *overflow*, shared by every key past the bound, and by calls without a key), so
  no caller's input grows memory, Redis keys or metric series without bound;
- a key with nothing in flight, its breaker closed and no call for ``key_idle_s`` is forgotten when
  room is needed (a sweep, at most once per ``key_idle_s / 4`` while the map is full; a call only
  counts itself, and a sweep that sees a key's count moved takes it as quiet from then on, so a
  key is forgotten ``key_idle_s`` after its last call or later, never sooner): its shared breaker
  is closed and its limits dropped; if it comes back it starts afresh;
- a key's name in Redis keys, breaker names and metric labels is its :func:`~ragguard.options.key_id`:
  bounded in length and charset whatever the caller sent.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from .._args import ArgRef
from .._clock import Clock
from .._errors import ConfigError
from ..options._keyed import MAX_KEY_ID, key_id
from ..pipeline import Call, Scope
from ..pipeline._chain import Chain

if TYPE_CHECKING:
    from ._shapes import Bound, Stage

__all__ = ["Fixed", "KeyGate", "KeyedChains", "KeyedStages", "key_getter"]

KeyOf = Callable[[tuple[Any, ...], dict[str, Any]], Any]
"""A call's key from its arguments (``args``, ``kwargs``): a str, or anything else for none."""

_LATENCY_WEIGHT = 0.2
"""The weight of a new success in a key's latency average (an EWMA)."""


class KeyGate:
    """The outermost gate of a key's chain for a stream or a sync function's call: counts the
    key's calls and those in flight (what eviction and a model group's ``least_busy`` strategy
    read) and, while its stage is ``timed`` (a group's ``latency`` strategy asks for it), the
    average latency of its successes. A stream holds it until it ends. A coroutine function's call
    does the same inline (``_decorate``: a gate would cost a fifth of the call)."""

    scope: ClassVar[Scope] = "call"
    __slots__ = ("stage",)

    def __init__(self, stage: Stage) -> None:
        self.stage = stage

    def enter(self, call: Call) -> Any:
        stage = self.stage
        stage.in_flight += 1
        stage.calls += 1
        return stage.clock() if stage.timed else None

    async def enter_async(self, call: Call) -> Any:  # pragma: no cover - enter never waits
        return self.enter(call)

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        stage = self.stage
        stage.in_flight -= 1
        if token is not None and exc is None:
            timed(stage, token)
        return None


def timed(stage: Stage, started: float) -> None:
    """Add a success that started at ``started`` (the stage's clock) to its latency average."""
    took = stage.clock() - started
    average = stage.latency_s
    stage.latency_s = took if average is None else average + _LATENCY_WEIGHT * (took - average)


class KeyedStages:
    """The keys of stage ``root`` (see the module docstring); ``root`` is the overflow instance.

    ``get(key)`` is the key's runtime (made on first use), or ``root`` past the bound;
    :meth:`peek` the key's runtime if it has one, without making it; :meth:`items` every key
    kept now; :meth:`declare` keeps a key always (a model group's deployment), with options of its
    own. ``overflowed`` counts calls whose key ran on ``root`` for want of room, ``evicted`` the keys
    forgotten.
    """

    def __init__(self, root: Stage) -> None:
        self.root = root
        policy = root.policy
        self.max_keys = policy.max_keys
        self.idle_s = policy.key_idle_s
        self._clock: Clock = root.clock
        self._live: dict[str, Stage] = {}  # by the caller's key (its id when it is too long)
        self._counted = 0  # live keys that count against max_keys (not declared)
        self._declared: dict[str, Mapping[str, Any]] = {name: {} for name in policy.keys}
        self._next_sweep = 0.0
        self.overflowed = 0
        self.evicted = 0

    # -- look-up -----------------------------------------------------------------------------

    def get(self, key: str) -> Stage:
        """The runtime of ``key`` (a caller's str), made on first use; ``root`` when the map is
        full of keys in use."""
        got = self._live.get(key)
        return got if got is not None else self._admit(key)

    def peek(self, key: str) -> Stage | None:
        """The runtime of ``key`` if it has one now (None: it would be made, or overflow)."""
        got = self._live.get(key)
        if got is None and len(key) > MAX_KEY_ID:
            got = self._live.get(key_id(key))
        return got

    def items(self) -> list[tuple[str, Stage]]:
        """``(key id, runtime)`` of every key kept now, declared ones first."""
        stages = sorted(self._live.values(), key=lambda st: not st.declared)
        return [(st.key or "", st) for st in stages]

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[str]:
        return iter([key for key, _ in self.items()])

    def declare(self, key: str, **options: Any) -> Stage:
        """Keep ``key`` (a key id) always, with ``options`` (StagePolicy fields, such as
        ``limits``) over the stage's and its policy's own for it; its runtime. ConfigError when
        it was declared with other options, or when its runtime exists already with others."""
        ident = key_id(key)
        if ident != key:
            raise ConfigError(
                f"stage {self.root.name!r}: {key!r:.60} is not a key id (see ragguard.options.key_id)",
                field="key",
            )
        before = self._declared.get(key)
        if before is not None and before and options and dict(before) != options:
            raise ConfigError(
                f"stage {self.root.name!r}: key {key!r} is declared twice with different options "
                "(two model groups name one deployment with different limits?)"
            )
        if before is None or (options and not before):
            self._declared[key] = options
            old = self._live.pop(key, None)
            if old is not None:
                if not old.declared:
                    self._counted -= 1
                old.forget()
        return self.get(key)

    # -- admission and eviction --------------------------------------------------------------

    def _admit(self, key: str) -> Stage:
        ident = key_id(key)
        held = key if len(key) <= MAX_KEY_ID else ident
        got = self._live.get(held)
        if got is not None:
            return got
        declared = self._declared.get(ident)
        if declared is None:
            if self._counted >= self.max_keys and not self._sweep():
                self.overflowed += 1
                return self.root
            self._counted += 1
        st = self.root.for_key(ident, declared)
        self._live[held] = st
        return st

    def _sweep(self) -> bool:
        """Forget the idle keys (see the module docstring), at most once per ``idle_s / 4``;
        whether there is room now."""
        now = self._clock()
        if now < self._next_sweep:
            return False
        self._next_sweep = now + self.idle_s / 4
        before = now - self.idle_s
        for held, st in list(self._live.items()):
            if st.calls != st.calls_seen:  # used since the last look: quiet from now on at most
                st.calls_seen, st.quiet_since = st.calls, now
                continue
            if st.declared or st.in_flight or st.quiet_since > before or not _closed(st):
                continue
            del self._live[held]
            self._counted -= 1
            self.evicted += 1
            st.forget()
        return self._counted < self.max_keys


def _closed(stage: Stage) -> bool:
    breaker = stage.breaker
    if breaker is None:
        return True
    state = getattr(breaker, "state", None)
    return getattr(state, "value", state) == "closed"


class Fixed(str):
    """A key every call of a function has (``@guard(key=Fixed("primary"))``: a model group's own
    deployment), rather than a parameter's name."""

    __slots__ = ()


class KeyedChains:
    """One keyed function's chains, per key, of stage ``root`` (``bound`` the function).

    :meth:`chain` is the chain a call runs: the key's (its runtime's, behind a :class:`KeyGate`),
    or the root's ``plain`` / ``observed`` one for a call without a str key or past the bound;
    :meth:`plain` the same without observation (the hot path, the key found inline). Chains of
    forgotten keys are dropped once they pass twice the number the map may hold."""

    __slots__ = (
        "_chains", "_fixed", "_limit", "_name", "_position", "at", "bound", "gated", "key_of", "keys", "name",
        "ready", "root",
    )  # fmt: skip

    def __init__(self, root: Stage, bound: Bound, key_of: KeyOf | ArgRef | Fixed) -> None:
        self.root = root
        self.bound = bound
        self._fixed = key_of if isinstance(key_of, Fixed) else None
        self._position = key_of.position if isinstance(key_of, ArgRef) else None
        self._name = key_of.name if isinstance(key_of, ArgRef) else None
        self.key_of: KeyOf | None = None if isinstance(key_of, (ArgRef, Fixed)) else key_of
        self.keys = root.keyed()
        self.gated = bound.stream or bound.threaded
        """Whether its key chains start with a :class:`KeyGate` (else a call counts itself)."""
        self._chains: dict[str, list[Any]] = {}  # key -> [runtime, plain chain, observed chain, gated]
        self.ready: dict[Any, list[Any]] = {}
        """The entries of the keys whose plain chain is compiled, without a gate: what an
        unobserved call of a coroutine function keyed by a parameter or a :class:`Fixed` key (no
        ``key_of``) finds inline (``_decorate``), by its argument at position ``at``
        (``sys.maxsize`` for none: a keyword-only parameter, a :class:`Fixed` key) or named
        ``name`` (None: none, as no keyword argument is); a :class:`Fixed` key's entry is kept
        under None, what that look-up finds for it. The caller checks ``entry[0].alive``, as
        :meth:`entry` does."""
        self.at = sys.maxsize if self._position is None else self._position
        self.name: Any = self._name
        self._limit = 2 * (self.keys.max_keys + len(root.policy.keys)) + 8

    def key(self, call: Call) -> Any:
        """The call's key: its argument, or what the key function says (not a str: none)."""
        fixed = self._fixed
        if fixed is not None:
            return fixed
        position = self._position
        if position is not None and position < len(call.args):
            return call.args[position]
        name = self._name
        if name is not None:
            return call.kwargs.get(name)
        key_of = self.key_of
        return None if key_of is None else key_of(call.args, call.kwargs)

    def entry(self, call: Call, observed: bool) -> list[Any] | None:
        """``[runtime, plain chain, observed chain, gated]`` of ``call``'s key, the chain asked
        for made (None: no str key, or past the bound: the stage's own chain runs it). The chains
        of a stream or of a sync function (``gated``), or of a key whose calls are ``timed``,
        start with a :class:`KeyGate` (``entry[3]``); a coroutine function's call counts itself
        otherwise (see :func:`ragguard._decorate.decorator`)."""
        position = self._position
        args = call.args
        key = args[position] if position is not None and position < len(args) else self.key(call)
        try:
            entry = self._chains.get(key)
        except TypeError:  # an unhashable key: none
            return None
        if entry is not None and entry[2 if observed else 1] is not None and entry[0].alive:
            return entry
        return None if not isinstance(key, str) else self.for_key(key, observed)

    def chain(self, call: Call, root_chain: Chain, observed: bool) -> Chain:
        """The chain ``call`` runs (``root_chain`` without a key, or past the bound)."""
        entry = self.entry(call, observed)
        return root_chain if entry is None else entry[2 if observed else 1]

    def for_key(self, key: str, observed: bool) -> list[Any] | None:
        """The entry of ``key`` (see :meth:`entry`), made if need be; None past the bound."""
        entry = self._chains.get(key)
        if entry is None or not entry[0].alive:
            st = self.keys.get(key)
            if st is self.root:
                return None
            entry = self._chains[key] = [st, None, None, self.gated or st.timed]
            if len(self._chains) > self._limit:
                self._prune()
        at = 2 if observed else 1
        if entry[at] is None:
            st = entry[0]
            entry[at] = st.chain(self.bound, observed=observed, first=KeyGate(st) if entry[3] else None)
        if entry[1] is not None and not entry[3]:
            self.ready[None if self._fixed is not None else key] = entry
        return entry

    def _prune(self) -> None:
        for key in [k for k, entry in self._chains.items() if not entry[0].alive]:
            del self._chains[key]
            self.ready.pop(None if self._fixed is not None else key, None)


def key_getter(stage: Stage, bound: Bound, given: Any) -> KeyOf | ArgRef | Fixed | None:
    """How a call of ``bound`` names its key: ``given`` (``@guard(key=...)``: a parameter name or
    position, a function of the call's arguments, or a :class:`Fixed` key), else the stage
    policy's ``key`` (a parameter name); None when the function is not keyed. ConfigError when
    the function has no such parameter."""
    if given is None:
        name = stage.policy.key
        if name is None:
            return None
        try:
            return ArgRef.resolve(bound.fn, name, "key")
        except ConfigError as exc:
            raise ConfigError(f"stages.{stage.name}.key: {exc}", field=f"stages.{stage.name}.key") from None
    if isinstance(given, Fixed):
        return given
    if callable(given):
        return lambda args, kwargs: given(*args, **kwargs)
    return ArgRef.resolve(bound.fn, given, "key")
