"""`ragguard doctor` shows where a request's deadline went, stage by stage: each stage's completion
says what the request's deadline had left when it started (``StageCompleted.deadline_s``), the
recorder sums it with what the stage spent, and the diagnosis prints the table. The pipeline runs
on a FakeClock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import ragguard
from ragguard import FakeClock, Guard, Policy, StagePolicy, events
from ragguard.monitors._record import EventRecorder, load_records
from ragguard.testing import fresh_guard
from ragguard_tools.doctor import diagnose, doctor_main

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # FakeClock's attempt timers cancel asyncio tasks


def _rag(clock: FakeClock) -> Guard:
    """Four stages: embed 0.1 s, search 0.05 s, a hung rerank with a fallback and a 30% share,
    and a streamed answer of two 0.1 s tokens."""
    policy = Policy(stages={"rerank_x": StagePolicy(deadline_share=0.3, reserve=0)})
    guard = fresh_guard(policy, clock=clock)

    @guard.guard("embed_x")
    async def embed(text: str) -> list[float]:
        await clock.sleep(0.1)
        return [0.0]

    @guard.guard("search_x")
    async def search(vector: list[float]) -> list[str]:
        await clock.sleep(0.05)
        return ["p1", "p2"]

    @guard.guard("rerank_x", fallback=lambda query, passages: passages)
    async def rerank(query: str, passages: list[str]) -> list[str]:
        await clock.sleep(60)
        return passages

    @guard.guard("answer_x")
    async def answer(passages: list[str]) -> AsyncIterator[str]:
        for token in ("an", "swer"):
            await clock.sleep(0.1)
            yield token

    async def ask() -> str:
        async with guard.tenant("acme"), guard.deadline(1.0):
            passages = await rerank("q", await search(await embed("q")))
            return "".join([token async for token in answer(passages)])

    guard.ask = ask  # type: ignore[attr-defined]
    return guard


async def _settle() -> None:
    for _ in range(3):  # events reach listeners on a later loop iteration
        await asyncio.sleep(0)


async def test_the_doctor_shows_where_the_budget_went_stage_by_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = FakeClock()
    path = tmp_path / "events.jsonl"
    guard = _rag(clock)
    with EventRecorder(path=path, clock=clock):
        for _ in range(2):
            assert await guard.ask() == "answer"  # type: ignore[attr-defined]
        await _settle()
    budget = {b.stage: b for b in diagnose(load_records(path)).budget}
    assert list(budget) == ["embed_x", "search_x", "rerank_x", "answer_x"]  # in the order they ran
    assert [budget[s].calls for s in budget] == [2, 2, 2, 2]
    left = {stage: row.left_s for stage, row in budget.items()}
    spent = {stage: row.spent_s for stage, row in budget.items()}
    assert left == pytest.approx({"embed_x": 1.0, "search_x": 0.9, "rerank_x": 0.85, "answer_x": 0.595})
    assert spent == pytest.approx({"embed_x": 0.1, "search_x": 0.05, "rerank_x": 0.3 * 0.85, "answer_x": 0.2})
    rerank = budget["rerank_x"]
    assert rerank.spent_share == pytest.approx(0.3) and rerank.fallback == 2 and rerank.deadline == 0
    assert doctor_main(["--events", str(path)]) == 1  # the fallbacks are findings
    out = capsys.readouterr().out
    table = out[out.index("where the requests' deadlines went") :]
    assert [line.split()[0] for line in table.splitlines()[1:5]] == list(budget)
    rerank_line = "rerank_x            2 call(s): started with 850 ms left, spent 255 ms (30%)"
    assert f"{rerank_line}; 2 answered by a fallback" in table


async def test_a_stage_that_ran_out_of_time_is_counted() -> None:
    clock = FakeClock()
    guard = fresh_guard(Policy(stages={"slow": StagePolicy(deadline_share=0.5)}), clock=clock)

    @guard.guard("slow")
    async def slow() -> None:
        await clock.sleep(60)

    with EventRecorder(clock=clock) as recorder:
        with pytest.raises(ragguard.DeadlineExceeded):
            async with guard.deadline(2.0):
                await slow()
        await _settle()
    (row,) = diagnose(recorder.records()).budget
    assert (row.stage, row.calls, row.deadline, row.fallback) == ("slow", 1, 1, 0)
    assert row.spent_s == pytest.approx(1.0) and row.left_s == pytest.approx(2.0)
    assert "1 ran out of time" in row.line()


async def test_stage_completions_say_what_the_deadline_had_left() -> None:
    clock = FakeClock()
    guard = fresh_guard(clock=clock)

    @guard.guard("one")
    async def one() -> None:
        await clock.sleep(0.1)

    @guard.guard("many")
    async def many() -> AsyncIterator[int]:
        yield 1

    with ragguard.testing.EventRecorder() as seen:
        await one()
        async with guard.deadline(3.0):
            clock.advance(0.5)
            await one()
            assert [i async for i in many()] == [1]
        await seen.settle()
    completed = seen.of(events.StageCompleted)
    assert [(e.stage, e.deadline_s) for e in completed] == [
        ("one", None), ("one", pytest.approx(2.5)), ("many", pytest.approx(2.4)),
    ]  # fmt: skip


def test_runs_have_their_own_budget_and_old_files_none(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "events.jsonl"
    bus = events.EventBus()
    recorder = EventRecorder(path=path, bus=bus, clock=clock).start()
    recorder.mark_run("unguarded")
    recorder.record(events.StageCompleted("rerank", "t", "success", 0.9, deadline_s=1.0))
    cut = events.StageCompleted("rerank", "t", "error", 1.0, error="DeadlineExceeded", deadline_s=1.0)
    recorder.record(cut)
    clock.advance(2.0)
    recorder.record(events.StageCompleted("rerank", "t", "success", 0.1))  # no deadline: not in the budget
    clock.advance(0.5)
    recorder.mark_run("guarded")
    clock.advance(2.0)
    recorder.record(events.StageCompleted("rerank", "t", "fallback", 0.3, fallback="skip", deadline_s=1.0))
    clock.advance(2.0)
    recorder.close()
    result = diagnose(load_records(path))
    rows = {(b.run, b.stage): b for b in result.budget}
    assert set(rows) == {("unguarded", "rerank"), ("guarded", "rerank")}
    unguarded = rows["unguarded", "rerank"]
    assert unguarded.calls == 2 and unguarded.spent_s == pytest.approx(0.95) and unguarded.deadline == 1
    assert rows["guarded", "rerank"].calls == 1 and rows["guarded", "rerank"].fallback == 1
    text = result.to_text()
    assert text.index("== run 'unguarded'") < text.index("started with 1000 ms left, spent 950 ms (95%)")
    assert text.index("== run 'guarded'") < text.index("spent 300 ms (30%); 1 answered by a fallback")
    assert result.to_dict()["budget"][0]["spent_share"] == pytest.approx(0.95)
    # a file written before stages said what their deadline had left: no table, no error
    old = [{"type": "Tally", "t": 1.0, "since": 0.0, "stages": {"rerank": {"success": 3}}, "calls": {},
            "rejected": {}}]  # fmt: skip
    assert diagnose(old).budget == () and "deadlines went" not in diagnose(old).to_text()
    bad = [{**old[0], "budget": {"rerank": {"calls": "3", "left_s": 1.0, "spent_s": 0.5}, "x": 7}}]
    assert diagnose(bad).budget == ()


def test_a_healthy_log_still_shows_the_budget() -> None:
    tally = {"type": "Tally", "t": 1.0, "since": 0.0, "stages": {"embed": {"success": 4}}, "calls": {},
             "rejected": {}, "budget": {"embed": {"calls": 4, "left_s": 2.0, "spent_s": 0.2}}}  # fmt: skip
    result = diagnose([tally])
    assert result.healthy  # a report, not a finding
    line = "  embed               4 call(s): started with 500 ms left, spent 50 ms (10%)"
    assert result.to_text().splitlines()[-1] == line
