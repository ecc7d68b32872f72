"""The demo's table printed in a pipe or a log: whole rows, as the README shows it."""

from __future__ import annotations

import io

from rich.console import Console

from ragguard_tools.demo.loadgen import RequestRecord
from ragguard_tools.demo.report import (
    OPENED_ROW,
    DemoReport,
    GenerationTally,
    RunResult,
    TenantStreams,
    Transition,
    print_table,
    summarize,
)


def _table() -> object:
    """The table of a run with every row the real demo prints, its stall figures as wide."""
    def answered(tenant: str, at_s: float, tokens: int, **kw: object) -> RequestRecord:
        return RequestRecord(at_s, tenant, 0, 0.5, "ok", hit=True, ttft_s=0.1, words=tokens // 2,
                             tokens=tokens, **kw)  # type: ignore[arg-type]

    plain = [answered("acme", 1.0, 60, max_gap_s=2.5), answered("hoarder", 1.0, 500)]
    guarded = [answered("acme", 2.0, 40, fallbacks=("extractive_answer",)), answered("hoarder", 1.0, 200)]
    tally = GenerationTally(paced_to={"hoarder": 600.0}, cuts={"first_item": 2}, fallbacks=159,
                            streams={"hoarder": TenantStreams(1, 200, 1.5, 1)})
    opened = [Transition(1.0, "vector_store", "closed", "open")]
    runs = {"unguarded": RunResult("unguarded", 40.0, plain, [("a", 0.0, 40.0)],
                                   stalls=[{"duration_s": 0.294}] * 24),
            "guarded": RunResult("guarded", 40.0, guarded, [("a", 0.0, 40.0)], generation=tally,
                                 transitions=opened, breakers=["embedding", "vector_store", "rerank"],
                                 rerank_floor=4, stalls=[{"duration_s": 0.3}] * 12)}  # fmt: skip
    summaries = {m: summarize(r, greedy=["hoarder"], slo_s=1.0) for m, r in runs.items()}
    return DemoReport(options={}, baseline_recall_at_5=0.9, questions=1, passages=1, timings_s={},
                      runs=runs, summaries=summaries, greedy=["hoarder"]).table()


def _rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("│")]


def test_in_a_pipe_every_row_of_the_table_is_one_line() -> None:
    table = _table()
    out = io.StringIO()
    print_table(Console(file=out, width=80), table)  # not a terminal: rich assumes 80 columns
    rows = _rows(out.getvalue())
    assert len(rows) == table.row_count  # type: ignore[attr-defined]  # no row wrapped onto two lines
    assert any(OPENED_ROW in row for row in rows)
    assert len({len(row) for row in rows}) == 1 and len(rows[0]) > 80  # whole, not cropped


def test_in_a_terminal_the_table_keeps_to_its_width() -> None:
    out = io.StringIO()
    print_table(Console(file=out, width=80, force_terminal=True, color_system=None), _table())
    assert max(len(line) for line in out.getvalue().splitlines()) <= 80
