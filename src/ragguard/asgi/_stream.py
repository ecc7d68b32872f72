"""A streamed body whose first item is awaited before the response starts."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from typing import Any, TypeVar

from ..pipeline._chain import GuardedStream

__all__ = ["primed"]

T = TypeVar("T")


async def primed(stream: AsyncIterable[T]) -> AsyncGenerator[T, None]:
    """Await ``stream``'s first item now, then return an async generator of all its items.

    An HTTP response commits to its status when it starts: a ``StreamingResponse`` starts before
    it reads its body, so a stream that fails before its first item (a token quota refusal, an
    open breaker with no fallback, a first-item budget run out) would answer 200 and then an
    ``event: ragguard-error``. Awaited in the endpoint, before the response is made, that failure
    raises there instead, and :class:`~ragguard.asgi.RagguardMiddleware` answers its own status
    (429, 503, 504). The commit point of the HTTP response is then the stream's own::

        items = await primed(answer(question))          # a guarded generation stream
        return StreamingResponse(sse(items), media_type="text/event-stream")

    The generator returned closes ``stream`` when it ends or is closed; iterate it or close it
    (``aclose``, ``contextlib.aclosing``); for a guarded stream it is a
    :class:`~ragguard.GuardedStream` too, whose ``ending`` is the stream's. Raises what ``stream``
    raised before its first item.
    """
    iterator = aiter(stream)
    try:
        first = await anext(iterator)
    except StopAsyncIteration:
        rest = _rest(iterator, None, empty=True)
    except BaseException:
        await _close(iterator)
        raise
    else:
        rest = _rest(iterator, first, empty=False)
    return GuardedStream(rest, stream) if isinstance(stream, GuardedStream) else rest


async def _rest(iterator: AsyncIterator[T], first: Any, *, empty: bool) -> AsyncGenerator[T, None]:
    try:
        if empty:
            return
        yield first
        async for item in iterator:
            yield item
    finally:
        await _close(iterator)


async def _close(iterator: Any) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()
