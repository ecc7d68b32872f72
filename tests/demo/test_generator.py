"""The extractive generator's stream: its words, and where each of its three fault points acts.

The faults are stand-ins here (a function per stage that records the call, waits on an event or
raises), so each test says exactly when the model is asked to stall, overrun or fail.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

import pytest

from ragguard import InvalidInput
from ragguard_tools.demo.generator import (
    answer_words,
    extractive_answer,
    extractive_rest,
    parse_request,
    stream_answer,
    whole_answer,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]

PASSAGES = ["one two three four five six", "seven eight nine"]


class Faults:
    """Records (stage, words handed over so far) at each fault point; ``hold`` makes a stage wait
    for its event, ``fail`` makes it raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.handed = 0
        self.hold: dict[str, asyncio.Event] = {}
        self.fail: dict[str, Exception] = {}

    async def __call__(self, stage: str, tenant: str, call: Callable[[], Awaitable[Any]]) -> Any:
        self.calls.append((stage, self.handed))
        if stage in self.hold:
            await self.hold[stage].wait()
        if stage in self.fail:
            raise self.fail[stage]
        return await call()


async def take(faults: Faults, max_words: int, *, limit: int = 1000, prefix: str = "") -> list[str]:
    got: list[str] = []
    stream = stream_answer(PASSAGES, max_words, tenant="acme", faults=faults, word_s=0.0, prefix=prefix)
    async with aclosing(stream) as words:
        async for word in words:
            got.append(word)
            faults.handed += 1
            if len(got) >= limit:
                break
    return got


async def test_an_answer_is_the_passages_words_in_order_through_each_fault_point() -> None:
    faults = Faults()
    assert await take(faults, 4) == ["one ", "two ", "three ", "four "]
    assert faults.calls == [("generation", 0), ("generation_midway", 2), ("generation_overrun", 4)]


async def test_the_words_start_again_when_the_passages_run_out() -> None:
    words = answer_words(PASSAGES)
    assert [next(words) for _ in range(11)][-3:] == ["nine ", "one ", "two "]
    assert list(answer_words(["", " "])) == []


async def test_an_overrun_keeps_the_model_talking_until_its_latency_is_over() -> None:
    faults = Faults()
    faults.hold["generation_overrun"] = release = asyncio.Event()
    stream = stream_answer(PASSAGES, 3, tenant="acme", faults=faults, word_s=0.0)
    got = []
    async with aclosing(stream):
        async for word in stream:
            got.append(word)
            if len(got) == 8:
                release.set()  # the overrun's latency ends: the model stops at its next word
    assert got[:3] == ["one ", "two ", "three "]
    assert 8 <= len(got) <= 10 and got[3:5] == ["four ", "five "]


async def test_a_caller_that_leaves_mid_overrun_stops_the_overrun() -> None:
    faults = Faults()
    faults.hold["generation_overrun"] = asyncio.Event()  # never set: the model would talk for ever
    assert len(await take(faults, 2, limit=6)) == 6
    await asyncio.sleep(0)
    overruns = [t for t in asyncio.all_tasks() if "_outcome" in repr(t.get_coro())]
    assert overruns == []


@pytest.mark.parametrize(
    ("stage", "handed"), [("generation", 0), ("generation_midway", 3), ("generation_overrun", 6)]
)
async def test_an_error_fault_ends_the_stream_at_its_point(stage: str, handed: int) -> None:
    faults = Faults()
    faults.fail[stage] = ConnectionResetError("the model went away")
    with pytest.raises(ConnectionResetError):
        await take(faults, 6)
    assert faults.handed == handed


def test_the_fallback_answer_is_the_top_passages_first_sentence() -> None:
    passages = ["The else clause runs. Then the finally clause.", "other"]
    assert extractive_answer("q", passages, 30) == ["The ", "else ", "clause ", "runs "]
    assert extractive_answer("q", passages, 2) == ["The ", "else "]
    assert extractive_answer("q", [], 5) == []


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        ({"passages": ["a"], "max_words": 3}, "question"),
        ({"question": "q", "passages": [], "max_words": 3}, "passages"),
        ({"question": "q", "passages": [1], "max_words": 3}, "passages"),
        ({"question": "q", "passages": ["a"], "max_words": 0}, "max_words"),
        ({"question": "q", "passages": ["a"], "max_words": True}, "max_words"),
        ({"question": "q", "passages": ["a"], "max_words": 10**6}, "max_words"),
        ({"question": "q", "passages": ["a"], "max_words": 3, "prefix": 7}, "prefix"),
        ({"question": "q", "passages": ["a"], "max_words": 3, "prefix": "a " * 10_000}, "prefix"),
    ],
)
def test_bad_requests_name_their_field(request_: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        parse_request(request_)
    assert parse_request({"question": "q", "passages": ["a"], "max_words": 3}) == ("q", ["a"], 3, "")
    assert parse_request({"question": "q", "passages": ["a"], "max_words": 3, "prefix": "a "})[3] == "a "


async def test_a_continuation_goes_on_from_the_prefixs_last_word_through_its_own_fault_points() -> None:
    faults = Faults()
    got = await take(faults, 8, prefix="one two three ")
    assert got == ["three ", "four ", "five ", "six ", "seven ", "eight "]  # its last word again, to 8 in all
    # halfway through the words it was asked for (2..7): before its 5th word, "six"
    assert faults.calls == [("generation", 0), ("generation_midway", 3), ("generation_overrun", 6)]
    assert await take(Faults(), 3, prefix="one two three four ") == []  # nothing left to say


def test_the_rest_of_an_answer_and_whether_an_answer_is_whole() -> None:
    assert extractive_rest(PASSAGES, "one two three ", 6) == ["four ", "five ", "six "]
    assert extractive_rest(PASSAGES, "", 2) == ["one ", "two "]
    assert extractive_rest(PASSAGES, "one two three ", 2) == []
    model = "one two three four five six seven eight nine one "
    assert whole_answer(model, PASSAGES, 10) and whole_answer(model + "two ", PASSAGES, 10)  # ran long
    assert not whole_answer(model, PASSAGES, 11), "a word missing at the end"
    assert not whole_answer("one two two three four five six seven eight nine ", PASSAGES, 10), "a repeat"
    assert not whole_answer("one two four five six seven eight nine one two ", PASSAGES, 10), "a gap"
    assert whole_answer("The else clause runs ", ["The else clause runs. Then more."], 30)  # extractive
    assert not whole_answer("", PASSAGES, 10)
