"""Continuation, on the Guard's fake clock: a generation stream that fails after its commit point
goes on with ``continuation=`` from what the caller has (``partial=``), without a duplicate or a
gap; the breaker counts the failure it replaces; the continuation has budgets, a token reservation
and pacing of its own under the request's deadline; what is never continued; and every stream's
typed ending (``stream.ending``, ``stream_endings()``, ``degraded()``, events)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from gen_helpers import Recorder, answer_policy, collect, drive, guard

import ragguard
from ragguard import (
    BreakerPolicy,
    ConfigError,
    DeadlineExceeded,
    FakeClock,
    StreamEnding,
    StreamTimeout,
    TenantQuota,
)
from ragguard.events import CallOutcome, StreamContinued, StreamEnded, StreamSettled
from ragguard.rag import FallbackMiss, Partial, token_accounts

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]

WORDS = [f"w{i} " for i in range(10)]
ANSWER = "".join(WORDS)


class Model:
    """The model's answer, word by word (0.1 s apart), stalling or failing ``at`` a word."""

    def __init__(self, clock: FakeClock, *, stall_at: int | None = None, fail_at: int | None = None) -> None:
        self.clock = clock
        self.stall_at = stall_at
        self.fail_at = fail_at
        self.closed = 0

    async def __call__(self, question: str) -> AsyncIterator[str]:
        try:
            for i, word in enumerate(WORDS):
                if i == self.stall_at:
                    await self.clock.sleep(1000)
                if i == self.fail_at:
                    raise ConnectionResetError("the model dropped the stream")
                await self.clock.sleep(0.1)
                yield word
        finally:
            self.closed += 1


class Finish:
    """A continuation: the rest of the answer after what the caller has, starting ``repeat`` words
    back (a model asked to continue repeats some), optionally stalling ``stall_at`` words in."""

    def __init__(self, clock: FakeClock, *, repeat: int = 2, stall_at: int | None = None) -> None:
        self.clock = clock
        self.repeat = repeat
        self.stall_at = stall_at
        self.partials: list[Partial] = []
        self.closed = 0
        self.__name__ = "finish"

    async def __call__(self, question: str, *, partial: Partial) -> AsyncIterator[str]:
        self.partials.append(partial)
        n = len(partial.items)
        try:
            for i, word in enumerate(WORDS[max(0, n - self.repeat) :]):
                if i == self.stall_at:
                    await self.clock.sleep(1000)
                await self.clock.sleep(0.1)
                yield word
        finally:
            self.closed += 1


def setup(
    clock: FakeClock,
    model: Model,
    finish: Any,
    *,
    tenants: dict[str, TenantQuota] | None = None,
    default_quota: TenantQuota | None = None,
    **options: Any,
) -> Any:
    policy = answer_policy(first_item_s=2.0, idle_s=1.0, total_s=100.0, tenants=tenants)
    if default_quota is not None:
        policy = policy.model_copy(update={"default_quota": default_quota})
    g = guard(policy, clock)

    async def answer(question: str) -> AsyncIterator[str]:
        async for word in model(question):
            yield word

    return g, g.guard("answer", continuation=finish, **options)(answer)


async def test_a_stalled_answer_goes_on_from_what_the_caller_has_without_a_repeat() -> None:
    clock = FakeClock(auto_advance=False)
    model, finish = Model(clock, stall_at=4), None
    finish = Finish(clock, repeat=2)
    g, answer = setup(clock, model, finish)
    async with g.tenant("acme"):
        stream = answer("q")
        got = await drive(clock, collect(stream))
        degraded, endings = ragguard.degraded(), ragguard.stream_endings()
    assert got[:4] == WORDS[:4] and "".join(got) == ANSWER  # no word twice, none missing
    (partial,) = finish.partials
    assert (partial.items, partial.text, partial.stage) == (tuple(WORDS[:4]), "".join(WORDS[:4]), "answer")
    assert isinstance(partial.error, StreamTimeout) and partial.error.budget == "idle"
    assert stream.ending == StreamEnding("continued", "answer", len(got), "finish", 4, "StreamTimeout")
    assert endings == (stream.ending,) and degraded == ("continued: finish after 4 items",)
    assert model.closed == 1 and finish.closed == 1  # the stalled stream was closed, not abandoned


