"""The demo's table and chart, from hand-made records: what a reader is told."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from ragguard_tools.demo.loadgen import RequestRecord
from ragguard_tools.demo.report import (
    OPENED_ROW,
    DemoReport,
    GenerationTally,
    RunResult,
    TenantStreams,
    Transition,
    summarize,
    token_rate,
)

BREAKERS = ["embedding", "vector_store", "rerank"]


def record(
    at_s: float, latency_s: float, outcome: str = "ok", fallbacks: tuple[str, ...] = ()
) -> RequestRecord:
    return RequestRecord(at_s, "acme", 0, latency_s, outcome, fallbacks=fallbacks,
                         hit=True if outcome == "ok" else None)


def report(guarded_records: list[RequestRecord], transitions: list[Transition]) -> DemoReport:
    plain = [record(1.0, 0.01), record(2.0, 3.5, "error")]
    unguarded = RunResult("unguarded", 10.0, plain, [("a", 0.0, 10.0)])
    guarded = RunResult("guarded", 10.0, guarded_records, [("a", 0.0, 10.0)], transitions=transitions,
                        breakers=BREAKERS, rerank_floor=4)
    runs = {"unguarded": unguarded, "guarded": guarded}
    return DemoReport(options={}, baseline_recall_at_5=0.9, questions=1, passages=1, timings_s={}, runs=runs,
                      summaries={m: summarize(r, greedy=[], slo_s=1.0) for m, r in runs.items()}, greedy=[])


def text_of(table: object) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(table)
    return " ".join(out.getvalue().split())  # the caption wraps at the table's width


CHUNKED = [record(1.0, 0.02), record(2.0, 0.03, fallbacks=("chunked_rerank",)),
           record(3.0, 0.002, fallbacks=("keyword_search",))]


def test_the_table_says_why_the_rerank_breaker_stayed_closed() -> None:
    opened = [Transition(1.0, "vector_store", "closed", "open"),
              Transition(2.0, "vector_store", "open", "half_open")]
    text = text_of(report(CHUNKED, opened).table())
    assert f"{OPENED_ROW} │ - │ 1 │ │ embedding │ - │ 0 │ │ vector_store │ - │ 1 │" in text
    assert "rerank (OOM at floor only) │ - │ 0 │" in text
    assert "rerank breaker closed" in text and "floor batch (4 candidates)" in text
    assert "answered by a fallback (any)" in text and "66.7 %" in text


def test_the_table_and_the_doctor_count_openings_in_the_same_words() -> None:
    """A reopening after a failed trial round is an opening in both, and both say so alike."""
    from ragguard.events import BreakerTransition
    from ragguard_tools.doctor import diagnose

    moves = [("closed", "open", 1.0), ("open", "half_open", 2.0), ("half_open", "open", 2.1),
             ("open", "half_open", 3.1), ("half_open", "closed", 3.2)]
    transitions = [Transition(at, "embedding", old, new) for old, new, at in moves]
    text = text_of(report(CHUNKED, transitions).table())
    assert "after a failed trial" in OPENED_ROW
    assert f"{OPENED_ROW} │ - │ 2 │ │ embedding │ - │ 2 │ │ vector_store │ - │ 0 │" in text
    (finding,) = diagnose([BreakerTransition("embedding", old, new, at) for old, new, at in moves]).findings
    assert "breaker 'embedding' opened 2 time(s) (1 after a failed trial)," in finding.summary
    assert finding.data["opened"] == 2 and finding.data["reopened"] == 1


def test_no_rerank_note_when_the_rerank_breaker_opened() -> None:
    opened = [Transition(1.0, "rerank", "closed", "open")]
    assert "rerank breaker closed" not in text_of(report(CHUNKED, opened).table())


def test_the_chart_draws_fallback_answers_apart_on_one_y_range(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = report(CHUNKED, []).chart()
    try:
        unguarded, guarded = fig.axes[0], fig.axes[1]
        assert unguarded.get_ylim() == guarded.get_ylim()
        low, high = guarded.get_ylim()
        assert low < 2.0 and high > 3500.0, "the range spans both runs' latencies (2 ms to 3.5 s)"
        # one collection per kind of request: healthy answers and fallback answers are apart
        sizes = [len(c.get_offsets()) for c in guarded.collections]
        assert sizes == [1, 2, 0, 0, 0]  # healthy, by a fallback, shed by quota, cut mid-answer, failed
        healthy, by_fallback = guarded.collections[0], guarded.collections[1]
        assert len(by_fallback.get_facecolor()) == 0, "fallback answers are hollow"
        assert (healthy.get_edgecolor()[0] != by_fallback.get_edgecolor()[0]).any(), "and of another colour"
        assert any("closed: an out-of-memory error" in t.get_text() for t in fig.axes[-1].texts)
    finally:
        plt.close(fig)
    assert report(CHUNKED, []).write_chart(tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("outcome", ["quota", "cut", "error"])
def test_failed_and_shed_requests_are_not_drawn_as_answers(outcome: str) -> None:
    import matplotlib.pyplot as plt

    fig = report([record(1.0, 0.01, outcome)], []).chart()
    try:
        sizes = [len(c.get_offsets()) for c in fig.axes[1].collections]
    finally:
        plt.close(fig)
    assert sizes[:2] == [0, 0] and sum(sizes) == 1


def answered(
    tenant: str, at_s: float, ttft_s: float, latency_s: float, tokens: int, **kw: object
) -> RequestRecord:
    return RequestRecord(at_s, tenant, 0, latency_s, "ok", hit=True, ttft_s=ttft_s, words=tokens // 2,
                         tokens=tokens, **kw)  # type: ignore[arg-type]


def test_an_answers_tokens_are_spread_from_its_first_word_to_its_end() -> None:
    records = [answered("a", 0.0, 0.5, 2.5, 200), answered("a", 3.0, 0.2, 0.4, 30),
               answered("b", 0.0, 0.1, 0.2, 99)]
    rate = token_rate(records, ["a"])
    assert list(rate) == pytest.approx([50.0, 100.0, 50.0, 30.0])  # 200 over 0.5..2.5 s, then 30 in bin 3
    assert token_rate(records, ["a"], bin_s=2.0)[0] == pytest.approx(150.0 / 2.0)
    assert token_rate([], ["a"]).sum() == 0.0


def test_the_table_tells_the_generation_story() -> None:
    stalled = answered("acme", 1.0, 0.1, 3.0, 60, max_gap_s=2.5)
    slow = answered("acme", 2.0, 2.2, 2.5, 60)
    plain = [stalled, slow, answered("hoarder", 1.0, 0.1, 0.5, 500)]
    cut = RequestRecord(1.0, "acme", 0, 0.7, "cut", ttft_s=0.1, words=15, tokens=30, budget="idle")
    guarded = [cut, answered("acme", 2.0, 0.9, 1.0, 40, fallbacks=("extractive_answer",)),
               answered("hoarder", 1.0, 0.1, 2.0, 200)]
    tally = GenerationTally(paced_to={"hoarder": 100.0}, cuts={"first_item": 2, "idle": 1}, fallbacks=1,
                            streams={"hoarder": TenantStreams(1, 200, 1.5, 1),
                                     "acme": TenantStreams(2, 30, 0.0, 0)})
    runs = {"unguarded": RunResult("unguarded", 10.0, plain, [("a", 0.0, 10.0)]),
            "guarded": RunResult("guarded", 10.0, guarded, [("a", 0.0, 10.0)], generation=tally)}
    greedy = ["hoarder"]
    summaries = {m: summarize(r, greedy=greedy, slo_s=1.0) for m, r in runs.items()}
    table = DemoReport(options={}, baseline_recall_at_5=0.9, questions=1, passages=1, timings_s={},
                       runs=runs, summaries=summaries, greedy=greedy).table()
    text = " ".join(text_of(table).replace("│", " ").split())  # the rows' cells, in order
    unguarded_s, guarded_s = summaries["unguarded"], summaries["guarded"]
    assert (unguarded_s["slow_first_word"], guarded_s["slow_first_word"]) == (1, 0)
    assert (unguarded_s["answered_after_stall"], guarded_s["answered_after_stall"]) == (1, 0)
    assert guarded_s["outcomes"]["cut"] == 1
    assert guarded_s["stream_cuts"] == {"first_item": 2, "idle": 1, "total": 0}
    assert "failed: incomplete (cut mid-answer) 0 1" in text
    assert "answers cut by budget (first/idle/total) - 2 / 1 / 0" in text
    assert "generation fallback, before the first word - 1" in text
    assert "tokens/s, mean / peak: hoarder (greedy) 50 / 500 20 / 105" in text
    assert "streams paced: hoarder (to 100 tokens/s) - 1 / 1" in text
    assert "streams paced: every other tenant - 0 / 2" in text
    assert "time to first word P95 (answers begun)" in text


def test_the_table_counts_failovers_typed_endings_and_continued_answers() -> None:
    """Failovers, continuations and the deployments' streams are counted apart from the fallbacks;
    every answer's typed ending is counted, one without any is shown; recall@5 of the continued
    answers sits beside the baseline."""
    b_after_a = answered("acme", 1.0, 0.1, 0.3, 60, fallbacks=("model/b",), ending="completed", whole=True)
    continued = answered(
        "acme", 2.0, 0.1, 0.9, 60, fallbacks=("incomplete: model after 15 items",
                                              "continued: finish_on_model after 15 items"),
        ending="continued", continued_by="finish_on_model", whole=True,
    )
    by_rest = answered("globex", 3.0, 0.1, 0.9, 60, ending="continued", continued_by="finish_extractive",
                       whole=False, fallbacks=("continued: finish_extractive after 21 items",))
    missed = RequestRecord(4.0, "acme", 0, 0.9, "ok", hit=False, ttft_s=0.1, words=30, tokens=60,
                           ending="continued", continued_by="finish_on_model", whole=True)
    untyped = answered("acme", 5.0, 0.1, 0.2, 60, whole=True)
    cut = RequestRecord(6.0, "acme", 0, 0.7, "cut", ttft_s=0.1, words=15, tokens=30, ending="incomplete")
    tally = GenerationTally(deployments={"model[a]": {"success": 3, "failure": 2, "cancelled": 1},
                                         "model[b]": {"success": 4}})
    guarded = [b_after_a, continued, by_rest, missed, untyped, cut]
    runs = {"unguarded": RunResult("unguarded", 10.0, [answered("acme", 1.0, 0.1, 0.3, 60, whole=True)],
                                   [("a", 0.0, 10.0)]),
            "guarded": RunResult("guarded", 10.0, guarded, [("a", 0.0, 10.0)], generation=tally)}
    summaries = {m: summarize(r, greedy=[], slo_s=1.0) for m, r in runs.items()}
    g = summaries["guarded"]
    assert g["fallback_share"] == {} and g["fallback_share_any"] == 0.0, "none of these is a fallback"
    assert g["failovers"] == {"model/b": 1}
    assert g["endings"] == {"completed": 1, "continued": 3, "incomplete": 1} and g["untyped_endings"] == 1
    assert g["continued_by"] == {"finish_extractive": 1, "finish_on_model": 2}
    assert g["recall_at_5_continued"] == pytest.approx(2 / 3)
    assert (g["whole_answers"], g["whole_checked"]) == (4, 5)
    table = DemoReport(options={}, baseline_recall_at_5=0.9, questions=1, passages=1, timings_s={},
                       runs=runs, summaries=summaries, greedy=[]).table()
    text = " ".join(text_of(table).replace("│", " ").split())
    assert "answered by b (model failover) - 1" in text
    assert "model[a]: streams failed / all - 2 / 6" in text
    assert "model[b]: streams failed / all - 0 / 4" in text
    assert "answers ended completed - 1 answers ended continued - 3" in text
    assert "continued by finish_extractive - 1 continued by finish_on_model - 2" in text
    assert "answers ended incomplete - 1 answers without a typed ending - 1" in text
    assert "whole answers (no word repeated/missing) 1 / 1 4 / 5" in text
    assert "recall@5 of continued answers - 66.7 % recall@5 healthy baseline 90.0 % 90.0 %" in text
    assert "served by fallback" not in text


def test_recall_is_set_beside_the_healthy_recall_of_the_same_questions() -> None:
    """A run's questions are a sample: its recall@5 is compared with what the healthy service
    scored on the very questions it answered (and continued), beside the baseline over all."""
    healthy = {0: True, 1: False, 2: True, 3: True}
    records = [
        RequestRecord(1.0, "acme", 1, 0.2, "ok", hit=False),  # missed healthy too
        RequestRecord(2.0, "acme", 2, 0.2, "ok", hit=True, ending="continued", continued_by="finish"),
        RequestRecord(3.0, "acme", 1, 0.2, "ok", hit=False, ending="continued", continued_by="finish"),
        RequestRecord(4.0, "acme", 3, 0.2, "quota"),  # not answered: not counted
        RequestRecord(5.0, "acme", 9, 0.2, "ok", hit=True),  # no baseline for it: not counted
    ]
    run = RunResult("guarded", 10.0, records, [("a", 0.0, 10.0)])
    s = summarize(run, greedy=[], slo_s=1.0, healthy=healthy)
    assert s["recall_at_5_answered"] == pytest.approx(2 / 4)
    assert s["recall_at_5_answered_healthy"] == pytest.approx(1 / 3)  # questions 1, 2, 1
    assert s["recall_at_5_continued_healthy"] == pytest.approx(1 / 2)  # questions 2, 1
    assert summarize(run, greedy=[], slo_s=1.0)["recall_at_5_answered_healthy"] is None
    rep = DemoReport(options={}, baseline_recall_at_5=0.75, questions=4, passages=1, timings_s={},
                     runs={"guarded": run}, summaries={"guarded": s}, greedy=[], baseline_hits=healthy)
    text = " ".join(text_of(rep.table()).replace("│", " ").split())
    assert "recall@5 healthy baseline 75.0 %" in text
    assert "recall@5 healthy, same questions answered 33.3 %" in text
    assert "recall@5 healthy, same questions continued 50.0 %" in text
    assert rep.to_dict(with_requests=False)["baseline_hits"] == {"0": True, "1": False, "2": True, "3": True}
