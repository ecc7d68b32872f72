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
from typing import Any, ParamSpec, Protocol, TypeVar, cast, overload

from . import _inject, events
from ._errors import ConfigError
from .events import bus
from .layers import Bound, Stage
from .layers._breaker import adapt_breaker
from .layers._fallback import ROUTES, user_fallbacks, user_routes
from .layers._registry import PRESETS, preset
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
    """A decorated function's chains for one Guard, valid while ``epoch`` is the injection epoch."""

    __slots__ = ("__weakref__", "epoch", "guard", "observed", "plain", "run", "stage")

    def __init__(self, guard: Any, stage: Stage | None, plain: Chain | None) -> None:
        self.guard = guard
        self.stage = stage
        self.plain = plain
        self.run: Callable[..., Awaitable[Any]] | None = None if plain is None else plain.run
        self.observed: Chain | None = None
        self.epoch = _inject.epoch
        if stage is not None:
            stage.users.add(self)  # the stage is in use while this function's chains live


def check_preset(g: Any, bound: Bound) -> None:
    """Validate ``bound``'s preset options against the preset its stage runs in Guard ``g``."""
    bound.check(preset(g.policy.stage(bound.stage).preset))


def decorator(stage: str, registry: Any, options: Mapping[str, Any]) -> Any:
    """The decorator of ``@guard(stage, **options)`` for ``registry`` (a Guard, or a function
    returning the default one); ConfigError for a bad stage name or option."""
    if not isinstance(stage, str) or not stage:
        raise ConfigError(f"guard: stage must be a non-empty str, got {stage!r:.60}")
    own = frozenset({"fallback", "breaker", *ROUTES})
    known = own.union(*(p.option_names for p in PRESETS.values()))
    unknown = set(options) - known
    if unknown:
        raise ConfigError(f"guard: unknown option(s) {sorted(unknown)}; allowed: {sorted(known)}")
    fallbacks = user_fallbacks(options.get("fallback"))
    routes = user_routes(options)
    breaker = options.get("breaker")
    if breaker is not None and breaker is not False:
        breaker = adapt_breaker(breaker)
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
                current = slot = _Compiled(g, st, st.chain(bound))
            return current

        def chain(g: Any) -> Chain:
            c = compiled(g)
            if bus.active or events.tracer is not None:
                if c.observed is None:
                    assert c.stage is not None
                    c.observed = c.stage.chain(bound, observed=True)
                return c.observed
            return cast(Chain, c.plain)

        get_guard: Callable[[], Any] = registry if fixed is None else lambda: fixed
        compiled(get_guard())
        # built at decoration: a bad breaker or preset option fails here, and the stage is listed by
        # Guard.status() before its first call

        if threaded:

            @functools.wraps(fn)
            async def guarded_sync(*args: Any, **kwargs: Any) -> Any:
                g = fixed if fixed is not None else get_guard()
                c = compiled(g)
                return await chain(g).run(thread_call(stage, fn, args, kwargs, limiter_for(c.stage)))

            guarded_sync.__ragguard_stage__ = stage  # type: ignore[attr-defined]
            return guarded_sync

        if stream:

            @functools.wraps(fn)
            def guarded_stream(*args: Any, **kwargs: Any) -> GuardedStream[Any]:
                g = fixed if fixed is not None else get_guard()
                return chain(g).stream(Call(stage, fn, args, kwargs, True))

            guarded_stream.__ragguard_stage__ = stage  # type: ignore[attr-defined]
            return guarded_stream

        @functools.wraps(fn)
        async def guarded(*args: Any, **kwargs: Any) -> Any:
            g = fixed if fixed is not None else get_guard()
            c = slot
            if c.guard is g and c.epoch == _inject.epoch:
                if not bus.active and events.tracer is None:
                    return await c.run(Call(stage, fn, args, kwargs))  # type: ignore[misc]
                if c.observed is not None:  # observed: its chain is compiled already
                    return await c.observed.run(Call(stage, fn, args, kwargs))
            return await chain(g).run(Call(stage, fn, args, kwargs))

        guarded.__ragguard_stage__ = stage  # type: ignore[attr-defined]
        return guarded

    return decorate
