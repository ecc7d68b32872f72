"""Fallbacks: when a stage fails in a way that says its dependency is unwell, answer another way.

A recovery holding a chain of fallbacks tried in order: the stage's preset may put its own first
(the embedding cache) or last (skip rerank), the user's ``fallback=`` (one callable or a sequence)
sits between. Each is called with the call's arguments; the first that answers serves the call and
is named in :func:`ragguard.degraded`. One that misses (:class:`FallbackMiss`, e.g. a text not in
the cache) or raises hands over to the next; when none answers, the original error is raised with a
note naming what each fallback did.

When a fallback serves is read from the outcome the chain classified (``fallback_on: breaker``,
the default): after a dependency's failure, rejection (429, 529, ``RESOURCE_EXHAUSTED``: the
dependency is saturated, and a cheap local answer is what a fallback is for) or timeout, an open
breaker, a call shed by an overload layer (:class:`~ragguard.Overloaded`), a spent deadline, or an
error no classifier knows that the stage's breaker counts; never after a caller's error (a bad
request is passed to the caller as it is). ``fallback_on: any`` serves after any error. Neither
serves after a quota refusal (a tenant over its share is not served another way) or a
cancellation. For a stream, only before its first item (the commit
point); a fallback of a stream may return an async iterable or an iterable of items.

What the provider said may choose the fallback: a stage's *routes* map a caller's-error reason
(``context_length``, ``content_policy``: :mod:`ragguard.outcomes`) to fallbacks of their own
(``@guard(on_context_length=..., on_content_policy=...)``). A refusal whose reason is routed is
served by its route's fallbacks, in order (then by the stage's own, only under ``fallback_on:
any``); any other caller's error still reaches no fallback. A route holds :class:`Fallback`
objects, so a model group may put its own there (another deployment with a larger context).

A user's fallback that declares a keyword-only parameter ``error`` (``def large(question,
passages, *, error)``) is called with the exception it replaces as ``error=``; any other is called
with the call's arguments alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._clock import Clock, monotonic
from .._context import current_tenant, mark_degraded
from .._deadline import current_expiry, restore, shorten
from .._errors import ConfigError, QuotaExceeded
from .._validate import bounded
from ..events import EventBus, FallbackServed, bus
from ..outcomes import Kind, Outcome, outcome_of
from ..pipeline import Call
from ..pipeline._drivers import Head
from . import _reserve as reserve
from ._shapes import Fallback

if TYPE_CHECKING:
    from ._shapes import Bound, Stage

__all__ = [
    "ROUTES",
    "Fallback",
    "FallbackLayer",
    "FallbackMiss",
    "UserFallback",
    "build",
    "user_fallbacks",
    "user_routes",
]

ROUTES = {"on_context_length": "context_length", "on_content_policy": "content_policy"}
"""``@guard`` keyword -> the caller's-error reason (:data:`ragguard.outcomes.REASONS`) it routes."""

_MAX_NOTES = 8


class FallbackMiss(Exception):
    """Raised by a fallback that has no answer for this call: the next fallback is tried."""


class UserFallback:
    """A user's fallback callable, called with the call's arguments: an ``async def``, a plain
    function, or (for a stream) an async generator function or one returning an iterable. One
    that declares a keyword-only parameter ``error`` gets the exception it replaces as well
    (``wants_error``, read once from its signature)."""

    __slots__ = ("fn", "name", "wants_error")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.name: str = getattr(fn, "__name__", None) or type(fn).__name__
        self.wants_error = takes_error(fn)

    async def serve(self, call: Call, exc: Exception) -> Any:
        if self.wants_error:
            produced = self.fn(*call.args, **{**call.kwargs, "error": exc})
        else:
            produced = self.fn(*call.args, **call.kwargs)
        if inspect.isawaitable(produced):
            produced = await produced
        return produced

    def __repr__(self) -> str:
        return f"UserFallback({self.name})"


