"""Continuation: a generation stream that fails after its commit point goes on from what the
caller already has.

Before its first item a stream's failure may be retried or served by a fallback; after it the
caller holds part of an answer, and another stream from the start would repeat it. A generation
stage may declare a *continuation* (``@guard("generation", continuation=finish)``): when the stream
fails past its commit point in a way that says its model is unwell (a stall cut by the idle or
total budget, a reset, an overload error inside the stream: what a fallback serves, the spent
deadline apart), :class:`ContinuationLayer` hands the continuation the call's arguments and
``partial=`` (:class:`Partial`: the items the caller has, and their text), and the caller's
stream goes on with the continuation's items. A sequence of continuations is tried in order, each
until its first item; one that fails after handing over items (in a way a continuation serves)
hands the stream to the ones after it, given everything the caller has by then, and the failure of
the last one tried ends the stream. Each continuation carries a stream on once at most.

What the continuation runs under: a guarded function (``@guard`` of a stage of its own, e.g.
another deployment) under its own stage's layers; any other under the stage's own budgets (a
first-item, idle and total budget of its own), the request's deadline and the tenant's token
reservation and pacing (a reservation of its own, settled when it ends), without the stage's
breaker or retries: the breaker counted the failure of the stream it replaces.

The join has no duplicate and no gap: the stream's items are kept as they are handed over, and
the continuation's text items pass through :class:`Overlap`, which drops what the continuation
repeats of the text before it (a model asked to continue often starts again a few words back).
A continuation of other items (an SDK's chunk objects) trims its own text with
``partial.overlap()``.

A stream whose items are not all text (``text=`` reads an item's text, None for a tool call's
delta or a structured part; default: a ``str`` is text, nothing else is) is never continued unless
the stage declares it safe (``continue_structured=True``): a tool call or a JSON document cut in
the middle cannot be resumed from its text.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, ClassVar

from .._context import current_tenant, mark_degraded
from .._errors import ConfigError
from .._validate import bounded
from ..events import EventBus, StreamContinued, bus
from ..layers._fallback import FallbackMiss, takes_error
from ..pipeline import Call
from ..pipeline._chain import Chain

__all__ = [
    "MAX_OVERLAP_CHARS",
    "Continuation",
    "ContinuationLayer",
    "Overlap",
    "Partial",
    "continuations",
    "read_str",
]

MAX_OVERLAP_CHARS = 512
"""The longest repeat :class:`Overlap` trims (characters of the text before the continuation),
and so the most text it holds back before it decides."""

_MAX_NOTES = 8


def read_str(item: Any) -> str | None:
    """The default ``text=``: a ``str`` item is its own text; any other item is not text."""
    return item if isinstance(item, str) else None


class Overlap:
    """Drops what a continuation repeats of the text before it (``before``).

    Feed the continuation's text in order (:meth:`feed`), then :meth:`flush` at its end: each
    returns the text to hand over. The repeat trimmed is the longest ``k`` (at most ``max_chars``)
    for which the continuation begins with the last ``k`` characters of ``before``, where those
    begin a word of ``before`` (not in the middle of one: a whole word, a space or a punctuation
    mark first), so a model that resumes mid-word (``"Pari"`` then ``"Paris is"``) or restarts
    its last sentence loses the repeat and nothing else. Until no longer repeat is possible the
    text is held back: at most ``max_chars`` characters, decided in one pass over the candidates
    still open per piece fed (each a C-level comparison of at most ``max_chars`` characters).
    """

    __slots__ = ("_best", "_held", "_open", "_tail", "done")

    def __init__(self, before: str, *, max_chars: int = MAX_OVERLAP_CHARS) -> None:
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 0:
            raise ConfigError(f"Overlap: max_chars must be an int >= 0, got {max_chars!r:.40}")
        tail = before[len(before) - max_chars :] if max_chars < len(before) else before
        start = len(before) - len(tail)
        self._tail = tail
        # the repeat lengths still possible, longest first: those that begin a word of `before`
        self._open = [k for k in range(len(tail), 0, -1) if _word_start(before, start + len(tail) - k)]
        self._best = 0
        self._held = ""
        self.done = not self._open
        """True once the repeat is decided (the rest of the continuation passes as it is)."""

    def feed(self, text: str) -> str:
        """The part of ``text`` (the continuation's next piece) to hand over now: "" while a
        repeat is still possible (held back), the held text past the repeat once it is decided,
        ``text`` itself after that."""
        if self.done:
            return text
        held = self._held + text
        tail, h, best = self._tail, len(held), self._best
        n = len(tail)
        still: list[int] = []
        for k in self._open:  # longest first
            if k <= best:
                break
            if k <= h:
                if held.startswith(tail[n - k :]):
                    best = k  # the longest confirmed; shorter ones no longer matter
                    break
            elif tail.startswith(held, n - k):
                still.append(k)  # the continuation so far is the start of this repeat
        self._best = best
        if still:
            self._open = still
            self._held = held
            return ""
        return self._decide(held)

    def flush(self) -> str:
        """The text still held back at the continuation's end (a repeat not confirmed is kept)."""
        if self.done:
            return ""
        return self._decide(self._held)

    @property
    def trimmed(self) -> int:
        """Characters dropped as a repeat (0 until decided)."""
        return self._best if self.done else 0

    def _decide(self, held: str) -> str:
        self.done = True
        self._open = []
        self._held = ""
        return held[self._best :]


def _word_start(text: str, i: int) -> bool:
    """Whether a repeat of ``text[i:]`` begins where a word of ``text`` does (or at a character
    that is not part of a word)."""
    return i == 0 or not (text[i - 1].isalnum() and text[i].isalnum())


class Partial:
    """What a stream's caller already has when a continuation takes it over, passed to the
    continuation as ``partial=``.

    - ``items``: the items handed over, in order (a tuple);
    - ``text``: their text joined (``text=`` of each item), None when an item is not text (only
      under ``continue_structured=True``);
    - ``error``: the error that ended the stream;
    - ``stage``: the stage the stream ran as.

    :meth:`overlap` gives a fresh :class:`Overlap` over ``text``, for a continuation that yields
    items other than text and trims its own."""

    __slots__ = ("error", "items", "stage", "text")

    def __init__(self, stage: str, items: tuple[Any, ...], text: str | None, error: BaseException) -> None:
        self.stage = stage
        self.items = items
        self.text = text
        self.error = error

    def overlap(self, *, max_chars: int = MAX_OVERLAP_CHARS) -> Overlap:
        """An :class:`Overlap` trimming what a continuation repeats of :attr:`text`."""
        return Overlap(self.text or "", max_chars=max_chars)

    def __repr__(self) -> str:
        text = "None" if self.text is None else repr(bounded(self.text, 60))
        error = type(self.error).__name__
        return f"Partial(stage={self.stage!r}, items={len(self.items)}, text={text}, error={error})"


class Continuation:
    """One continuation of a stage: ``fn`` called with the call's arguments, ``partial=`` (and
    ``error=`` when it declares it), run through ``chain`` (the stage's budgets and tokens), or as
    it is when ``fn`` is a guarded function (its own stage's layers)."""

    __slots__ = ("chain", "fn", "name", "wants_error")

    def __init__(self, fn: Callable[..., Any], chain: Chain | None) -> None:
        self.fn = fn
        self.name: str = getattr(fn, "__name__", None) or type(fn).__name__
        self.wants_error = takes_error(fn)
        self.chain = None if guarded(fn) else chain

    def open(self, call: Call, partial: Partial) -> Any:
        """The continuation's stream for ``call`` (an async iterator, not started yet)."""
        extra: dict[str, Any] = {"partial": partial}
        if self.wants_error:
            extra["error"] = partial.error
        if self.chain is None:
            return _stream(self.fn(*call.args, **call.kwargs, **extra))
        fn = functools.partial(_produced, self.fn, extra)
        return self.chain.stream(Call(call.stage, fn, call.args, call.kwargs, True))

    def __repr__(self) -> str:
        return f"Continuation({self.name})"


def guarded(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is a guarded function (``@guard``): it runs under its own stage's layers."""
    return getattr(fn, "__ragguard_stage__", None) is not None


async def _produced(
    fn: Callable[..., Any], extra: dict[str, Any], *args: Any, **kwargs: Any
) -> AsyncIterator[Any]:
    """What a plain continuation produced, as a stream: an async generator's items, an awaited
    async iterable's or iterable's."""
    async for item in _stream(fn(*args, **kwargs, **extra)):
        yield item


async def _stream(produced: Any) -> AsyncIterator[Any]:
    if inspect.isawaitable(produced) and not hasattr(produced, "__aiter__"):
        produced = await produced
    if hasattr(produced, "__aiter__"):
        iterator = produced.__aiter__()
        try:
            async for item in iterator:
                yield item
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await aclose()
        return
    for item in produced:
        yield item


class _Resume:
    """One opened stream's :class:`~ragguard.pipeline.Resumption`: the layer, the held entries
    of the layers inside it, and ``next``, the first continuation of the sequence not tried yet
    (each carries a stream on once at most)."""

    __slots__ = ("inside", "layer", "next")

    def __init__(self, layer: ContinuationLayer, inside: tuple[Any, ...]) -> None:
        self.layer = layer
        self.inside = inside
        self.next = 0

    async def take_over(self, call: Call, exc: Exception, items: list[Any]) -> tuple[str, Any] | None:
        taken = await self.layer.take_over(call, exc, items, start=self.next)
        if taken is None:
            self.next = len(self.layer.continuations)
            return None
        self.next, name, rest = taken
        return name, rest


class ContinuationLayer:
    """A stream wrapper of the generation preset, outermost of its layers (inside the fallbacks,
    the deadline and the tenant's quota, which stay held while a continuation runs): carries a
    stream that fails past its commit point on with its continuations (see the module docstring).

    ``applies(exc)``: whether the failure is one a continuation serves; ``text``: an item's text
    (None: not text); ``structured``: continue streams whose items are not all text."""

    resumes: ClassVar[bool] = True  # sets the head's ``resume`` (see ragguard.pipeline.Resumption)
    __slots__ = ("_bus", "applies", "continuations", "stage", "structured", "text")

    def __init__(
        self,
        stage: str,
        continuations: Sequence[Continuation],
        *,
        applies: Callable[[BaseException], bool],
        text: Callable[[Any], str | None] = read_str,
        structured: bool = False,
        event_bus: EventBus = bus,
    ) -> None:
        self.stage = stage
        self.continuations = tuple(continuations)
        self.applies = applies
        self.text = text
        self.structured = structured
        self._bus = event_bus

    async def around(self, call: Call, proceed: Callable[[], Any]) -> Any:
        head = await proceed()
        if call.stream:
            head.resume = _Resume(self, tuple(head.held))
        return head

    async def take_over(
        self, call: Call, exc: Exception, items: list[Any], *, start: int = 0
    ) -> tuple[int, str, Any] | None:
        """The continuation that carries ``call``'s stream on after ``exc`` (the first of the
        sequence from ``start`` that answers): the position after it in the sequence, its name,
        and its items still to hand over (trimmed of what they repeat); None when none applies
        or answers (each reason noted on ``exc``)."""
        if start >= len(self.continuations) or not self.applies(exc):
            return None
        partial = self._partial(call, exc, items)
        if partial is None:
            return None
        for at, continuation in enumerate(self.continuations[start:], start + 1):
            stream: Any = None
            try:
                stream = continuation.open(call, partial)
                first = await stream.__anext__()
            except StopAsyncIteration:
                first = _NOTHING  # it has nothing to add: the answer was whole after all
            except FallbackMiss as missed:
                _note(exc, f"continuation {continuation.name!r} had no answer: {missed}")
                continue
            except Exception as failed:
                _note(
                    exc, f"continuation {continuation.name!r} failed too: {type(failed).__name__}: {failed}"
                )
                continue
            except BaseException:
                if stream is not None:
                    await _close(stream)
                raise
            mark_degraded(
                f"continued: {continuation.name} after {call.items} item{'' if call.items == 1 else 's'}"
            )
            if self._bus.active:
                event = StreamContinued(
                    self.stage, current_tenant(), continuation.name, call.items, type(exc).__name__
                )
                self._bus.emit(event)
            if first is _NOTHING:
                return at, continuation.name, _empty()
            trim = partial.text is not None and isinstance(first, str)
            return at, continuation.name, _joined(first, stream, partial.overlap() if trim else None)
        return None

    def _partial(self, call: Call, exc: Exception, items: list[Any]) -> Partial | None:
        texts = [self.text(item) for item in items]
        if any(not isinstance(t, str) for t in texts):
            if not self.structured:
                _note(
                    exc,
                    "not continued: an item handed over is not text (a tool call, structured "
                    "output); continue_structured=True declares continuing such streams safe",
                )
                return None
            return Partial(call.stage, tuple(items), None, exc)
        return Partial(call.stage, tuple(items), "".join(texts), exc)  # type: ignore[arg-type]


_NOTHING: Any = object()


async def _empty() -> AsyncIterator[Any]:
    return
    yield  # pragma: no cover - an async generator of nothing


async def _joined(first: Any, stream: Any, overlap: Overlap | None) -> AsyncIterator[Any]:
    """The continuation's items from ``first`` on, its text items trimmed by ``overlap`` of what
    they repeat (None: as they come); closes ``stream`` however it ends."""
    try:
        item = first
        while True:
            if overlap is not None and type(item) is str and not overlap.done:
                item = overlap.feed(item)
                if item:
                    yield item
            else:
                yield item
            try:
                item = await stream.__anext__()
            except StopAsyncIteration:
                break
        if overlap is not None:
            held = overlap.flush()
            if held:
                yield held
    finally:
        await _close(stream)


async def _close(stream: Any) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


def _note(exc: BaseException, text: str) -> None:
    notes = getattr(exc, "__notes__", ())
    if len(notes) < _MAX_NOTES:
        exc.add_note(bounded(f"ragguard: {text}", 300))


def continuations(given: Any, fn: Callable[..., Any]) -> tuple[Callable[..., Any], ...]:
    """``continuation=`` of ``@guard`` (a callable or a sequence of them, tried in order), checked
    against the guarded function ``fn``: each must take the keyword ``partial`` (a keyword-only
    parameter, or ``**kwargs``), and ``fn`` must not have a parameter of that name. ConfigError
    naming the option otherwise."""
    chain = tuple(given) if isinstance(given, (list, tuple)) else (given,)
    guarded_fn = f"{getattr(fn, '__name__', fn)!r:.60}"
    for i, cont in enumerate(chain):
        where = (
            "continuation"
            if len(chain) == 1 and not isinstance(given, (list, tuple))
            else f"continuation[{i}]"
        )
        if not callable(cont):
            raise ConfigError(
                f"{where} of {guarded_fn} must be callable, got {type(cont).__name__}", field=where
            )
        if not _takes_partial(cont):
            raise ConfigError(
                f"{where} of {guarded_fn} ({getattr(cont, '__name__', cont)!r:.60}) must declare a "
                "keyword-only parameter partial (what the caller already has): "
                "def finish(question, *, partial)",
                field=where,
            )
    try:
        taken = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return chain
    for name in ("partial", "error"):
        if name in taken and (name == "partial" or any(takes_error(c) for c in chain)):
            raise ConfigError(
                f"a continuation receives {name}=, and the guarded function {guarded_fn} has a "
                f"parameter named {name} too: rename it",
                field="continuation",
            )
    return chain


def _takes_partial(fn: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True  # cannot tell: it is called with partial= and fails if it does not take it
    given = parameters.get("partial")
    if given is not None:
        return given.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
