"""What ``@guard("stage")`` makes of a function: the wrapper that runs the stage's chain.

A decorated function keeps one compiled chain per Guard (:class:`_Compiled`), rebuilt when the
chaos injection epoch or the Guard changes, and a second, observed chain (with the observe layer)
picked only while the event bus has listeners or tracing is on (:data:`ragguard.events.tracer`),
so an unobserved call pays nothing for observation. ``registry`` is a Guard, or a function
returning the default one (looked up per call, so :func:`ragguard.configure` takes effect).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any, ParamSpec, Protocol, TypeVar, overload

from . import _inject, events
from ._errors import ConfigError
from .events import bus
from .layers import Bound, Stage
from .layers._breaker import adapt_breaker
from .layers._fallback import ROUTES, user_fallbacks, user_routes
from .layers._keys import KeyedChains, key_getter
from .layers._presets import PRESETS, preset
from .pipeline import Call
from .pipeline._chain import Chain, GuardedStream
from .pipeline._threads import limiter_for, thread_call

__all__ = ["GuardDecorator", "check_preset", "decorator"]

P = ParamSpec("P")
R = TypeVar("R")
Y = TypeVar("Y")


class GuardDecorator(Protocol):
    """What ``guard(...)`` returns: keeps the decorated function's signature (ParamSpec)."""

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Callable[P, Coroutine[Any, Any, R]]: ...
    @overload
    def __call__(self, fn: Callable[P, AsyncIterator[Y]], /) -> Callable[P, GuardedStream[Y]]: ...  # type: ignore[overload-overlap]
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Callable[P, Coroutine[Any, Any, R]]: ...


class _Compiled:
    """A decorated function's chains for one Guard, valid while ``epoch`` is the injection epoch.

    ``keyed``: the function's chains per key when its stage is keyed for it (``plain`` and
    ``observed`` are then those of the stage's own instance: calls without a key, or past the
    bound); ``inline``: the same when its key is an argument or fixed, so that a call finds it
    inline (``KeyedChains.ready``), else None (a key function's); ``run`` is the plain chain's
    driver, awaited directly, for a function that is not."""

    __slots__ = (
        "__weakref__", "bound", "epoch", "guard", "inline", "keyed", "observed", "plain", "run", "stage",
    )  # fmt: skip

    def __init__(
        self, guard: Any, stage: Stage | None, bound: Bound | None, keyed: KeyedChains | None = None
    ) -> None:
        self.guard = guard
        self.stage = stage
        self.bound = bound
        self.plain: Chain | None = None if stage is None or bound is None else stage.chain(bound)
        self.keyed = keyed
        self.inline = None if keyed is None or keyed.key_of is not None else keyed
        self.run: Callable[..., Awaitable[Any]] | None = (
            None if self.plain is None or keyed is not None else self.plain.run
        )
        self.observed: Chain | None = None
        self.epoch = _inject.epoch
        if stage is not None:
            stage.users.add(self)  # the stage is in use while this function's chains live

    def chain(self, call: Call) -> Chain:
        """The chain ``call`` runs: observed while the event bus has listeners or tracing is on;
        its key's, for a keyed function."""
        observed = bus.active or events.tracer is not None
        root = self.own(observed)
        keyed = self.keyed
        return root if keyed is None else keyed.chain(call, root, observed)

    def own(self, observed: bool) -> Chain:
        """The chain of the stage's own instance (observed or not)."""
        if observed:
            root = self.observed
            if root is None:
                assert self.stage is not None and self.bound is not None
                root = self.observed = self.stage.chain(self.bound, observed=True)
            return root
        assert self.plain is not None
        return self.plain


def _keyed(g: Any, st: Stage, bound: Bound, key: Any) -> KeyedChains | None:
    """The per-key chains of ``bound`` in stage ``st`` when it is keyed (``key``: ``@guard(key=...)``,
    else the stage policy's), else None; ConfigError for a key and a breaker of one's own."""
    key_of = key_getter(st, bound, key)
    if key_of is None:
        return None
    if bound.breaker is not None and bound.breaker is not False:
        raise ConfigError(
            f"guard({bound.stage!r}): a keyed stage builds a breaker per key from its policy; "
            "breaker= gives one for all: set the breaker in the policy instead",
            field="breaker",
        )
    return KeyedChains(st, bound, key_of)


def check_preset(g: Any, bound: Bound) -> None:
    """Validate ``bound``'s preset options against the preset its stage runs in Guard ``g``."""
    bound.check(preset(g.policy.stage(bound.stage).preset))


