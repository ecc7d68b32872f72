"""The demo's table and chart, from hand-made records: what a reader is told."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from ragguard.demo.loadgen import RequestRecord
from ragguard.demo.report import DemoReport, RunResult, Transition, summarize

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
    assert "breaker opened: vector_store" in text and "breaker opened: rerank (OOM at floor only)" in text
    assert "rerank breaker closed" in text and "floor batch (4 candidates)" in text
    assert "answered by a fallback (any)" in text and "66.7 %" in text


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
        assert sizes == [1, 2, 0, 0]  # healthy, by a fallback, shed by quota, failed
        healthy, by_fallback = guarded.collections[0], guarded.collections[1]
        assert len(by_fallback.get_facecolor()) == 0, "fallback answers are hollow"
        assert (healthy.get_edgecolor()[0] != by_fallback.get_edgecolor()[0]).any(), "and of another colour"
        assert any("closed: an out-of-memory error" in t.get_text() for t in fig.axes[-1].texts)
    finally:
        plt.close(fig)
    assert report(CHUNKED, []).write_chart(tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("outcome", ["quota", "error"])
def test_failed_and_shed_requests_are_not_drawn_as_answers(outcome: str) -> None:
    import matplotlib.pyplot as plt

    fig = report([record(1.0, 0.01, outcome)], []).chart()
    try:
        sizes = [len(c.get_offsets()) for c in fig.axes[1].collections]
    finally:
        plt.close(fig)
    assert sizes[:2] == [0, 0] and sum(sizes) == 1
