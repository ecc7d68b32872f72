"""The bench's arithmetic: the dual-threshold knee, the reference steps, the targets, the options."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from bench_helpers import changes_run

from ragguard import ConfigError
from ragguard_tools.bench import BenchOptions
from ragguard_tools.bench._contenders import tenant_plans
from ragguard_tools.bench._report import BenchReport, StepSummary, find_collapse, find_knee
from ragguard_tools.bench._runner import change_loads, loads_at

COLLAPSE = "adaptive holds goodput to >= 1.5x the load where hand-composed's collapses"
SHED_BELOW = "below the knee, the adaptive service sheds < 2% of requests"


def _step(
    load: float, p95: float, err: float, good: float = 10.0, wb: float = 1.0, wb_p99: float = 100.0
) -> StepSummary:
    return StepSummary(load, 100, good, err, p95 / 2, p95, p95 * 1.1, wb, wb_p99, {}, {}, {})


def test_the_knee_needs_both_thresholds() -> None:
    base = _step(10, 100, 0.02)
    assert find_knee([base, _step(20, 140, 0.02), _step(30, 120, 0.5)]) is None  # one at a time is noise
    assert find_knee([base, _step(20, 129, 0.9), _step(30, 131, 0.031)]) == 2  # both just past
    assert find_knee([_step(10, 100, 0.0), _step(20, 200, 0.009)]) is None  # under the 1-point error floor
    assert find_knee([_step(10, 100, 0.0), _step(20, 200, 0.011)]) == 1


def _report(steps: dict[str, list[StepSummary]], *changes: dict[str, Any]) -> BenchReport:
    offered = [s.offered_rps for s in next(iter(steps.values()))]
    return BenchReport(
        options={"deadline_s": 1.0},
        capacity_rps=50,
        offered_rps=offered,
        steps=steps,
        rounds={},
        changes=list(changes),
    )


def test_targets_from_the_unguarded_knee_and_twice_it() -> None:
    loads = [10, 20, 40, 80]
    u = [_step(10, 100, 0), _step(20, 300, 0.5, good=9), _step(40, 900, 1, good=0), _step(80, 900, 1, good=0)]
    h = [_step(10, 100, 0), _step(20, 100, 0), _step(40, 300, 0.4, good=7), _step(80, 900, 1, good=2)]
    a = [_step(10, 100, 0), _step(20, 110, 0.2, good=10), _step(40, 120, 0.5, good=9.5, wb=0.995),
         _step(80, 125, 0.7, good=9.2)]
    steps = {"unguarded": u, "hand-composed": h, "ragguard-adaptive": a}
    assert [s.offered_rps for s in steps["unguarded"]] == loads
    report = _report(steps)
    assert report.knees() == {"unguarded": 1, "hand-composed": 2, "ragguard-adaptive": None}
    assert report.reference() == (1, 2, True)  # knee 20 rps, twice it 40 rps
    met = {t["target"]: t["met"] for t in report.targets()}
    # hand-composed's goodput collapses at 40 rps (7 < 90% of 10), the adaptive one's holds to 80
    assert report.collapses() == {"unguarded": 2, "hand-composed": 2, "ragguard-adaptive": None}
    assert met[COLLAPSE] is True  # no collapse up to 80 >= 1.5 x 40
    assert met[SHED_BELOW] is False  # nothing shed below the knee, but 100 requests cannot bound it under 2%
    assert met["at 2x the knee, well-behaved tenants >= 99% success, P99 within deadline"] is True
    assert met["at 2x the knee, adaptive goodput >= 90% of goodput at the knee"] is True  # 9.5 vs 10
    assert met["unguarded collapses at 2x the knee (goodput < 50% of the knee's)"] is True

    steps["ragguard-adaptive"][2] = _step(40, 120, 0.5, good=8.9, wb=0.98)
    met = {t["target"]: t["met"] for t in _report(steps).targets()}
    assert met["at 2x the knee, adaptive goodput >= 90% of goodput at the knee"] is False
    assert met["at 2x the knee, well-behaved tenants >= 99% success, P99 within deadline"] is False


def test_the_load_keeps_the_well_behaved_share_and_splits_the_rest() -> None:
    plans = tenant_plans(50.0)
    loads = {t.name: t.rate_per_s for t in loads_at(100.0, 50.0, plans)}
    assert math.isclose(sum(loads.values()), 100.0)
    assert loads["acme"] == pytest.approx(3.75) and loads["hoarder"] == pytest.approx(51.0)
    assert loads["nightly"] == pytest.approx(34.0)
    light = loads_at(10.0, 50.0, plans)  # below the well-behaved share: only they send
    assert {t.name for t in light} == {"acme", "globex", "initech", "umbrella"}
    assert math.isclose(sum(t.rate_per_s for t in light), 10.0)


def test_the_capacity_changes_run_at_80_percent_of_the_capacity_measured() -> None:
    """docs/bench.md: the load is 80% of the capacity measured before the run, the well-behaved
    tenants 30% of that capacity (60% of the halved one), the rest 60/40 to hoarder and nightly;
    the nominal capacity, which the quotas are sized to, plays no part."""
    plans = tenant_plans(66.7)
    loads = {t.name: t.rate_per_s for t in change_loads(55.0, plans)}
    assert math.isclose(sum(loads.values()), 44.0)
    well_behaved = sum(loads[p.name] for p in plans if p.well_behaved)
    assert well_behaved == pytest.approx(16.5) and well_behaved / (55.0 / 2) == pytest.approx(0.6)
    assert loads["hoarder"] == pytest.approx(0.6 * 27.5) and loads["nightly"] == pytest.approx(0.4 * 27.5)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("steps", (2.0, 1.0)),
        ("steps", (1.0,)),
        ("block_ms", 0.5),
        ("rtt_ms", 5.0),
        ("steady_s", 0.0),
        ("rounds", 0),
        ("contenders", ("nobody",)),
    ],
)
def test_bad_options_name_their_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        BenchOptions(**{field: value})
    assert info.value.field == field


def test_quick_halving_windows_are_said_to_be_too_short_to_rank() -> None:
    # quick: 1.2 s after the halving, the unguarded service had no time to queue up (it "beat"
    # the adaptive one); the line says so instead of letting a reader rank on it
    lines = _report({"unguarded": [_step(10, 100, 0)]}, changes_run(3.6)).changes_lines()
    assert "unguarded 53.3/43.3/50.0, ragguard-adaptive 53.3/28.3/52.0" in lines[-1]
    assert "caveat: 1.2 s after the halving is too short for a queue to build" in lines[-1]
    assert "do not rank the contenders" in lines[-1] and "without --quick" in lines[-1]
    full = _report({"unguarded": [_step(10, 100, 0)]}, changes_run(24.0)).changes_lines()
    assert "caveat" not in full[-1] and full[-1].endswith("ragguard-adaptive 53.3/28.3/52.0")


def test_a_knee_above_capacity_says_why() -> None:
    u = [_step(25, 100, 0), _step(50, 110, 0), _step(75, 900, 0.5, good=9), _step(150, 900, 1, good=0)]
    report = _report({"unguarded": u})  # capacity 50 rps; the unguarded service broke at 75
    report.options["steady_s"] = 1.2
    title = str(report.table().title)
    assert "knee = 75 rps (the first step where the unguarded service broke; above capacity, as a queue " \
           "fed at capacity grows too slowly to break it in a 1.2 s window)" in title, title
    assert "dependency capacity ~50 rps" in title
    u[1] = _step(50, 900, 0.5, good=9)  # broke at capacity: nothing to explain
    title = str(_report({"unguarded": u}).table().title)
    assert "knee = 50 rps (the first step where the unguarded service broke)," in title, title


def _sampled(load: float, ok_ms: list[float], failed_ms: list[float], window_s: float = 10.0) -> StepSummary:
    """A step that kept its requests' latencies (as a real run's do)."""
    n = len(ok_ms) + len(failed_ms)
    pooled = sorted(ok_ms + failed_ms)
    p95 = pooled[min(n - 1, math.ceil(0.95 * n) - 1)]
    return StepSummary(load, n, len(ok_ms) / window_s, len(failed_ms) / n, pooled[n // 2], p95, pooled[-1],
                       1.0, 100.0, {}, {"ok": len(ok_ms), "overloaded": len(failed_ms)}, {},
                       window_s=window_s, ok_ms=tuple(ok_ms), failed_ms=tuple(failed_ms))


def test_the_headline_holds_with_a_stated_bootstrap_confidence() -> None:
    """Clear-cut steps: the collapse ratio holds in every resample; a borderline one (the
    adaptive contender's goodput at 90% of its best, give or take a request) does not, and the
    target says in how many it held. The resamples are seeded: the same report, the same share."""
    import random

    rng = random.Random(5)

    def lat(n: int, ms: float) -> list[float]:
        return [ms * rng.uniform(0.8, 1.2) for _ in range(n)]

    loads = [20.0, 40.0, 60.0, 80.0]
    hand = [_sampled(20, lat(200, 100), []), _sampled(40, lat(100, 900), lat(300, 1000)),
            _sampled(60, lat(100, 950), lat(500, 1000)), _sampled(80, lat(100, 950), lat(700, 1000))]
    good = [_sampled(20, lat(200, 100), []), _sampled(40, lat(400, 110), []),
            _sampled(60, lat(450, 150), lat(150, 5)), _sampled(80, lat(440, 160), lat(360, 5))]
    report = _report({"hand-composed": hand, "ragguard-adaptive": good})
    assert report.collapses() == {"hand-composed": 1, "ragguard-adaptive": None}
    row = next(t for t in report.targets() if t["target"] == COLLAPSE)
    assert row["met"] and row["confidence"] == 1.0  # no collapse up to 80 rps: >= 2x
    assert "holds in 100% of 400 resamples" in row["detail"]

    # from 40 rps on, 18 answers/s: 90% of the lightest step's 20, give or take a request: the
    # adaptive contender's goodput collapses at 40 rps (1.0x) in some resamples, not in others
    borderline = [good[0], *(_sampled(load, lat(180, 110), lat(220, 5)) for load in loads[1:])]
    report = _report({"hand-composed": hand, "ragguard-adaptive": borderline})
    row = next(t for t in report.targets() if t["target"] == COLLAPSE)
    assert 0.05 < row["confidence"] < 0.95 and not row["met"]
    again = _report({"hand-composed": hand, "ragguard-adaptive": borderline})
    assert next(t for t in again.targets() if t["target"] == COLLAPSE)["confidence"] == row["confidence"]
    assert find_collapse(hand) == 1 and loads == [s.offered_rps for s in hand]


def test_shedding_below_the_knee_is_bounded_with_wilson_confidence() -> None:
    u = [_step(10, 100, 0), _step(20, 100, 0), _step(40, 900, 0.8, good=1)]  # the knee: 40 rps
    shed = [_sampled(10, [100.0] * 995, [5.0] * 5), _sampled(20, [100.0] * 990, [5.0] * 10),
            _step(40, 100, 0.5)]
    met = {t["target"]: t for t in _report({"unguarded": u, "ragguard-adaptive": shed}).targets()}
    row = met[SHED_BELOW]
    assert row["met"] and "15 of 2000 requests up to 20 rps (0.8%" in row["detail"]  # bound: 1.2%
    shed[1] = _sampled(20, [100.0] * 970, [5.0] * 30)
    row = {t["target"]: t for t in _report({"unguarded": u, "ragguard-adaptive": shed}).targets()}[SHED_BELOW]
    assert not row["met"] and row["confidence"] > 0.02  # 1.75%, but its upper bound passes 2%
    assert "too few" not in row["detail"]  # enough requests: the GAP is the shedding's


def test_a_shed_target_on_too_few_requests_says_why_it_is_a_gap() -> None:
    """A quick run's few dozen requests cannot show < 2% even with none shed: the line says so
    (it read a GAP for 0 shed with no reason)."""
    u = [_step(10, 100, 0), _step(20, 100, 0), _step(40, 900, 0.8, good=1)]
    few = [_sampled(10, [100.0] * 50, []), _sampled(20, [100.0] * 62, []), _step(40, 100, 0.5)]
    row = {t["target"]: t for t in _report({"unguarded": u, "ragguard-adaptive": few}).targets()}[SHED_BELOW]
    assert not row["met"] and row["detail"].startswith("0 of 112 requests")
    assert row["detail"].endswith("too few requests to show it: 189 at least")


def test_the_tables_read_whole_in_an_80_column_terminal() -> None:
    """Every cell whole (no ellipsis), no line past 80 columns, at the widest values a run prints."""
    from rich.console import Console

    names = ["unguarded", "hand-composed", "ragguard-static", "ragguard-adaptive"]

    def wide(load: float, good: float = 100.0) -> StepSummary:
        return StepSummary(load, 9999, good, 0.5, 999.0, 1053.0, 1094.0, 0.996, 1007.0,
                           {"batch": 2345, "interactive": 12345}, {}, {})

    steps = {n: [wide(26.67), wide(66.67), wide(200.0)] for n in names}
    steps["unguarded"][1] = _step(66.67, 1005, 1.0, good=17.4, wb=0.0, wb_p99=1007)
    report = _report(steps, changes_run(24.0))
    report.options["steady_s"] = 1.2
    console = Console(width=80, record=True)
    for table in (report.table(), report.tenants_table(), report.targets_table(), report.changes_table()):
        console.print(table)
    for line in report.changes_lines():
        console.print(line)
    text = console.export_text()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for name in names:
        assert f"{name} " in text
    for value in ("1053", "1094", "99.6%", "1007", "2345", "12345", "100.0", ">200", "17.4"):
        assert value in text, value


def test_a_report_read_back_from_its_json_gives_the_same_targets(tmp_path: Path) -> None:
    hand = [_sampled(20, [100.0] * 200, []), _sampled(40, [900.0] * 100, [1000.0] * 300)]
    good = [_sampled(20, [100.0] * 200, []), _sampled(40, [150.0] * 380, [5.0] * 20)]
    report = BenchReport(options={"deadline_s": 1.0}, capacity_rps=30, offered_rps=[20.0, 40.0],
                         steps={"hand-composed": hand, "ragguard-adaptive": good},
                         rounds={"hand-composed": [hand], "ragguard-adaptive": [good]})
    path = report.write_json(tmp_path / "bench.json")
    again = BenchReport.read_json(path)
    assert again.targets() == report.targets()
    assert again.steps["ragguard-adaptive"][1].ok_ms == good[1].ok_ms