async def test_an_error_after_the_commit_point_is_continued_and_named() -> None:
    clock = FakeClock(auto_advance=False)
    finish = Finish(clock, repeat=0)
    _, answer = setup(clock, Model(clock, fail_at=3), finish)
    stream = answer("q")
    assert "".join(await drive(clock, collect(stream))) == ANSWER
    assert (stream.ending.kind, stream.ending.error, stream.ending.continued_after) == (
        "continued",
        "ConnectionResetError",
        3,
    )


async def test_the_breaker_counts_the_failure_the_continuation_replaces(events: Recorder) -> None:
    clock = FakeClock(auto_advance=False)
    policy = answer_policy(
        first_item_s=2.0, idle_s=1.0, breaker=BreakerPolicy(kind="generic", minimum_calls=1)
    )
    g = guard(policy, clock)
    model, finish = Model(clock, fail_at=3), Finish(clock)

    async def answer(question: str) -> AsyncIterator[str]:
        async for word in model(question):
            yield word

    guarded = g.guard("answer", continuation=finish)(answer)
    assert "".join(await drive(clock, collect(guarded("q")))) == ANSWER
    await events.settle()
    assert [e.outcome for e in events.of(CallOutcome)] == ["failure"]  # the primary, once
    assert g.breaker("answer").state.value == "open"  # and its failure opened the breaker


async def test_the_continuation_has_budgets_of_its_own() -> None:
    clock = FakeClock(auto_advance=False)
    # the continuation's first word never comes: its own first-item budget (2 s) cuts it
    finish = Finish(clock, stall_at=0)
    _, answer = setup(clock, Model(clock, stall_at=4), finish)
    got: list[str] = []
    stream = answer("q")
    started = clock()
    with pytest.raises(StreamTimeout) as cut:
        await drive(clock, collect(stream, got))
    assert got == WORDS[:4] and cut.value.budget == "idle"  # the primary's cut, as without one
    notes = getattr(cut.value, "__notes__", [])
    assert any("continuation 'finish' failed too: StreamTimeout" in n for n in notes), notes
    assert stream.ending.kind == "incomplete" and stream.ending.items == 4
    assert clock() - started == pytest.approx(0.4 + 1.0 + 2.0, abs=0.05)  # words, idle cut, first-item cut

    # one that stalls after its first words is cut by its own idle budget: an incomplete answer
    finish = Finish(clock, repeat=0, stall_at=2)
    _, answer = setup(clock, Model(clock, stall_at=4), finish)
    got = []
    stream = answer("q")
    with pytest.raises(StreamTimeout) as cut:
        await drive(clock, collect(stream, got))
    assert got == WORDS[:6] and cut.value.budget == "idle"
    assert stream.ending == StreamEnding("incomplete", "answer", 6, "finish", 4, "StreamTimeout")


async def test_the_continuation_runs_under_the_request_deadline() -> None:
    clock = FakeClock(auto_advance=False)
    g, answer = setup(clock, Model(clock, fail_at=3), Finish(clock, repeat=0, stall_at=2))
    got: list[str] = []
    stream = answer("q")

    async def read() -> None:
        with g.deadline(1.0):
            await collect(stream, got)

    with pytest.raises(DeadlineExceeded):
        await drive(clock, read())
    assert got == WORDS[:5] and stream.ending.kind == "incomplete"


async def test_both_streams_reserve_settle_and_pace_their_tokens(events: Recorder) -> None:
    clock = FakeClock(auto_advance=False)
    tenants = {"acme": TenantQuota(token_quota=1000, tokens_per_s=2, token_burst=1)}
    finish = Finish(clock)
    g, answer = setup(clock, Model(clock, fail_at=4), finish, tenants=tenants, estimate=20)
    accounts = token_accounts(g)
    held: list[tuple[int, int]] = []
    async with g.tenant("acme"):
        stream = answer("q")
        got: list[str] = []
        started = clock()

        async def read() -> None:
            async for word in stream:
                got.append(word)
                held.append((accounts.reserved("acme"), accounts.open_streams("acme")))

        await drive(clock, read())
    assert "".join(got) == ANSWER
    assert held[0] == (20, 1) and held[-1] == (20, 1)  # each stream held its own reservation
    assert accounts.reserved("acme") == 0 and accounts.open_streams("acme") == 0
    await events.settle()
    settled = [(e.items, e.tokens, e.reserved) for e in events.of(StreamSettled)]
    assert settled == [(4, 4, 20), (8, 8, 20)]  # the cut stream, then its continuation (2 repeated)
    assert accounts.settled("acme") == 12
    # paced at 2 tokens/s past a burst of 1, the continuation's eight words too (unpaced, the
    # whole answer would take 1.2 s)
    assert clock() - started >= (12 - 1) / 2 - 0.05


