"""What a guarded async generator function returns: a GuardedStream, which reads as the async
generator it replaces (``async for``, ``anext``, ``asend``, ``athrow``, ``aclose``, ``aclosing``) and
says how it ended (``ending``); the request keeps its streams' endings (``stream_endings()``,
bounded), and ``primed`` keeps the ending of the stream it primes."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

import pytest

import ragguard
from ragguard import GuardedStream, StreamEnding
from ragguard._endings import MAX_ENDINGS
from ragguard.asgi import primed

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _isolated(isolated_registry: None) -> None:
    pass


def counting(g: ragguard.Guard) -> object:
    @g.guard("words")
    async def words(n: int) -> AsyncIterator[str]:
        for i in range(n):
            yield f"w{i}"

    return words


async def test_it_reads_as_the_async_generator_it_replaces() -> None:
    g = ragguard.Guard()
    words = counting(g)
    stream = words(3)  # type: ignore[operator]
    assert isinstance(stream, GuardedStream) and isinstance(stream, AsyncGenerator)
    assert (stream.stage, stream.ending) == ("words", None)
    assert await stream.asend(None) == "w0"
    assert await anext(stream) == "w1"
    with pytest.raises(KeyError):
        await stream.athrow(KeyError("from the caller"))
    assert stream.ending == StreamEnding("incomplete", "words", 2, error="KeyError")

    async with aclosing(words(5)) as closing:  # type: ignore[operator]
        assert [w async for w in closing] == ["w0", "w1", "w2", "w3", "w4"]
    assert closing.ending == StreamEnding("completed", "words", 5)


async def test_the_request_keeps_its_streams_endings_bounded() -> None:
    g = ragguard.Guard()
    words = counting(g)
    assert ragguard.stream_endings() == ()
    [w async for w in words(1)]  # type: ignore[operator]
    assert ragguard.stream_endings() == ()  # outside a request: on the stream only
    async with g.tenant("acme"):
        for n in range(MAX_ENDINGS + 3):
            [w async for w in words(n)]  # type: ignore[operator]
        endings = ragguard.stream_endings()
    assert len(endings) == MAX_ENDINGS and endings[-1].items == MAX_ENDINGS + 2
    assert endings[0].items == 3  # the oldest three let go


async def test_primed_keeps_the_ending_of_the_stream_it_primes() -> None:
    g = ragguard.Guard()
    words = counting(g)
    items = await primed(words(2))  # type: ignore[operator]
    assert isinstance(items, GuardedStream) and items.ending is None
    assert [w async for w in items] == ["w0", "w1"]
    assert items.ending == StreamEnding("completed", "words", 2)


def test_an_ending_says_itself() -> None:
    continued = StreamEnding("continued", "generation", 12, "finish", 4, "StreamTimeout")
    assert str(continued) == "continued by finish after 4 of 12 items (StreamTimeout)"
    assert continued.as_dict() == {
        "ending": "continued",
        "stage": "generation",
        "items": 12,
        "continued_by": "finish",
        "continued_after": 4,
        "error": "StreamTimeout",
    }
    assert StreamEnding("completed", "generation", 3).as_dict() == {
        "ending": "completed",
        "stage": "generation",
        "items": 3,
    }
    assert str(StreamEnding("incomplete", "g", 2, error="closed")) == "incomplete after 2 items (closed)"
