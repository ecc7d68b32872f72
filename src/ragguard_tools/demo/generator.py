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

A request may carry a ``prefix``: the start of an answer the caller already has (a cut answer to
continue, as a chat model is given its own partial answer to go on from). The model answers the
same answer from there, starting again at the prefix's last word (a model told to continue often
repeats its last words: ragguard's continuation trims the repeat), to ``max_words`` words in all,
prefix included; its three fault points are those of the words it is asked for (halfway is
halfway through them).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from itertools import cycle, islice
from typing import Any

from ragguard import InvalidInput

__all__ = [
    "GENERATION_STAGES",
    "MAX_ANSWER_WORDS",
    "MAX_PASSAGES",
    "answer_words",
    "extractive_answer",
    "extractive_rest",
    "parse_request",
    "stream_answer",
    "whole_answer",
]

GENERATION_STAGES = ("generation", "generation_midway", "generation_overrun")
MAX_PASSAGES = 10
MAX_PASSAGE_CHARS = 8192
MAX_QUESTION_CHARS = 2000
MAX_ANSWER_WORDS = 2000
MAX_PREFIX_CHARS = 16384

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


def extractive_rest(passages: Sequence[str], prefix: str, max_words: int) -> list[str]:
    """The rest of the model's answer after ``prefix`` (the words of an answer begun), computed
    without the model: the passages' next words, to ``max_words`` words in all."""
    words = answer_words(passages)
    have = len(prefix.split())
    return list(islice(words, have, max(have, max_words)))


def whole_answer(text: str, passages: Sequence[str], max_words: int) -> bool:
    """Whether ``text`` is a whole answer from ``passages``, no word repeated or missing: the
    model's (its words in order, ``max_words`` of them or more: an answer may run long) or the
    extractive answer."""
    n = len(text.split())
    if n >= max_words and text == "".join(islice(answer_words(passages), n)):
        return True
    return bool(text) and text == "".join(extractive_answer("", passages, max_words))


def parse_request(request: dict[str, Any]) -> tuple[str, list[str], int, str]:
    """``(question, passages, max_words, prefix)`` of a ``Generator/Generate`` request (``prefix``
    optional, "" when absent). Raises InvalidInput naming the field that is missing, of the wrong
    type or out of range."""
    question = request.get("question")
    passages = request.get("passages")
    max_words = request.get("max_words")
    prefix = request.get("prefix", "")
    if not isinstance(prefix, str) or len(prefix) > MAX_PREFIX_CHARS:
        raise InvalidInput(f"prefix must be a str of at most {MAX_PREFIX_CHARS} characters")
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
    return question, passages, max_words, prefix


async def _nothing() -> None:
    return None


async def stream_answer(
    passages: Sequence[str],
    max_words: int,
    *,
    tenant: str,
    faults: Faults,
    word_s: float,
    prefix: str = "",
) -> AsyncGenerator[str, None]:
    """The model's answer for ``tenant``: ``max_words`` words of ``passages``, one every
    ``word_s`` seconds, through the faults of the three stages (see the module docstring); after
    a ``prefix``, from the prefix's last word on. Raises what a fault raises (its error, at its
    point of the answer)."""
    words = answer_words(passages)
    start = max(0, len(prefix.split()) - 1)  # the last word again, as a model told to continue does
    for _ in islice(words, start):
        pass
    midway = start + (max_words - start) // 2
    await faults("generation", tenant, _nothing)
    for i in range(start, max_words):
        if i == midway and i > start:
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