async def test_a_continuation_holds_the_call_slot_and_a_cancel_releases_everything() -> None:
    clock = FakeClock(auto_advance=False)
    quota = TenantQuota(max_concurrency=1, token_quota=1000)
    finish = Finish(clock, repeat=0, stall_at=3)
    g, answer = setup(clock, Model(clock, fail_at=3), finish, default_quota=quota, estimate=20)
    accounts = token_accounts(g)
    stream = answer("q")  # outside a request: the stage's quota gate takes the default tenant's slot
    got: list[str] = []

    async def read() -> None:
        async for word in stream:
            got.append(word)

    task = asyncio.ensure_future(read())
    for _ in range(200):
        await asyncio.sleep(0)
        clock.advance(0.05)
        if len(got) == 6:  # three of the cut stream, three of its continuation, which now stalls
            break
    assert g.quotas.in_flight("default") == 1 and accounts.reserved("default") == 20
    assert accounts.open_streams("default") == 1  # the cut stream settled; the continuation's is open
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await stream.aclose()
    assert g.quotas.in_flight("default") == 0
    assert accounts.reserved("default") == 0 and accounts.open_streams("default") == 0
    assert finish.closed == 1 and stream.ending.kind == "incomplete" and stream.ending.error == "cancelled"


async def test_a_sequence_is_tried_in_order_until_one_answers_and_error_is_passed() -> None:
    clock = FakeClock(auto_advance=False)
    seen: list[Any] = []

    async def declines(question: str, *, partial: Partial) -> AsyncIterator[str]:
        raise FallbackMiss("no second model today")
        yield ""  # pragma: no cover

    def extractive(question: str, *, partial: Partial, error: BaseException) -> list[str]:
        seen.append(error)
        return WORDS[len(partial.items) - 1 :]  # a sync continuation returning a list: trimmed too

    _, answer = setup(clock, Model(clock, fail_at=5), [declines, extractive])
    stream = answer("q")
    assert "".join(await drive(clock, collect(stream))) == ANSWER
    assert stream.ending.continued_by == "extractive"
    assert len(seen) == 1 and isinstance(seen[0], ConnectionResetError)


async def test_a_continuation_that_fails_midway_hands_the_stream_to_the_next(events: Recorder) -> None:
    clock = FakeClock(auto_advance=False)
    second = Finish(clock, repeat=1, stall_at=3)  # repeats a word, then stalls after 2 more
    partials: list[Partial] = []

    def extractive(question: str, *, partial: Partial) -> list[str]:
        partials.append(partial)
        return WORDS[len(partial.items) :]

    _, answer = setup(clock, Model(clock, stall_at=4), [second, extractive])
    stream = answer("q")
    got = await drive(clock, collect(stream))
    assert "".join(got) == ANSWER and got == WORDS  # no word twice, none missing, across both joins
    (partial,) = partials  # given everything the caller had: the model's 4 and the second's 2
    assert partial.items == tuple(WORDS[:6]) and partial.text == "".join(WORDS[:6])
    assert isinstance(partial.error, StreamTimeout) and partial.error.budget == "idle"
    assert stream.ending == StreamEnding("continued", "answer", 10, "extractive", 6, "StreamTimeout")
    assert second.closed == 1  # the stalled continuation was closed
    await events.settle()
    taken = [(e.continuation, e.items) for e in events.of(StreamContinued)]
    assert taken == [("finish", 4), ("extractive", 6)]

    # each carries a stream on once at most: the last one's failure ends it
    last = Finish(clock, repeat=0, stall_at=1)
    _, answer = setup(clock, Model(clock, stall_at=4), [Finish(clock, repeat=0, stall_at=1), last])
    got = []
    stream = answer("q")
    with pytest.raises(StreamTimeout):
        await drive(clock, collect(stream, got))
    assert got == WORDS[:6] and last.partials[0].items == tuple(WORDS[:5])
    assert stream.ending == StreamEnding("incomplete", "answer", 6, "finish", 5, "StreamTimeout")


