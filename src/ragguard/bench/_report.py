"""What ``ragguard bench`` measured: per-step summaries, the knee, the targets, table, JSON, PNG.

The knee is the seed benchmark's dual-threshold rule: the first step whose P95 latency is above
1.3 x the contender's baseline (its first, lightest step) *and* whose error rate is above 1.5 x
its baseline error rate (at least 1 percentage point: 1.5 x 0 would make any single error a
knee), so one noisy metric cannot mark it. Latencies are those clients saw, refusals included;
goodput is answers per second within the deadline; well-behaved tenants are the four that stay
within their share.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..demo.loadgen import RequestRecord

__all__ = ["BenchReport", "StepSummary", "find_knee", "summarize_step"]

P95_FACTOR = 1.3
MIN_RANKING_WINDOW_S = 4.0
"""The shortest "after" window of the capacity-halving run that ranks the contenders: at 80% of
the old capacity the queue grows by 0.3 x capacity a second, so a 1 s deadline breaks an unguarded
service only a second or two after the halving. Quick mode's 1.2 s window ends before that."""
ERROR_FACTOR = 1.5
ERROR_FLOOR = 0.01
REJECTED = ("quota", "overloaded", "unavailable")


@dataclass(frozen=True, slots=True)
class StepSummary:
    """One contender at one offered load (the steady window only). Latencies in milliseconds."""

    offered_rps: float
    requests: int
    goodput_rps: float
    error_rate: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    well_behaved_success: float
    well_behaved_p99_ms: float
    shed_by_priority: dict[str, int]
    outcomes: dict[str, int]
    well_behaved_outcomes: dict[str, int]


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summarize_step(
    records: Sequence[RequestRecord],
    *,
    offered_rps: float,
    steady_s: float,
    well_behaved: set[str],
    priority_of: Mapping[str, str],
) -> StepSummary:
    n = len(records)
    ok = [r for r in records if r.outcome == "ok"]
    latencies = [r.latency_s * 1000 for r in records]
    wb = [r for r in records if r.tenant in well_behaved]
    shed: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    wb_outcomes: dict[str, int] = {}
    for r in records:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
        if r.tenant in well_behaved:
            wb_outcomes[r.outcome] = wb_outcomes.get(r.outcome, 0) + 1
        if r.outcome in REJECTED:
            p = priority_of.get(r.tenant, "interactive")
            shed[p] = shed.get(p, 0) + 1
    return StepSummary(
        offered_rps=round(offered_rps, 2),
        requests=n,
        goodput_rps=len(ok) / steady_s,
        error_rate=(n - len(ok)) / n if n else 0.0,
        p50_ms=_quantile(latencies, 0.5),
        p95_ms=_quantile(latencies, 0.95),
        p99_ms=_quantile(latencies, 0.99),
        well_behaved_success=(sum(1 for r in wb if r.outcome == "ok") / len(wb)) if wb else math.nan,
        well_behaved_p99_ms=_quantile([r.latency_s * 1000 for r in wb], 0.99),
        shed_by_priority=shed,
        outcomes=outcomes,
        well_behaved_outcomes=wb_outcomes,
    )


