"""The bench's capacity-change run: what it measures (goodput while halved, the well-behaved tenants,
the time goodput took to come back, the limit's means), its targets, the lines and the table it
prints, and its options (``--changes-only --seeds``)."""

from __future__ import annotations

from typing import Any

import pytest
from bench_helpers import WELL_BEHAVED, changes_run, records
from typer.testing import CliRunner

from ragguard import ConfigError
from ragguard_tools.bench import BenchOptions
from ragguard_tools.bench._changes import change_targets, recovery_s, summarize_run, trace_line, window
from ragguard_tools.bench._report import BenchReport
from ragguard_tools.cli import app

HALVED = "after capacity halves, adaptive goodput from 2 s on >= 90% of the new capacity"
WELL = "after capacity halves, well-behaved tenants >= 99% success"
BACK = "after capacity is back, the limit grows back and goodput is >= 90% of it within 5 s"


def _targets(h: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["target"]: t for t in change_targets(h)}


def _after(goodput_rps: float, well_behaved: float, requests: int = 200) -> dict[str, Any]:
    """The adaptive contender's window while halved (53.3 rps sent)."""
    return {"after": {"goodput_rps": goodput_rps, "offered_rps": 53.3, "well_behaved_success": well_behaved,
                      "well_behaved_requests": requests}}


def test_goodput_counts_the_answers_that_came_back_in_the_window() -> None:
    """An answer sent while halved that came back after the capacity was restored is not halved
    work; the load is what was sent in the window, the well-behaved success that of their requests."""
    recs = records(10.0, 10.0, lambda at, tenant: "ok" if tenant == "acme" or at < 5 else "unavailable",
                   latency_s=0.55)
    w = window(recs, 2.0, 6.0, WELL_BEHAVED)
    # sent in [2, 6): 40, of which acme's 20 and hoarder's 15 sent before 5 s answered; came back
    # in [2, 6): those sent in [1.45, 5.45): acme's 20 and hoarder's sent before 5 s, 17
    assert w["offered_rps"] == 10.0 and w["goodput_rps"] == 9.25
    assert w["well_behaved_success"] == 1.0 and w["well_behaved_requests"] == 20
    assert w["outcomes"] == {"ok": 35, "unavailable": 5} and w["well_behaved_outcomes"] == {"ok": 20}


def test_goodput_is_back_when_it_holds_from_then_to_the_end() -> None:
    """Back: from the first moment (0.5 s steps) after which goodput is at 90% of the capacity (or
    of the load sent, if less) in its first second and over the rest of the run."""
    def back_at(t0: float) -> list[Any]:
        return records(24.0, 40.0, lambda at, _: "ok" if at >= t0 or at < 8.0 else "unavailable", 0.01)

    assert recovery_s(back_at(17.3), 16.0, 24.0, 55.0) == 1.5  # the load (40/s) is below capacity
    assert recovery_s(back_at(16.0), 16.0, 24.0, 55.0) == 0.0
    assert recovery_s(back_at(30.0), 16.0, 24.0, 55.0) is None
    assert recovery_s(back_at(16.0), 16.0, 24.0, 20.0) == 0.0  # capacity below the load: 90% of it
    # a relapse: goodput back at 17 s, lost again from 22 s: back only once it holds to the end
    relapse = records(24.0, 40.0, lambda at, _: "ok" if 17.0 <= at < 22.0 or at < 8.0 else "x", 0.01)
    assert recovery_s(relapse, 16.0, 24.0, 55.0) is None


def test_a_limit_that_does_not_move_while_goodput_collapses_is_a_gap() -> None:
    """Issue 32: the limit sat at its ceiling, goodput fell to 7 rps of about 33: the old target
    ("the limit settled") was MET. Now goodput is measured, and the line says the limit did not move."""
    stuck = changes_run(24.0, limits=(32, 32, 32), adaptive=_after(7.2, 0.11, 120))
    got = _targets(stuck)
    assert not got[HALVED]["met"] and not got[WELL]["met"]
    assert got[HALVED]["detail"] == (
        "7.2 rps: 24% of 30.0 measured (22% of 33.3 nominal); limit 32.0 -> 32.0: the limit did not "
        "move while goodput collapsed"
    )
    assert not got[BACK]["met"] and "(not 1.5x)" in got[BACK]["detail"]  # 32 -> 32: no growth

    good = _targets(changes_run(24.0, adaptive=_after(27.1, 0.99)))
    assert good[HALVED]["met"] and good[WELL]["met"] and good[BACK]["met"]
    assert good[HALVED]["detail"] == "27.1 rps: 90% of 30.0 measured (81% of 33.3 nominal); limit 16.0 -> 8.0"
    assert good[BACK]["detail"] == (
        "goodput back in 0.5 s (52.0 rps of 53.3 sent, capacity 55.0 measured); limit 8.0 -> 20.0"
    )
    short = _targets(changes_run(24.0, adaptive=_after(26.9, 0.989)))
    assert not short[HALVED]["met"] and not short[WELL]["met"]
    assert "did not move" not in short[HALVED]["detail"]  # it moved: short of the capacity all the same
    late = _targets(changes_run(24.0, adaptive={"recovery_s": 5.5}))
    assert not late[BACK]["met"] and late[BACK]["detail"].startswith("goodput back in 5.5 s")