async def test_a_continuation_may_be_an_async_def_returning_a_stream() -> None:
    clock = FakeClock(auto_advance=False)

    async def rest(n: int) -> AsyncIterator[str]:
        for word in WORDS[n:]:
            yield word

    async def sdk_like(question: str, *, partial: Partial) -> AsyncIterator[str]:  # as create(stream=True)
        return rest(len(partial.items))

    _, answer = setup(clock, Model(clock, fail_at=6), sdk_like)
    stream = answer("q")
    assert "".join(await drive(clock, collect(stream))) == ANSWER
    assert stream.ending.continued_by == "sdk_like"


async def test_a_continuation_that_has_nothing_to_add_completes_the_answer() -> None:
    clock = FakeClock(auto_advance=False)

    async def nothing(question: str, *, partial: Partial) -> AsyncIterator[str]:
        return
        yield ""  # pragma: no cover

    _, answer = setup(clock, Model(clock, fail_at=5), nothing)
    stream = answer("q")
    assert await drive(clock, collect(stream)) == WORDS[:5]
    assert (stream.ending.kind, stream.ending.items) == ("continued", 5)


async def test_never_after_the_deadline_a_caller_error_or_a_cancellation() -> None:
    clock = FakeClock(auto_advance=False)
    finish = Finish(clock)

    async def refused(question: str) -> AsyncIterator[str]:
        yield "w0 "
        raise ValueError("a caller's error is the caller's")

    g = guard(answer_policy(first_item_s=2.0, idle_s=1.0), clock)
    answer = g.guard("answer", continuation=finish)(refused)
    with pytest.raises(ValueError):
        await drive(clock, collect(answer("q")))

    _, slow = setup(clock, Model(clock, stall_at=3), finish)
    stream = slow("q")

    async def read() -> None:
        with g.deadline(0.5):
            await collect(stream)

    with pytest.raises(DeadlineExceeded):
        await drive(clock, read())
    assert finish.partials == [] and stream.ending.kind == "incomplete"


async def test_items_that_are_not_text_are_not_continued_unless_declared_safe() -> None:
    clock = FakeClock(auto_advance=False)
    seen: list[Partial] = []

    async def finish(question: str, *, partial: Partial) -> AsyncIterator[Any]:
        seen.append(partial)
        yield {"tool": "rest"}

    async def tool_call(question: str) -> AsyncIterator[Any]:
        yield {"tool": "search", "arguments": '{"q": '}
        raise ConnectionResetError("cut in the middle of a tool call")

    g = guard(answer_policy(first_item_s=2.0, idle_s=1.0), clock)
    refused = g.guard("answer", continuation=finish)(tool_call)
    got: list[Any] = []
    with pytest.raises(ConnectionResetError) as cut:
        await drive(clock, collect(refused("q"), got))
    assert len(got) == 1 and seen == []
    assert any("not text" in n for n in cut.value.__notes__)

    safe = g.guard("answer", continuation=finish, continue_structured=True)(tool_call)
    stream = safe("q")
    assert await drive(clock, collect(stream)) == [
        {"tool": "search", "arguments": '{"q": '},
        {"tool": "rest"},
    ]
    assert seen[0].text is None and stream.ending.kind == "continued"

    # text= reads an item's text: chunk objects are text when it says so
    chunks = g.guard("answer", continuation=finish, text=lambda item: item.get("text"))(tool_call)
    with pytest.raises(ConnectionResetError):
        await drive(clock, collect(chunks("q")))


async def test_a_guarded_continuation_runs_under_its_own_stage(events: Recorder) -> None:
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(first_item_s=2.0, idle_s=1.0), clock)

    @g.guard("backup_model")
    async def backup(question: str, *, partial: Partial) -> AsyncIterator[str]:
        for word in WORDS[len(partial.items) :]:
            yield word

    model = Model(clock, stall_at=2)

    async def answer(question: str) -> AsyncIterator[str]:
        async for word in model(question):
            yield word

    guarded = g.guard("answer", continuation=backup)(answer)
    async with g.tenant("acme"):
        stream = guarded("q")
        assert "".join(await drive(clock, collect(stream))) == ANSWER
        endings = ragguard.stream_endings()
    assert [(e.stage, e.kind) for e in endings] == [("backup_model", "completed"), ("answer", "continued")]
    await events.settle()
    assert {e.breaker for e in events.of(CallOutcome)} >= {"backup_model"}