def merge_rounds(rounds: Sequence[StepSummary]) -> StepSummary:
    """The median of each number over the rounds of one step (counts summed)."""
    if len(rounds) == 1:
        return rounds[0]

    def med(name: str) -> float:
        return float(statistics.median(getattr(r, name) for r in rounds))

    def total(name: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in rounds:
            for k, v in getattr(r, name).items():
                out[k] = out.get(k, 0) + v
        return out

    return StepSummary(
        offered_rps=rounds[0].offered_rps,
        requests=sum(r.requests for r in rounds),
        goodput_rps=med("goodput_rps"),
        error_rate=med("error_rate"),
        p50_ms=med("p50_ms"),
        p95_ms=med("p95_ms"),
        p99_ms=med("p99_ms"),
        well_behaved_success=med("well_behaved_success"),
        well_behaved_p99_ms=med("well_behaved_p99_ms"),
        shed_by_priority=total("shed_by_priority"),
        outcomes=total("outcomes"),
        well_behaved_outcomes=total("well_behaved_outcomes"),
    )


def find_knee(steps: Sequence[StepSummary]) -> int | None:
    """The index of the knee step (see the module docstring), None when no step breaks both."""
    if not steps:
        return None
    base = steps[0]
    for i, s in enumerate(steps[1:], start=1):
        if s.p95_ms > P95_FACTOR * base.p95_ms and s.error_rate > max(
            ERROR_FACTOR * base.error_rate, ERROR_FLOOR
        ):
            return i
    return None


@dataclass
class BenchReport:
    """A bench run: options, the offered loads, per contender the merged summary of each step,
    every round's summaries, the knees, the capacity-halving run, the targets."""

    options: dict[str, Any]
    capacity_rps: float
    offered_rps: list[float]
    steps: dict[str, list[StepSummary]]
    rounds: dict[str, list[list[StepSummary]]]
    halving: dict[str, Any] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    json_path: Path | None = None
    chart_path: Path | None = None

    # -- derived ----------------------------------------------------------------------------------

    def knees(self) -> dict[str, int | None]:
        return {name: find_knee(steps) for name, steps in self.steps.items()}

    def reference(self) -> tuple[int, int, bool]:
        """(knee step, 2x-knee step, exact): the unguarded service's knee (else the hand-composed
        stack's, else the middle step) and the first step offering at least twice its load;
        ``exact`` is False when no step offers that much (the last step is used)."""
        knees = self.knees()
        k = knees.get("unguarded")
        if k is None:
            k = knees.get("hand-composed")
        if k is None:
            k = len(self.offered_rps) // 2
        want = 2 * self.offered_rps[k]
        for i, load in enumerate(self.offered_rps):
            if load >= want - 1e-6:
                return k, i, True
        return k, len(self.offered_rps) - 1, False

    def knee_rps(self, name: str) -> float | None:
        k = self.knees().get(name)
        return None if k is None else self.offered_rps[k]

    def targets(self) -> list[dict[str, Any]]:
        """The issue's targets, each MET or GAP with the numbers behind it."""
        out: list[dict[str, Any]] = []
        k, k2, exact = self.reference()
        deadline_ms = float(self.options["deadline_s"]) * 1000
        top = self.offered_rps[-1]
        hand, adapt = self.knee_rps("hand-composed"), self.knee_rps("ragguard-adaptive")
        if "hand-composed" in self.steps and "ragguard-adaptive" in self.steps:
            if hand is None:
                ok, text = False, f"hand-composed shows no knee up to {top:.0f} rps: no ratio to measure"
            elif adapt is None:
                ok = top >= 1.5 * hand
                text = (
                    f"adaptive: no knee up to {top:.0f} rps (> {top / hand:.2f}x hand-composed's {hand:.0f})"
                )
            else:
                ok = adapt >= 1.5 * hand
                text = f"adaptive knee {adapt:.0f} rps = {adapt / hand:.2f}x hand-composed's {hand:.0f} rps"
            out.append({"target": "adaptive knee >= 1.5x hand-composed's", "met": ok, "detail": text})
        a = self.steps.get("ragguard-adaptive")
        if a is not None:
            s2 = a[k2]
            ok = s2.well_behaved_success >= 0.99 and s2.well_behaved_p99_ms <= deadline_ms
            out.append(
                {
                    "target": "at 2x the knee, well-behaved tenants >= 99% success, P99 within deadline",
                    "met": ok,
                    "detail": f"{s2.well_behaved_success:.1%} success, P99 {s2.well_behaved_p99_ms:.0f} ms "
                    f"(deadline {deadline_ms:.0f} ms) at {s2.offered_rps:.0f} rps"
                    + ("" if exact else " (the last step: below 2x the knee)"),
                }
            )
            g1, g2 = a[k].goodput_rps, s2.goodput_rps
            out.append(
                {
                    "target": "at 2x the knee, adaptive goodput >= 90% of goodput at the knee",
                    "met": g2 >= 0.9 * g1,
                    "detail": f"{g2:.1f} vs {g1:.1f} rps ({g2 / g1:.0%})" if g1 else "no goodput at the knee",
                }
            )
        u = self.steps.get("unguarded")
        if u is not None:
            g1, g2 = u[k].goodput_rps, u[k2].goodput_rps
            out.append(
                {
                    "target": "unguarded collapses at 2x the knee (goodput < 50% of the knee's)",
                    "met": g2 < 0.5 * g1,
                    "detail": f"{g2:.1f} vs {g1:.1f} rps ({g2 / g1:.0%})" if g1 else "no goodput at the knee",
                }
            )
        conv = self.halving.get("convergence_s")
        if self.halving:
            out.append(
                {
                    "target": "after capacity halves, the adaptive limit settles within 5 s",
                    "met": conv is not None and conv <= 5.0,
                    "detail": "did not converge" if conv is None else f"{conv:.1f} s",
                }
            )
        return out

    # -- output -----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        k, k2, exact = self.reference()
        knees = self.knees()
        return {
            "options": self.options,
            "capacity_rps": self.capacity_rps,
            "offered_rps": self.offered_rps,
            "knee_rule": {"p95_factor": P95_FACTOR, "error_factor": ERROR_FACTOR, "error_floor": ERROR_FLOOR},
            "reference": {
                "knee_rps": self.offered_rps[k],
                "twice_knee_rps": self.offered_rps[k2],
                "twice_exact": exact,
            },
            "knees_rps": {n: (None if i is None else self.offered_rps[i]) for n, i in knees.items()},
            "steps": {n: [asdict(s) for s in steps] for n, steps in self.steps.items()},
            "rounds": {n: [[asdict(s) for s in r] for r in rounds] for n, rounds in self.rounds.items()},
            "halving": self.halving,
            "targets": self.targets(),
            "timings_s": self.timings_s,
        }

    def write_json(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_clean(self.to_dict()), indent=2, default=_json_default) + "\n")
        self.json_path = path
        return path

    def table(self) -> Any:
        """The rich table of the run."""
        from rich.table import Table

        k, k2, exact = self.reference()
        knees = self.knees()
        t = Table(
            title=(
                f"ragguard bench: knee = {self.offered_rps[k]:.0f} rps ({self._knee_note(k)}), "
                f"2x = {self.offered_rps[k2]:.0f} rps{'' if exact else ' (last step)'}; "
                f"dependency capacity ~{self.capacity_rps:.0f} rps"
            )
        )
        for col in (
            "contender",
            "knee rps",
            "goodput@knee",
            "goodput@2x",
            "P95@2x ms",
            "P99@2x ms",
            "well-behaved ok@2x",
            "w-b P99@2x ms",
            "shed@2x batch/inter.",
        ):
            t.add_column(col, justify="left" if col == "contender" else "right")
        for name, steps in self.steps.items():
            s1, s2 = steps[k], steps[k2]
            knee = knees[name]
            shed = s2.shed_by_priority
            t.add_row(
                name,
                f">{self.offered_rps[-1]:.0f}" if knee is None else f"{self.offered_rps[knee]:.0f}",
                f"{s1.goodput_rps:.1f}",
                f"{s2.goodput_rps:.1f}",
                f"{s2.p95_ms:.0f}",
                f"{s2.p99_ms:.0f}",
                f"{s2.well_behaved_success:.1%}",
                f"{s2.well_behaved_p99_ms:.0f}",
                f"{shed.get('batch', 0)}/{shed.get('interactive', 0)}",
            )
        return t

    def _knee_note(self, k: int) -> str:
        """Whose knee the reference is, and why it can lie above the dependency's capacity."""
        knees = self.knees()
        whose = "unguarded" if knees.get("unguarded") is not None else (
            "hand-composed" if knees.get("hand-composed") is not None else None
        )
        if whose is None:
            return "no contender broke: the middle step"
        note = f"the first step where the {whose} service broke"
        if self.offered_rps[k] > 1.01 * self.capacity_rps:
            steady = self.options.get("steady_s")
            window = f"a {steady:g} s window" if isinstance(steady, int | float) else "a step's window"
            note += f"; above capacity, as a queue fed at capacity grows too slowly to break it in {window}"
        return note

    def halving_line(self) -> str:
        """The capacity-halving run in one line: the adaptive limit, and each contender's goodput
        before and after; with a caveat when the windows are too short to rank the contenders."""
        h = self.halving
        line = (
            f"capacity halving at {h['offered_rps']:.0f} rps: adaptive retrieve limit "
            f"{h.get('limit_before')} -> {h.get('limit_after')}, settled in "
            f"{h.get('convergence_s')} s; goodput before/after: "
            + ", ".join(f"{n} {r['before']['goodput_rps']:.1f}/{r['after']['goodput_rps']:.1f}"
                        for n, r in h["runs"].items())
        )
        after = float(h.get("duration_s", 0.0)) - float(h.get("change_at_s", 0.0))
        if after < MIN_RANKING_WINDOW_S:
            line += (
                f" (caveat: {after:g} s after the halving is too short for a queue to build, so these "
                "numbers do not rank the contenders; the full run, without --quick, does)"
            )
        return line

    def targets_table(self) -> Any:
        from rich.table import Table

        t = Table(title="targets (ratios within this one run)")
        t.add_column("target")
        t.add_column("")
        t.add_column("measured")
        for row in self.targets():
            t.add_row(row["target"], "[green]MET[/green]" if row["met"] else "[red]GAP[/red]", row["detail"])
        return t

    def write_chart(self, path: Path) -> Path:
        """Goodput and P99 against offered load (knees marked), and the capacity-halving run."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        panels = 3 if self.halving else 2
        fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.6))
        knees = self.knees()
        x = self.offered_rps
        for name, steps in self.steps.items():
            (line,) = axes[0].plot(x, [s.goodput_rps for s in steps], marker="o", label=name)
            axes[1].plot(x, [s.p99_ms for s in steps], marker="o", label=name, color=line.get_color())
            k = knees[name]
            if k is not None:
                axes[0].plot(
                    [x[k]], [steps[k].goodput_rps], marker="X", markersize=14, color=line.get_color()
                )
                axes[1].plot([x[k]], [steps[k].p99_ms], marker="X", markersize=14, color=line.get_color())
        axes[0].plot(x, [min(v, self.capacity_rps) for v in x], ls=":", color="grey", label="capacity")
        axes[0].set(
            xlabel="offered load (requests/s)", ylabel="goodput (answers/s)", title="goodput (X: knee)"
        )
        axes[1].set(
            xlabel="offered load (requests/s)", ylabel="P99 latency (ms)", title="P99 (X: knee)", yscale="log"
        )
        axes[0].legend(fontsize=8)
        if self.halving:
            ax = axes[2]
            for name, run in self.halving.get("runs", {}).items():
                buckets = run["buckets"]
                ax.plot([b["t_s"] for b in buckets], [b["goodput_rps"] for b in buckets], label=name)
            ax.axvline(self.halving["change_at_s"], color="grey", ls="--")
            ax.set(xlabel="time (s)", ylabel="goodput (answers/s)", title="capacity halved (dashed)")
            limit = self.halving.get("limit_trace") or []
            if limit:
                twin = ax.twinx()
                twin.step(
                    [p[0] for p in limit],
                    [p[1] for p in limit],
                    where="post",
                    color="black",
                    lw=1,
                    label="adaptive limit (retrieve)",
                )
                twin.set_ylabel("adaptive limit (calls in flight)")
                twin.legend(loc="lower right", fontsize=8)
            ax.legend(loc="upper right", fontsize=8)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        self.chart_path = path
        return path


def _clean(value: Any) -> Any:
    """``value`` with NaN and the infinities as None (JSON has none of them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON: {type(value).__name__}")