def test_a_run_is_summarized_from_its_requests() -> None:
    def outcome(at: float, tenant: str) -> str:
        return "unavailable" if 8 <= at < 16 and tenant == "hoarder" else "ok"

    recs = records(24.0, 40.0, outcome, latency_s=0.01)
    run = summarize_run(recs, duration_s=24.0, well_behaved=WELL_BEHAVED, capacity_rps=(55.0, 30.0))
    assert run["before"]["goodput_rps"] == pytest.approx(40.0, abs=0.2)
    assert run["after"]["goodput_rps"] == pytest.approx(20.0, abs=0.2)  # from 10 s (2 s after) to 16 s
    assert run["after"]["well_behaved_success"] == 1.0
    assert run["recovery_s"] == 0.0 and len(run["buckets"]) == 48


def test_the_limits_trace_is_printed_a_second_at_a_time() -> None:
    h = changes_run(6.0, limits=(10, 4, 12))  # halved at 2 s, back at 4 s; probing for 0.3 s
    trace = [(t, lim, m, p) for (t, lim, p), (_, m) in zip(h["limit_trace"], h["min_rtt_trace"], strict=True)]
    assert trace_line(trace, 6.0) == "10 10 | 4 4 | 12 12"
    probing = [(t, lim, m, True if t < 1 else p) for t, lim, m, p in trace]
    assert trace_line(probing, 6.0) == "p 10 | 4 4 | 12 12"
    lines = BenchReport(options={}, capacity_rps=0.0, offered_rps=[], steps={}, rounds={},
                        changes=[changes_run(24.0)]).changes_lines()
    assert lines[0] == ("capacity changes (seed 7) at 44 rps offered (16 by the well-behaved tenants): "
                        "halved at 8 s, back at 16 s; capacity 55.0 -> 30.0 -> 55.0 rps measured "
                        "(66.7 -> 33.3 nominal)")
    assert lines[1].endswith(": 16 16 16 16 16 16 16 16 | 8 8 8 8 8 8 8 8 | 20 20 20 20 20 20 20 20")
    assert lines[2] == "its baseline (min_rtt): 68-68 ms"


def test_several_seeds_get_a_row_each_and_targets_named_by_seed(tmp_path: Any) -> None:
    from rich.console import Console

    runs = [changes_run(24.0), {**changes_run(24.0, limits=(32, 32, 32)), "seed": 31}]
    runs[1]["runs"]["ragguard-adaptive"].update(_after(7.2, 0.11, 120))
    report = BenchReport(options={}, capacity_rps=66.7, offered_rps=[], steps={}, rounds={}, changes=runs)
    names = [t["target"] for t in report.targets()]
    assert names == [f"seed 7: {HALVED}", f"seed 7: {WELL}", f"seed 7: {BACK}",
                     f"seed 31: {HALVED}", f"seed 31: {WELL}", f"seed 31: {BACK}"]  # fmt: skip
    console = Console(width=80, record=True)
    console.print(report.changes_table())
    console.print(report.targets_table())
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    rows = [line.split() for line in text.splitlines() if line.strip().startswith(("7 ", "31 "))]
    assert rows == [["7", "28.3", "94%/85%", "100%", "0.5", "16/8/20", "3", "of", "3"],
                    ["31", "7.2", "24%/22%", "11.0%", "0.5", "32/32/32", "0", "of", "3"]]  # fmt: skip
    again = BenchReport.read_json(report.write_json(tmp_path / "bench.json"))
    assert again.targets() == report.targets() and again.changes == report.changes


def test_changes_only_options() -> None:
    assert BenchOptions(changes_only=True).names == ("ragguard-adaptive",)
    assert BenchOptions().names == ("unguarded", "hand-composed", "ragguard-static", "ragguard-adaptive")
    assert BenchOptions(changes_only=True, seeds=(7, 11)).seed_list == (7, 11)
    assert BenchOptions(seed=3).seed_list == (3,)
    assert BenchOptions(quick=True).plan()[4] == 3.6 and BenchOptions().plan()[4] == 24.0
    for bad, field in (({"seeds": (1, 2)}, "seeds"), ({"changes_only": True, "seeds": (1, 1)}, "seeds"),
                       ({"changes_only": True, "seeds": ()}, "seeds"),
                       ({"changes_only": True, "halving": False}, "changes_only")):  # fmt: skip
        with pytest.raises(ConfigError) as info:
            BenchOptions(**bad)
        assert info.value.field == field


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--seeds", "7,11"), "ragguard bench: --seeds needs --changes-only"),
        (("--changes-only", "--seeds", "7,x"), "ragguard bench: --seeds must be integers joined by commas"),
        (("--changes-only", "--no-halving"), "ragguard bench: --changes-only runs the capacity changes: not"),
        (("--changes-only", "--contenders", "nobody"), "ragguard bench: --contenders must be among"),
    ],
)  # fmt: skip
def test_bad_changes_only_flags_are_refused_by_name(args: tuple[str, ...], said: str) -> None:
    result = CliRunner().invoke(app, ["bench", *args], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.split())