async def test_every_stream_ends_typed_in_events() -> None:
    clock = FakeClock(auto_advance=False)
    with Recorder() as recorder:
        _, answer = setup(clock, Model(clock, stall_at=4), Finish(clock))
        await drive(clock, collect(answer("q")))
        _, whole = setup(clock, Model(clock), Finish(clock))
        await drive(clock, collect(whole("q")))
        await recorder.settle()
    continued = recorder.of(StreamContinued)
    assert [(e.continuation, e.items, e.error) for e in continued] == [("finish", 4, "StreamTimeout")]
    ended = [(e.stage, e.ending, e.continued_by, e.continued_after) for e in recorder.of(StreamEnded)]
    assert ended == [("answer", "continued", "finish", 4), ("answer", "completed", "", 0)]


async def test_an_early_close_and_a_failure_before_the_first_item_end_incomplete() -> None:
    clock = FakeClock(auto_advance=False)
    g, answer = setup(clock, Model(clock), Finish(clock))
    stream = answer("q")
    assert stream.ending is None  # not started
    assert await drive(clock, anext(stream)) == "w0 "
    await stream.aclose()
    assert stream.ending == StreamEnding("incomplete", "answer", 1, error="closed")

    async def broken(question: str) -> AsyncIterator[str]:
        raise ConnectionRefusedError("no model")
        yield ""  # pragma: no cover

    refused = g.guard("answer", continuation=Finish(clock))(broken)
    stream = refused("q")
    with pytest.raises(ConnectionRefusedError):
        await drive(clock, collect(stream))
    assert stream.ending == StreamEnding("incomplete", "answer", 0, error="ConnectionRefusedError")


def test_a_continuation_is_checked_at_decoration() -> None:
    g = ragguard.Guard(answer_policy())

    async def answer(question: str) -> AsyncIterator[str]:
        yield question

    def no_partial(question: str) -> list[str]:
        return []

    def finish(question: str, *, partial: Partial) -> list[str]:
        return []

    with pytest.raises(ConfigError, match="keyword-only parameter partial"):
        g.guard("answer", continuation=no_partial)(answer)
    with pytest.raises(ConfigError, match=r"continuation\[1\]"):
        g.guard("answer", continuation=[finish, "not callable"])(answer)

    async def takes_partial(question: str, partial: str) -> AsyncIterator[str]:
        yield question

    with pytest.raises(ConfigError, match="parameter named partial"):
        g.guard("answer", continuation=finish)(takes_partial)

    async def whole(question: str) -> str:
        return question

    with pytest.raises(ConfigError, match="async generator functions only"):
        g.guard("answer", continuation=finish)(whole)
    with pytest.raises(ConfigError, match="preset"):  # a stage without the generation preset
        g.guard("plain", continuation=finish)(answer)
    with pytest.raises(ConfigError, match="text"):
        g.guard("answer", continuation=finish, text="item.text")(answer)
    with pytest.raises(ConfigError, match="continue_structured"):
        g.guard("answer", continuation=finish, continue_structured="yes")(answer)
    g.guard("answer", continuation=finish)(answer)  # the good one


async def test_the_continuation_stays_within_the_stages_deadline_share() -> None:
    clock = FakeClock(auto_advance=False)
    policy = answer_policy(first_item_s=2.0, idle_s=5.0)
    policy = policy.model_copy(
        update={"stages": {"answer": policy.stages["answer"].model_copy(update={"deadline_share": 0.5})}}
    )
    g = guard(policy, clock)
    model, finish = Model(clock, fail_at=3), Finish(clock, repeat=0, stall_at=2)

    async def answer(question: str) -> AsyncIterator[str]:
        async for word in model(question):
            yield word

    guarded = g.guard("answer", continuation=finish)(answer)
    got: list[str] = []
    stream = guarded("q")

    async def read() -> None:
        with g.deadline(4.0):  # the stage may spend half of it: 2 s
            await collect(stream, got)

    started = clock()
    with pytest.raises(DeadlineExceeded):
        await drive(clock, read())
    assert got == WORDS[:5]  # three words, two of the continuation's, then its stall
    assert clock() - started == pytest.approx(2.0, abs=0.05)  # cut at the share, not at 4 s
