"""The bench's arithmetic: the dual-threshold knee, the reference steps, the targets, the options."""

from __future__ import annotations

import math
from typing import Any

import pytest

from ragguard import ConfigError
from ragguard.bench import BenchOptions
from ragguard.bench._contenders import tenant_plans
from ragguard.bench._report import BenchReport, StepSummary, find_knee
from ragguard.bench._runner import _convergence, loads_at


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


def _report(steps: dict[str, list[StepSummary]], **halving: Any) -> BenchReport:
    offered = [s.offered_rps for s in next(iter(steps.values()))]
    return BenchReport(
        options={"deadline_s": 1.0},
        capacity_rps=50,
        offered_rps=offered,
        steps=steps,
        rounds={},
        halving=halving,
    )


def test_targets_from_the_unguarded_knee_and_twice_it() -> None:
    loads = [10, 20, 40, 80]
    u = [_step(10, 100, 0), _step(20, 300, 0.5, good=9), _step(40, 900, 1, good=0), _step(80, 900, 1, good=0)]
    h = [_step(10, 100, 0), _step(20, 100, 0), _step(40, 300, 0.4, good=7), _step(80, 900, 1, good=2)]
    a = [_step(10, 100, 0), _step(20, 110, 0.2, good=10), _step(40, 120, 0.5, good=9.5, wb=0.995),
         _step(80, 125, 0.7, good=9.2)]
    steps = {"unguarded": u, "hand-composed": h, "ragguard-adaptive": a}
    assert [s.offered_rps for s in steps["unguarded"]] == loads
    report = _report(steps, convergence_s=1.2)
    assert report.knees() == {"unguarded": 1, "hand-composed": 2, "ragguard-adaptive": None}
    assert report.reference() == (1, 2, True)  # knee 20 rps, twice it 40 rps
    met = {t["target"]: t["met"] for t in report.targets()}
    assert met["adaptive knee >= 1.5x hand-composed's"] is True  # no knee up to 80 >= 1.5 x 40
    assert met["at 2x the knee, well-behaved tenants >= 99% success, P99 within deadline"] is True
    assert met["at 2x the knee, adaptive goodput >= 90% of goodput at the knee"] is True  # 9.5 vs 10
    assert met["unguarded collapses at 2x the knee (goodput < 50% of the knee's)"] is True
    assert met["after capacity halves, the adaptive limit settles within 5 s"] is True

    steps["ragguard-adaptive"][2] = _step(40, 120, 0.5, good=8.9, wb=0.98)
    met = {t["target"]: t["met"] for t in _report(steps).targets()}
    assert met["at 2x the knee, adaptive goodput >= 90% of goodput at the knee"] is False
    assert met["at 2x the knee, well-behaved tenants >= 99% success, P99 within deadline"] is False


def test_the_limit_settles_on_its_one_second_average_and_probes_are_left_out() -> None:
    trace = [
        (t / 10, 10 if t < 50 else (2 if 60 <= t < 65 else (5 + t % 2)), None, 60 <= t < 65)
        for t in range(0, 150)
    ]
    got = _convergence(trace, 5.0)
    assert got["limit_before"] == 10 and got["limit_after"] == pytest.approx(5.5, abs=0.1)
    assert 0.5 <= got["convergence_s"] <= 1.5
    assert got["probing_samples_after_change"] == 5


def test_the_load_keeps_the_well_behaved_share_and_splits_the_rest() -> None:
    plans = tenant_plans(50.0)
    loads = {t.name: t.rate_per_s for t in loads_at(100.0, 50.0, plans)}
    assert math.isclose(sum(loads.values()), 100.0)
    assert loads["acme"] == pytest.approx(3.75) and loads["hoarder"] == pytest.approx(51.0)
    assert loads["nightly"] == pytest.approx(34.0)
    light = loads_at(10.0, 50.0, plans)  # below the well-behaved share: only they send
    assert {t.name for t in light} == {"acme", "globex", "initech", "umbrella"}
    assert math.isclose(sum(t.rate_per_s for t in light), 10.0)


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


def _halving(duration_s: float) -> dict[str, Any]:
    runs = {n: {"before": {"goodput_rps": 53.3}, "after": {"goodput_rps": after}}
            for n, after in (("unguarded", 43.3), ("ragguard-adaptive", 28.3))}  # fmt: skip
    return {"offered_rps": 53.3, "duration_s": duration_s, "change_at_s": duration_s / 2, "runs": runs,
            "limit_before": 13, "limit_after": 6.6, "convergence_s": 1.1}  # fmt: skip


def test_quick_halving_windows_are_said_to_be_too_short_to_rank() -> None:
    # quick: 1.2 s after the halving, the unguarded service had no time to queue up (it "beat"
    # the adaptive one); the line says so instead of letting a reader rank on it
    line = _report({"unguarded": [_step(10, 100, 0)]}, **_halving(2.4)).halving_line()
    assert "unguarded 53.3/43.3, ragguard-adaptive 53.3/28.3" in line
    assert "caveat: 1.2 s after the halving is too short for a queue to build" in line
    assert "do not rank the contenders" in line and "without --quick" in line
    full = _report({"unguarded": [_step(10, 100, 0)]}, **_halving(16.0)).halving_line()
    assert "caveat" not in full and full.endswith("ragguard-adaptive 53.3/28.3")


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