def takes_error(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` declares a keyword-only parameter named ``error`` (False when its signature
    cannot be read)."""
    try:
        parameter = inspect.signature(fn).parameters.get("error")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind is inspect.Parameter.KEYWORD_ONLY


def user_fallbacks(given: Any, option: str = "fallback") -> tuple[Callable[..., Any], ...]:
    """``@guard(fallback=...)`` (or a route's ``option``): a callable or a sequence of them, in
    order (None: none); ConfigError naming the one that is not callable."""
    if given is None:
        return ()
    chain = tuple(given) if isinstance(given, (list, tuple)) else (given,)
    for i, fn in enumerate(chain):
        if not callable(fn):
            alone = len(chain) == 1 and not isinstance(given, (list, tuple))
            where = option if alone else f"{option}[{i}]"
            raise ConfigError(f"guard: {where} must be callable, got {type(fn).__name__}", field=where)
    return chain


def user_routes(options: Any) -> dict[str, tuple[Callable[..., Any], ...]]:
    """The routes of ``@guard``'s options (``on_context_length=``, ``on_content_policy=``): reason
    -> its fallbacks, in order; a route given None is left out. ConfigError as :func:`user_fallbacks`."""
    routes: dict[str, tuple[Callable[..., Any], ...]] = {}
    for option, reason in ROUTES.items():
        chain = user_fallbacks(options.get(option), option)
        if chain:
            routes[reason] = chain
    return routes


class FallbackLayer:
    """Serves stage ``stage``'s failures from ``fallbacks``, in order, and the refusals ``routes``
    names (reason -> fallbacks) from theirs (see the module docstring); what the dependency said
    is the outcome the chain classified (``Call.outcome``)."""

    __slots__ = ("_applies", "_bus", "_clock", "_learn", "fallbacks", "routes", "stage")

    def __init__(
        self,
        stage: str,
        fallbacks: Sequence[Fallback],
        applies: Applies,
        event_bus: EventBus = bus,
        routes: Mapping[str, Sequence[Fallback]] | None = None,
        learn: Callable[[float], None] | None = None,
        clock: Clock = monotonic,
    ) -> None:
        self.stage = stage
        self.fallbacks = tuple(fallbacks)
        self.routes = {reason: tuple(chain) for reason, chain in (routes or {}).items() if chain}
        self._applies = applies
        self._bus = event_bus
        self._learn = learn  # told how long the chain took to answer (the stage's reserve learns it)
        self._clock = clock

    def chain_for(self, exc: BaseException, outcome: Outcome | None = None) -> tuple[Fallback, ...]:
        """The fallbacks that may serve ``exc`` (whose outcome is ``outcome``; None: the one
        recorded on it), in order: its route's (a caller's error whose reason is routed), then
        the stage's own when they apply to it."""
        if outcome is None:
            outcome = outcome_of(exc)
        if self.routes and outcome.kind is Kind.CALLER_ERROR:
            routed = self.routes.get(outcome.reason)
            if routed is not None:
                return routed + self.fallbacks if self.fallbacks and self._applies(exc, outcome) else routed
        return self.fallbacks if self._applies(exc, outcome) else ()

    async def recover(self, call: Call, exc: Exception, again: Callable[[], Awaitable[Any]]) -> Any:
        token = None
        try:
            chain = self.chain_for(exc, call.outcome or outcome_of(exc))
            if not chain:
                raise exc
            share_at = call.share_at  # the stage's share of the deadline (the gate inside it set
            if share_at is not None:  # it, the share fused into the reserve): the fallbacks serve under it
                current = current_expiry()
                if current is not None and share_at < current.at:
                    token = shorten(current.sooner(share_at))
            learn = self._learn
            started = self._clock() if learn is not None else 0.0
            for fallback in chain:
                try:
                    result = await fallback.serve(call, exc)
                except FallbackMiss as missed:
                    _note(exc, f"fallback {fallback.name!r} had no answer: {missed}")
                    continue
                except Exception as failed:
                    _note(exc, f"fallback {fallback.name!r} failed too: {type(failed).__name__}: {failed}")
                    continue
                mark_degraded(fallback.name)
                if (events := self._bus).active:
                    error = type(exc).__name__
                    events.emit(FallbackServed(self.stage, fallback.name, current_tenant(), error))
                if learn is not None:
                    if call.stream and not isinstance(result, Head):  # an opened stream is not timed
                        # a stream's fallback has answered once its first item is there
                        result = _FirstItem(result, learn, self._clock, started)
                    else:
                        learn(self._clock() - started)
                if token is not None and call.stream and not isinstance(result, Head):
                    # its first item read under the share, as the stream driver would read it
                    result = await Head.of_fallback(result)
                return result
            raise exc
        finally:
            if token is not None:
                restore(token)
            # this frame lets go of the error it raises: the error's traceback holds the frame, and
            # the two would otherwise be a reference cycle only the garbage collector frees
            del exc


class _FirstItem:
    """A stream a fallback returned, telling ``learn`` the time from ``started`` to its first
    item (once, when that item is read; nothing when it ends or fails before one)."""

    __slots__ = ("_clock", "_iter", "_learn", "_produced", "_started")

    def __init__(self, produced: Any, learn: Callable[[float], None], clock: Clock, started: float) -> None:
        self._produced = produced
        self._iter: Any = None
        self._learn: Callable[[float], None] | None = learn
        self._clock = clock
        self._started = started

    def __aiter__(self) -> _FirstItem:
        produced = self._produced
        self._iter = produced.__aiter__() if hasattr(produced, "__aiter__") else _items(produced)
        return self

    async def __anext__(self) -> Any:
        item = await self._iter.__anext__()
        learn = self._learn
        if learn is not None:
            self._learn = None
            learn(self._clock() - self._started)
        return item

    async def aclose(self) -> None:
        aclose = getattr(self._iter, "aclose", None)
        if aclose is not None:
            await aclose()


async def _items(items: Any) -> Any:
    for item in items:
        yield item


def _note(exc: BaseException, text: str) -> None:
    notes = getattr(exc, "__notes__", ())
    if len(notes) < _MAX_NOTES:
        exc.add_note(bounded(text, 300))


Applies = Callable[[BaseException, Outcome], bool]
"""Whether a stage's fallbacks serve an error, given its outcome: ``applies(exc, outcome)``."""


def applies_for(counts: Callable[[BaseException], bool] | None, fallback_on: str) -> Applies:
    """When a stage's fallbacks serve (see the module docstring): ``counts`` is the stage breaker's
    classifier (None without a breaker: every error no classifier knows is served); ``applies(exc,
    outcome)`` reads what the dependency said in ``outcome`` (None: the one recorded on ``exc``)."""
    serve_any = fallback_on == "any"

    def applies(exc: BaseException, outcome: Outcome | None = None) -> bool:
        if isinstance(exc, QuotaExceeded):
            return False  # the tenant's own share: not served another way
        kind = (outcome_of(exc) if outcome is None else outcome).kind
        if kind in _SERVED or serve_any:
            return kind is not Kind.CANCELLED
        if kind is Kind.UNKNOWN:
            return counts is None or bool(counts(exc))
        return False  # a caller's error: passed on as it is

    return applies


_SERVED = frozenset({Kind.FAILURE, Kind.REJECTION, Kind.TIMEOUT, Kind.REFUSED, Kind.DEADLINE})


def build(stage: Stage, bound: Bound) -> FallbackLayer | None:
    fallbacks = stage.fallbacks_for(bound)
    if not fallbacks and not bound.routes:
        return None
    counts = stage.breaker.classifier if stage.breaker is not None else None
    applies = applies_for(counts, stage.policy.fallback_on)
    learn = reserve.learner(stage) if fallbacks else None
    return FallbackLayer(stage.name, fallbacks, applies, stage.context.bus, bound.routes, learn, stage.clock)
