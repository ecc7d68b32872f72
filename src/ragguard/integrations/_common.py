"""What every integration shares: the stage decorator of a Guard, the SDK's timeout from the
deadline, the tenant header, streams opened up to their first token, and calls of one item.

Only ragguard's public API is used here (``ragguard.guard``, ``Guard.guard``, ``ragguard.remaining``,
``ragguard.current_tenant``), so the integrations do not depend on how the core is laid out.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import ragguard

from .._extras import install_hint

__all__ = [
    "SDK_TIMEOUT_GRACE_S",
    "GuardedStream",
    "Stages",
    "count_text",
    "fallbacks",
    "held_back",
    "needs",
    "one_item",
    "open_stream",
    "sdk_options",
    "streamed",
]

SDK_TIMEOUT_GRACE_S = 0.1
"""Seconds the SDK's own timeout is given past ragguard's bound of the attempt, so that ragguard's
timer (a ``DeadlineExceeded`` that no breaker counts, or the stage's ``StageTimeout``) is always
what ends a call that runs too long, and the SDK's timeout only a backstop that closes the
connection of a call ragguard no longer waits for."""


def needs(module: str, extra: str) -> Any:
    """Import ``module`` (an SDK), or raise ImportError with the command that installs ragguard's
    ``extra``."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"ragguard's {extra} integration needs {module}: {install_hint(extra)}") from exc


_PRESET_OF_OPTION = {
    "texts": "embedding",
    "tokens": "generation",
    "usage": "generation",
    "estimate": "generation",
    "continuation": "generation",
    "text": "generation",
    "continue_structured": "generation",
}


class Stages:
    """The Guard an integration runs in (None: the default registry, looked up at each call, so
    :func:`ragguard.configure` applies) and how it decorates a function as one of its stages."""

    __slots__ = ("guard",)

    def __init__(self, guard: ragguard.Guard | None) -> None:
        if guard is not None and not isinstance(guard, ragguard.Guard):
            raise ragguard.ConfigError(f"guard must be a ragguard.Guard or None, got {type(guard).__name__}")
        self.guard = guard

    @property
    def current(self) -> ragguard.Guard:
        return self.guard if self.guard is not None else ragguard.default_guard()

    def preset_of(self, stage: str) -> str | None:
        return self.current.policy.stage(stage).preset

    def decorate(
        self,
        stage: str,
        fn: Callable[..., Any],
        *,
        fallback: Callable[..., Any] | Sequence[Callable[..., Any]] | None = None,
        **preset_options: Any,
    ) -> Callable[..., Any]:
        """``fn`` guarded as ``stage``: the preset options are given only when the stage runs the
        preset they belong to (a stage of another name without a preset runs the generic layers)."""
        options = {k: v for k, v in preset_options.items() if v is not None}
        preset = self.preset_of(stage)
        options = {k: v for k, v in options.items() if _PRESET_OF_OPTION.get(k) == preset}
        if self.guard is not None:
            return self.guard.guard(stage, fallback=fallback, **options)(fn)
        return ragguard.guard(stage, fallback=fallback, **options)(fn)

    def estimate_default(self, stage: str) -> int:
        """The stage's ``generation.estimate_tokens`` (what a stream reserves when the request does
        not say how many tokens it may generate)."""
        return self.current.policy.stage(stage).generation.estimate_tokens

    def timeout_s(self, stage: str) -> float | None:
        return self.current.policy.stage(stage).timeout_s


def sdk_options(
    stages: Stages,
    stage: str,
    kwargs: Mapping[str, Any],
    tenant_header: str | None,
    *,
    timeout_name: str = "timeout",
    headers_name: str = "extra_headers",
) -> dict[str, Any]:
    """``kwargs`` with the attempt's SDK options: ``timeout`` (seconds) the smallest of the
    caller's own, the stage's ``timeout_s`` and the deadline's remaining seconds, plus
    :data:`SDK_TIMEOUT_GRACE_S` (unchanged when none of them is set); the current tenant's id in
    the header ``tenant_header`` (when one is named), merged into the caller's extra headers."""
    out = dict(kwargs)
    bounds = [b for b in (stages.timeout_s(stage), ragguard.remaining()) if b is not None]
    if bounds:
        bound = min(bounds) + SDK_TIMEOUT_GRACE_S
        given = out.get(timeout_name)
        if isinstance(given, (int, float)) and not isinstance(given, bool):
            bound = min(bound, float(given))
        if given is None or isinstance(given, (int, float)):
            out[timeout_name] = bound
    if tenant_header:
        headers = dict(out.get(headers_name) or {})
        headers[tenant_header] = ragguard.current_tenant()
        out[headers_name] = headers
    return out


async def held_back(events: AsyncIterator[Any], is_preamble: Callable[[Any], bool]) -> AsyncIterator[Any]:
    """``events`` as they come, except that the ones before the first token (``is_preamble``: a
    role-only chunk, ``response.created``, ``message_start``...) are held back and handed over
    together with it: the stream's first item then arrives with its first token, so the
    first-item budget bounds the time to the first token and the commit point is there (a server
    that sends its preamble at once and then stalls can still be retried or replaced)."""
    held: list[Any] = []
    began = False
    async for event in events:
        if not began:
            if is_preamble(event):
                held.append(event)
                continue
            began = True
            for early in held:
                yield early
            held.clear()
        yield event
    for early in held:  # a stream with no token at all
        yield early


class GuardedStream:
    """A guarded stream opened up to its first item, as an SDK's stream reads: ``async for``,
    ``await stream.close()`` / ``aclose()``, ``async with stream:``. ``drop(item)`` True hides an
    item from the caller after ragguard counted it (the usage chunk the integration asked for)."""

    __slots__ = ("_drop", "_first", "_items", "_next", "_pending")

    def __init__(self, items: Any, first: Any, pending: bool, drop: Callable[[Any], bool] | None) -> None:
        self._items = items
        self._next = items.__aiter__().__anext__  # a guarded stream's generator: no call of ours per item
        self._first = first
        self._pending = pending
        self._drop = drop

    def __aiter__(self) -> GuardedStream:
        return self

    @property
    def ending(self) -> Any:
        """How the stream ended (:class:`ragguard.StreamEnding`), None while it runs."""
        return getattr(self._items, "ending", None)

    async def __anext__(self) -> Any:
        if self._pending:
            self._pending = False
            first, self._first = self._first, None
            if self._drop is None or not self._drop(first):
                return first
        while True:
            item = await self._next()
            if self._drop is None or not self._drop(item):
                return item

    async def aclose(self) -> None:
        """Close the stream (the upstream response with it); settles its tokens. Idempotent."""
        self._pending = False
        await self._items.aclose()

    close = aclose

    async def __aenter__(self) -> GuardedStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


async def open_stream(items: Any, drop: Callable[[Any], bool] | None = None) -> GuardedStream:
    """Open the guarded stream ``items`` up to its first item, so that what fails before it (the
    token quota, an open breaker with no fallback, a rate limit, no first token within its budget)
    raises here, where the SDK raises its HTTP errors."""
    try:
        first = await items.__anext__()
    except StopAsyncIteration:
        return GuardedStream(items, None, False, drop)
    except BaseException:
        await items.aclose()
        raise
    return GuardedStream(items, first, True, drop)


async def one_item(items: Any) -> Any:
    """The only item of a guarded stream of one (a whole response run as a stream so that the
    generation stage reserves and settles its tokens)."""
    try:
        return await items.__anext__()
    finally:
        await items.aclose()


def streamed(fallback: Callable[..., Any]) -> Callable[..., Any]:
    """A fallback of a whole response, as the fallback of a stream of one item (its name kept for
    :func:`ragguard.degraded`)."""

    @functools.wraps(fallback)
    async def serve(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        produced = fallback(*args, **kwargs)
        if inspect.isawaitable(produced):
            produced = await produced
        yield produced

    return serve


def fallbacks(
    given: Callable[..., Any] | Sequence[Callable[..., Any]] | None, wrap: Callable[..., Any] | None = None
) -> tuple[Callable[..., Any], ...] | None:
    """The user's fallback(s) as a tuple (None: none), each passed through ``wrap``."""
    if given is None:
        return None
    chain = tuple(given) if isinstance(given, (list, tuple)) else (given,)
    return tuple(wrap(fn) for fn in chain) if wrap is not None else chain


def count_text(*texts: Any) -> int:
    """Tokens of the text pieces of an item (``ragguard.rag.count_tokens`` of each str)."""
    from ragguard.rag import count_tokens

    return sum(count_tokens(t) for t in texts if isinstance(t, str))
