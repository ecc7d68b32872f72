"""The demo's language model: an extractive generator that streams the top passages word by word.

No model is downloaded: an answer is the words of the passages it is given, in order, each one
emitted ``1 / words_per_s`` seconds after the last, as a model's tokens come. That is enough to
meet what goes wrong with a real model's stream, which the chaos scenario puts in at three
points of the answer (the stream's stages, as a :mod:`ragguard.chaos` scenario names them):

===========================  ===============================================================
stage                        where a fault acts, and what ``latency`` there means
===========================  ===============================================================
``generation``               before the first word: the model is slow to start
``generation_midway``        halfway through the answer: the stream stalls that long
``generation_overrun``       at the end of the answer: the model does not stop, it goes on
                             talking (further words of the passages) as long as the latency
                             lasts (``hang``: until the caller gives up): an answer that runs long
===========================  ===============================================================

An error fault at any of them ends the stream with the matching gRPC status there (before the
first word, halfway, or at the end).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from itertools import cycle
from typing import Any

from ragguard import InvalidInput

__all__ = [
    "GENERATION_STAGES",
    "MAX_ANSWER_WORDS",
    "MAX_PASSAGES",
    "answer_words",
    "extractive_answer",
    "parse_request",
    "stream_answer",
]

GENERATION_STAGES = ("generation", "generation_midway", "generation_overrun")
MAX_PASSAGES = 10
MAX_PASSAGE_CHARS = 8192
MAX_QUESTION_CHARS = 2000
MAX_ANSWER_WORDS = 2000

# Runs ``call`` for (stage, tenant) through the chaos faults in force; raises what a fault raises.
Faults = Callable[[str, str, Callable[[], Awaitable[Any]]], Awaitable[Any]]


def answer_words(passages: Sequence[str]) -> Iterator[str]:
    """The words of ``passages`` in order, each with its trailing space, then again from the
    start (without end: the caller takes as many as it needs). Empty passages give nothing."""
    words = [f"{w} " for text in passages for w in text.split()]
    return cycle(words) if words else iter(())


def extractive_answer(question: str, passages: Sequence[str], max_words: int) -> list[str]:
    """A short answer without the model: the top passage's first sentence (at most ``max_words``
    words), the words as the model would stream them."""
    top = passages[0] if passages else ""
    sentence = top.split(". ", 1)[0]
    return [f"{w} " for w in sentence.split()[:max_words]]


def parse_request(request: dict[str, Any]) -> tuple[str, list[str], int]:
    """``(question, passages, max_words)`` of a ``Generator/Generate`` request. Raises
    InvalidInput naming the field that is missing, of the wrong type or out of range."""
    question = request.get("question")
    passages = request.get("passages")
    max_words = request.get("max_words")
    if not isinstance(question, str) or not question.strip() or len(question) > MAX_QUESTION_CHARS:
        raise InvalidInput(f"question must be a non-empty str of at most {MAX_QUESTION_CHARS} characters")
    if (
        not isinstance(passages, list)
        or not 0 < len(passages) <= MAX_PASSAGES
        or not all(isinstance(p, str) and len(p) <= MAX_PASSAGE_CHARS for p in passages)
    ):
        raise InvalidInput(
            f"passages must be a list of 1..{MAX_PASSAGES} str of at most {MAX_PASSAGE_CHARS} characters"
        )
    if isinstance(max_words, bool) or not isinstance(max_words, int) or not 0 < max_words <= MAX_ANSWER_WORDS:
        raise InvalidInput(f"max_words must be an int in 1..{MAX_ANSWER_WORDS}, got {max_words!r}")
    return question, passages, max_words


async def _nothing() -> None:
    return None


async def stream_answer(
    passages: Sequence[str], max_words: int, *, tenant: str, faults: Faults, word_s: float
) -> AsyncGenerator[str, None]:
    """The model's answer for ``tenant``: ``max_words`` words of ``passages``, one every
    ``word_s`` seconds, through the faults of the three stages (see the module docstring).
    Raises what a fault raises (its error, at its point of the answer)."""
    words = answer_words(passages)
    await faults("generation", tenant, _nothing)
    for i in range(max_words):
        if i == max_words // 2 and i > 0:
            await faults("generation_midway", tenant, _nothing)
        await asyncio.sleep(word_s)
        word = next(words, None)
        if word is None:
            return
        yield word
    # The overrun runs beside the answer: the model talks on until the fault's latency is over.
    overrun = asyncio.ensure_future(_outcome(faults("generation_overrun", tenant, _nothing)))
    try:
        await asyncio.sleep(0)  # with no fault in force the check is done now
        while not overrun.done():
            await asyncio.sleep(word_s)
            yield next(words)
        error = overrun.result()
        if error is not None:
            raise error
    finally:
        overrun.cancel()  # the caller went away mid-overrun (a no-op once it is done)


async def _outcome(call: Awaitable[Any]) -> Exception | None:
    try:
        await call
    except Exception as exc:
        return exc
    return None