def decorator(stage: str, registry: Any, options: Mapping[str, Any]) -> Any:
    """The decorator of ``@guard(stage, **options)`` for ``registry`` (a Guard, or a function
    returning the default one); ConfigError for a bad stage name or option."""
    if not isinstance(stage, str) or not stage:
        raise ConfigError(f"guard: stage must be a non-empty str, got {stage!r:.60}")
    own = frozenset({"fallback", "breaker", "key", *ROUTES})
    known = own.union(*(p.option_names for p in PRESETS.values()))
    unknown = set(options) - known
    if unknown:
        raise ConfigError(f"guard: unknown option(s) {sorted(unknown)}; allowed: {sorted(known)}")
    fallbacks = user_fallbacks(options.get("fallback"))
    routes = user_routes(options)
    breaker = options.get("breaker")
    if breaker is not None and breaker is not False:
        breaker = adapt_breaker(breaker)
    key = options.get("key")
    if key is not None and not callable(key) and (isinstance(key, bool) or not isinstance(key, (int, str))):
        raise ConfigError(
            f"guard: key must be a parameter name or position, or a function of the call's arguments, "
            f"got {type(key).__name__}",
            field="key",
        )
    preset_options = {k: v for k, v in options.items() if k not in own and v is not None}

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise ConfigError(f"guard({stage!r}) decorates a callable, got {type(fn).__name__}")
        stream = inspect.isasyncgenfunction(fn)
        # every callable has a __call__: test that it is async, else a sync function slips through
        method = getattr(fn, "__call__", None)  # noqa: B004 - the method itself, not callability
        threaded = not stream and not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(method))
        if threaded and (inspect.isgeneratorfunction(fn) or inspect.isgeneratorfunction(method)):
            raise ConfigError(
                f"guard({stage!r}) does not guard a sync generator function ({fn!r:.60}): its "
                "items would each cross a thread and could not be closed while one waits; guard "
                "an async generator (an async client's stream) instead"
            )
        bound = Bound(
            stage, fn, stream=stream, fallbacks=fallbacks, breaker=breaker, options=preset_options,
            threaded=threaded, routes=routes,
        )
        fixed = None if callable(registry) else registry  # a Guard is not callable; the default's lookup is
        check_preset(fixed if fixed is not None else registry(), bound)
        slot = _Compiled(None, None, None)

        def compiled(g: Any) -> _Compiled:
            nonlocal slot
            current = slot
            if current.guard is not g or current.epoch != _inject.epoch:
                st = g.stage(stage, breaker=breaker)
                check_preset(g, bound)
                current = slot = _Compiled(g, st, bound, _keyed(g, st, bound, key))
            return current

        def chain(g: Any, call: Call) -> Chain:
            return compiled(g).chain(call)

        get_guard: Callable[[], Any] = registry if fixed is None else lambda: fixed
        compiled(get_guard())
        # built at decoration: a bad breaker or preset option fails here, and the stage is listed by
        # Guard.status() before its first call

        if threaded:

            @functools.wraps(fn)
            async def guarded_sync(*args: Any, **kwargs: Any) -> Any:
                g = fixed if fixed is not None else get_guard()
                c = compiled(g)
                call = thread_call(stage, fn, args, kwargs, limiter_for(c.stage))
                return await c.chain(call).run(call)

            guarded_sync.__ragguard_stage__ = stage  # type: ignore[attr-defined]
            return guarded_sync

        if stream:

            @functools.wraps(fn)
            def guarded_stream(*args: Any, **kwargs: Any) -> GuardedStream[Any]:
                g = fixed if fixed is not None else get_guard()
                call = Call(stage, fn, args, kwargs, True)
                return chain(g, call).stream(call)

            guarded_stream.__ragguard_stage__ = stage  # type: ignore[attr-defined]
            return guarded_stream

        @functools.wraps(fn)
        async def guarded(*args: Any, **kwargs: Any) -> Any:
            g = fixed if fixed is not None else get_guard()
            c = slot
            entry = None
            if c.guard is g and c.epoch == _inject.epoch:
                if not bus.active and events.tracer is None:
                    run = c.run
                    if run is not None:  # the hot path: an unkeyed stage, nobody observing
                        return await run(Call(stage, fn, args, kwargs))
                    observed = False
                    keyed = c.inline
                    if keyed is not None:  # its key's entry when ready (see KeyedChains.ready), inline
                        at = keyed.at
                        try:
                            entry = keyed.ready.get(args[at] if at < len(args) else kwargs.get(keyed.name))
                        except TypeError:  # an unhashable key: none
                            pass
                else:
                    if c.observed is not None and c.keyed is None:  # observed: its chain is compiled already
                        return await c.observed.run(Call(stage, fn, args, kwargs))
                    observed = True
            else:
                c = compiled(g)
                observed = bus.active or events.tracer is not None
            call = Call(stage, fn, args, kwargs)
            if entry is None or not entry[0].alive:
                keyed = c.keyed
                entry = None if keyed is None else keyed.entry(call, observed)
                if entry is None:  # not keyed, no key, or past the bound: the stage's own chain
                    return await c.own(observed).run(call)
                if entry[3]:  # its KeyGate counts the call (and times it)
                    return await entry[2 if observed else 1].run(call)
            # the key's chain; the call counts itself, as a KeyGate would (a gate cost a fifth of it)
            runtime = entry[0]
            runtime.in_flight += 1
            runtime.calls += 1
            try:
                return await entry[2 if observed else 1].run(call)
            finally:
                runtime.in_flight -= 1

        guarded.__ragguard_stage__ = stage  # type: ignore[attr-defined]
        guarded.__ragguard_compiled__ = lambda: compiled(get_guard())  # type: ignore[attr-defined]
        return guarded

    return decorate
