"""What ``ragguard bench`` measured: per-step summaries, the knees, the targets, table, JSON, PNG.

Two knees per contender, each found on every request of every round of a step, pooled:

- the *knee* is the seed benchmark's dual-threshold rule: the first step whose P95 latency is
  above 1.3 x the contender's baseline (its first, lightest step) *and* whose error rate is above
  1.5 x its baseline error rate (at least 1 percentage point: 1.5 x 0 would make any single error
  a knee). Latencies are those clients saw, refusals included. The unguarded service's knee is
  the reference load ("the knee", "2x the knee");
- the *collapse* is the first step from which on goodput (answers per second within the deadline)
  stays below 90% of the best goodput of the steps before it: where more load buys less work for
  good (a dip that a heavier step climbs out of is noise, not a collapse).

A load shedder passes the knee's error threshold at any load past capacity (the excess is refused)
and its P95 passes 1.3 x whenever its latency tolerance is wider than 30%, so its knee marks where
it starts shedding, not where it breaks; the headline compares collapses instead (the adaptive
contender holds its goodput at least 1.5 x as far as the hand-composed stack), and the knees are
printed beside it.

Each step holds a few hundred requests, so a knee comes with a confidence: knees and collapses are
found again in ``BOOTSTRAP_RESAMPLES`` bootstrap resamples (each step's requests drawn with
replacement, seeded), and a target on them is MET only when it holds in at least
``KNEE_CONFIDENCE`` (95%) of them, a one-sided 95% bootstrap confidence (Efron and Tibshirani, *An
Introduction to the Bootstrap*, 13.3). A share is a rate's Wilson score bound (97.5% one-sided).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..demo.loadgen import RequestRecord
from ._changes import change_targets, trace_line

__all__ = ["BenchReport", "StepSummary", "find_knee", "summarize_step"]

P95_FACTOR = 1.3
COLLAPSE_FACTOR = 0.9
KNEE_CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 400
KNEE_RATIO = 1.5
MAX_SHED_BELOW_KNEE = 0.02
SHED = ("overloaded", "unavailable")  # refused by the service itself (a tenant's quota aside)
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
    window_s: float = 0.0  # seconds measured (summed over rounds)
    ok_ms: tuple[float, ...] = field(default=(), repr=False)  # answered requests' latencies
    failed_ms: tuple[float, ...] = field(default=(), repr=False)  # every other request's

    @property
    def sampled(self) -> bool:
        """Whether the requests' latencies are kept (what the knee's confidence resamples)."""
        return bool(self.ok_ms or self.failed_ms)


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
        window_s=steady_s,
        ok_ms=tuple(round(r.latency_s * 1000, 1) for r in ok),
        failed_ms=tuple(round(r.latency_s * 1000, 1) for r in records if r.outcome != "ok"),
    )


def merge_rounds(rounds: Sequence[StepSummary]) -> StepSummary:
    """One step over its rounds: the latency quantiles and the error rate of every request of every
    round pooled (when kept), the median of each other number, counts summed."""
    if len(rounds) == 1:
        return rounds[0]
    ok_ms = tuple(v for r in rounds for v in r.ok_ms)
    failed_ms = tuple(v for r in rounds for v in r.failed_ms)

    def med(name: str) -> float:
        return float(statistics.median(getattr(r, name) for r in rounds))

    def total(name: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in rounds:
            for k, v in getattr(r, name).items():
                out[k] = out.get(k, 0) + v
        return out

    pooled = ok_ms + failed_ms
    requests = sum(r.requests for r in rounds)

    def quantile(name: str, q: float) -> float:
        return _quantile(pooled, q) if pooled else med(name)

    return StepSummary(
        offered_rps=rounds[0].offered_rps,
        requests=requests,
        goodput_rps=med("goodput_rps"),
        error_rate=len(failed_ms) / len(pooled) if pooled else med("error_rate"),
        p50_ms=quantile("p50_ms", 0.5),
        p95_ms=quantile("p95_ms", 0.95),
        p99_ms=quantile("p99_ms", 0.99),
        well_behaved_success=med("well_behaved_success"),
        well_behaved_p99_ms=med("well_behaved_p99_ms"),
        shed_by_priority=total("shed_by_priority"),
        outcomes=total("outcomes"),
        well_behaved_outcomes=total("well_behaved_outcomes"),
        window_s=sum(r.window_s for r in rounds),
        ok_ms=ok_ms,
        failed_ms=failed_ms,
    )


def find_knee(steps: Sequence[StepSummary]) -> int | None:
    """The index of the knee step (see the module docstring), None when no step breaks both."""
    return _knee([(s.p95_ms, s.error_rate) for s in steps])


def find_collapse(steps: Sequence[StepSummary]) -> int | None:
    """The index of the collapse step (see the module docstring), None when goodput holds."""
    return _collapse([s.goodput_rps for s in steps])


def _knee(points: Sequence[tuple[float, float]]) -> int | None:
    """The knee of steps given as (P95 ms, error rate), lightest first."""
    if not points:
        return None
    base_p95, base_err = points[0]
    for i, (p95, err) in enumerate(points[1:], start=1):
        if p95 > P95_FACTOR * base_p95 and err > max(ERROR_FACTOR * base_err, ERROR_FLOOR):
            return i
    return None


def _collapse(goodputs: Sequence[float]) -> int | None:
    """The first step from which on every step's goodput is below ``COLLAPSE_FACTOR`` x the best
    of the steps before it (a dip that a heavier step climbs out of is not a collapse)."""
    found = None
    best_before = [max(goodputs[:i]) for i in range(1, len(goodputs))]
    for i in range(len(goodputs) - 1, 0, -1):
        if goodputs[i] >= COLLAPSE_FACTOR * best_before[i - 1]:
            break
        if all(g < COLLAPSE_FACTOR * best_before[i - 1] for g in goodputs[i:]):
            found = i
    return found


def resample(
    steps: Sequence[StepSummary], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> tuple[list[int | None], list[int | None]] | None:
    """The knee and the collapse (step indices, None: none) of each of ``resamples`` bootstrap
    resamples of ``steps``: each step's requests drawn with replacement (numpy, seeded). None when
    the steps kept no latencies."""
    if not steps or not all(s.sampled and s.window_s > 0 for s in steps):
        return None
    import numpy as np

    rng = np.random.default_rng(seed)
    columns = []
    for s in steps:
        latencies = np.asarray(s.ok_ms + s.failed_ms, dtype=float)
        n, n_ok = len(latencies), len(s.ok_ms)
        picks = rng.integers(0, n, size=(resamples, n))
        p95 = np.quantile(latencies[picks], 0.95, axis=1, method="inverted_cdf")
        ok = (picks < n_ok).sum(axis=1)
        columns.append((p95, 1.0 - ok / n, ok / s.window_s))
    knees = [_knee([(float(c[0][b]), float(c[1][b])) for c in columns]) for b in range(resamples)]
    collapses = [_collapse([float(c[2][b]) for c in columns]) for b in range(resamples)]
    return knees, collapses


def ratio_share(
    offered: Sequence[float], mine: Sequence[int | None], theirs: Sequence[int | None], ratio: float
) -> float:
    """The share of paired resamples in which step ``mine`` offers at least ``ratio`` x the load of
    step ``theirs`` (None for mine: beyond the top step, counted at the top step's load; None for
    theirs: no ratio, not counted as holding)."""
    held = 0
    for m, t in zip(mine, theirs, strict=True):
        if t is not None:
            held += (offered[-1] if m is None else offered[m]) >= ratio * offered[t]
    return held / len(mine) if mine else 0.0


@dataclass
class BenchReport:
    """A bench run: options, the offered loads, per contender the merged summary of each step,
    every round's summaries, the knees, the capacity-change runs (one per seed), the targets."""

    options: dict[str, Any]
    capacity_rps: float
    offered_rps: list[float]
    steps: dict[str, list[StepSummary]]
    rounds: dict[str, list[list[StepSummary]]]
    changes: list[dict[str, Any]] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    json_path: Path | None = None
    chart_path: Path | None = None
    _resamples: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    # -- derived ----------------------------------------------------------------------------------

    @property
    def halving(self) -> dict[str, Any]:
        """The (first) capacity-change run, {} when none ran."""
        return self.changes[0] if self.changes else {}

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

    def resampled(self, name: str) -> tuple[list[int | None], list[int | None]] | None:
        """:func:`resample` of contender ``name``'s steps (seeded by its place), kept once made."""
        cache = self._resamples
        if name not in cache:
            seed = list(self.steps).index(name) + 1 if name in self.steps else 0
            cache[name] = resample(self.steps.get(name, []), seed=seed)
        return cache[name]  # type: ignore[no-any-return]

    def collapses(self) -> dict[str, int | None]:
        return {name: find_collapse(steps) for name, steps in self.steps.items()}

    def _collapse_target(self) -> dict[str, Any]:
        """The headline: the adaptive contender holds its goodput to at least ``KNEE_RATIO`` x the
        load where the hand-composed stack's collapses, in ``KNEE_CONFIDENCE`` of the resamples."""
        offered, top = self.offered_rps, self.offered_rps[-1]
        collapses = self.collapses()
        hand, adapt = collapses["hand-composed"], collapses["ragguard-adaptive"]
        target = f"adaptive holds goodput to >= {KNEE_RATIO:g}x the load where hand-composed's collapses"
        if hand is None:
            return {"target": target, "met": False, "confidence": None,
                    "detail": f"hand-composed's goodput holds up to {top:.0f} rps: no ratio to measure"}
        a = top if adapt is None else offered[adapt]
        ok = a >= KNEE_RATIO * offered[hand]
        where = f"no collapse up to {top:.0f} rps" if adapt is None else f"collapses at {a:.0f} rps"
        text = f"adaptive {where}, hand-composed at {offered[hand]:.0f} rps ({'>= ' if adapt is None else ''}"
        text += f"{a / offered[hand]:.2f}x)"
        share = None
        mine, theirs = self.resampled("ragguard-adaptive"), self.resampled("hand-composed")
        if mine is not None and theirs is not None:
            share = ratio_share(offered, mine[1], theirs[1], KNEE_RATIO)
            ok = ok and share >= KNEE_CONFIDENCE
            text += f"; holds in {share:.0%} of {BOOTSTRAP_RESAMPLES} resamples"
            text += f" (MET needs {KNEE_CONFIDENCE:.0%})"
        return {"target": target, "met": ok, "detail": text, "confidence": share}

    def _shed_target(self, below: Sequence[StepSummary]) -> dict[str, Any]:
        """Below the reference knee the adaptive contender refuses (itself, quotas aside) under
        ``MAX_SHED_BELOW_KNEE`` of the requests, with 97.5% confidence (Wilson's upper bound)."""
        from ._stats import wilson

        requests = sum(s.requests for s in below)
        shed = sum(s.outcomes.get(o, 0) for s in below for o in SHED)
        high = wilson(shed, requests)[1]
        detail = (f"{shed} of {requests} requests up to {below[-1].offered_rps:.0f} rps "
                  f"({shed / max(requests, 1):.1%}; at most {high:.1%} with 97.5% confidence)")
        if wilson(0, requests)[1] >= MAX_SHED_BELOW_KNEE:  # a GAP even with nothing shed: say why
            counts = itertools.count(requests + 1)
            enough = next(n for n in counts if wilson(0, n)[1] < MAX_SHED_BELOW_KNEE)
            detail += f"; too few requests to show it: {enough} at least"
        return {
            "target": f"below the knee, the adaptive service sheds < {MAX_SHED_BELOW_KNEE:.0%} of requests",
            "met": requests > 0 and high < MAX_SHED_BELOW_KNEE,
            "detail": detail,
            "confidence": high,
        }

    def knee_note(self) -> str | None:
        """The seed rule's knees of the adaptive and hand-composed contenders, their ratio and the
        share of resamples where it reaches ``KNEE_RATIO`` (information: see the module docstring)."""
        knees = self.knees()
        if "hand-composed" not in knees or "ragguard-adaptive" not in knees:
            return None
        offered, top = self.offered_rps, self.offered_rps[-1]
        hand, adapt = knees["hand-composed"], knees["ragguard-adaptive"]

        def at(i: int | None) -> str:
            return f"none up to {top:.0f} rps" if i is None else f"{offered[i]:.0f} rps"

        text = f"knees (seed rule): adaptive {at(adapt)}, hand-composed {at(hand)}"
        if hand is not None:
            a = top if adapt is None else offered[adapt]
            text += f" ({'>= ' if adapt is None else ''}{a / offered[hand]:.2f}x"
            mine, theirs = self.resampled("ragguard-adaptive"), self.resampled("hand-composed")
            if mine is not None and theirs is not None:
                share = ratio_share(offered, mine[0], theirs[0], KNEE_RATIO)
                text += f"; >= {KNEE_RATIO:g}x in {share:.0%} of resamples"
            text += ")"
        return text + ": a load shedder's knee marks where it starts shedding, not where it breaks"

    def knee_rps(self, name: str) -> float | None:
        k = self.knees().get(name)
        return None if k is None else self.offered_rps[k]

    def targets(self) -> list[dict[str, Any]]:
        """The issue's targets, each MET or GAP with the numbers behind it."""
        out = self._step_targets() if self.steps else []
        for h in self.changes:
            out += change_targets(h, label=f"seed {h.get('seed')}: " if len(self.changes) > 1 else "")
        return out

    def _step_targets(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        k, k2, exact = self.reference()
        deadline_ms = float(self.options["deadline_s"]) * 1000
        if "hand-composed" in self.steps and "ragguard-adaptive" in self.steps:
            out.append(self._collapse_target())
        a = self.steps.get("ragguard-adaptive")
        if a is not None and k > 0:
            out.append(self._shed_target(a[:k]))
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
        return out

    # -- output -----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        reference: dict[str, Any] = {}
        if self.steps:  # a stepped run (not only the capacity changes)
            k, k2, exact = self.reference()
            reference = {
                "knee_rps": self.offered_rps[k],
                "twice_knee_rps": self.offered_rps[k2],
                "twice_exact": exact,
            }
        return {
            "options": self.options,
            "capacity_rps": self.capacity_rps,
            "offered_rps": self.offered_rps,
            "knee_rule": {
                "p95_factor": P95_FACTOR,
                "error_factor": ERROR_FACTOR,
                "error_floor": ERROR_FLOOR,
                "confidence": KNEE_CONFIDENCE,
                "bootstrap_resamples": BOOTSTRAP_RESAMPLES,
            },
            "reference": reference,
            "knees_rps": {n: (None if i is None else self.offered_rps[i]) for n, i in self.knees().items()},
            "steps": {n: [_summary(s, samples=False) for s in steps] for n, steps in self.steps.items()},
            "rounds": {n: [[_summary(s) for s in r] for r in rounds] for n, rounds in self.rounds.items()},
            "changes": self.changes,
            "targets": self.targets(),
            "timings_s": self.timings_s,
        }

    @classmethod
    def read_json(cls, path: Path) -> BenchReport:
        """A report written by :meth:`write_json` (every round's requests: the same knees, tables
        and targets)."""
        data = json.loads(path.read_text())

        def step(d: dict[str, Any]) -> StepSummary:
            fields: dict[str, Any] = {k: (math.nan if v is None else v) for k, v in d.items()}
            for key in ("ok_ms", "failed_ms"):
                fields[key] = tuple(d.get(key) or ())
            return StepSummary(**fields)

        rounds = {n: [[step(s) for s in r] for r in rs] for n, rs in data["rounds"].items()}
        steps = {
            n: [merge_rounds([r[i] for r in rs]) for i in range(len(data["offered_rps"]))] if rs and rs[0]
            else [step(s) for s in data["steps"][n]]
            for n, rs in rounds.items()
        }
        report = cls(
            options=data["options"],
            capacity_rps=data["capacity_rps"],
            offered_rps=data["offered_rps"],
            steps=steps,
            rounds=rounds,
            changes=data.get("changes") or ([data["halving"]] if data.get("halving") else []),
            timings_s=data.get("timings_s") or {},
        )
        report.json_path = path
        return report

    def write_json(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_clean(self.to_dict()), indent=2, default=_json_default) + "\n")
        self.json_path = path
        return path

    def table(self) -> Any:
        """The rich table of the run: whole in an 80-column terminal (headers on two lines, no
        vertical rules)."""
        from rich import box
        from rich.table import Table

        k, k2, exact = self.reference()
        knees = self.knees()
        t = Table(
            title=(
                f"ragguard bench: knee = {self.offered_rps[k]:.0f} rps ({self._knee_note(k)}), "
                f"2x = {self.offered_rps[k2]:.0f} rps{'' if exact else ' (last step)'}; "
                f"dependency capacity ~{self.capacity_rps:.0f} rps"
            ),
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            collapse_padding=True,
        )
        for col in (
            "contender",
            "knee\nrps",
            "collapse\nrps",
            "goodput\n@knee",
            "goodput\n@2x",
            "P95\n@2x ms",
            "P99\n@2x ms",
        ):
            t.add_column(col, justify="left" if col == "contender" else "right", no_wrap=True)
        collapses = self.collapses()
        top = f">{self.offered_rps[-1]:.0f}"
        for name, steps in self.steps.items():
            s1, s2 = steps[k], steps[k2]
            knee, collapse = knees[name], collapses[name]
            t.add_row(
                name,
                top if knee is None else f"{self.offered_rps[knee]:.0f}",
                top if collapse is None else f"{self.offered_rps[collapse]:.0f}",
                f"{s1.goodput_rps:.1f}",
                f"{s2.goodput_rps:.1f}",
                f"{s2.p95_ms:.0f}",
                f"{s2.p99_ms:.0f}",
            )
        t.caption = self.knee_note()
        return t

    def tenants_table(self) -> Any:
        """At twice the knee, by tenant: the well-behaved tenants' success and P99, and the
        requests shed by priority (whole in an 80-column terminal)."""
        from rich import box
        from rich.table import Table

        _, k2, _ = self.reference()
        t = Table(
            title=f"at 2x the knee ({self.offered_rps[k2]:.0f} rps), by tenant",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            collapse_padding=True,
        )
        for col in ("contender", "well-behaved\nsuccess", "well-behaved\nP99 ms", "shed\nbatch",
                    "shed\ninteractive"):
            t.add_column(col, justify="left" if col == "contender" else "right", no_wrap=True)
        for name, steps in self.steps.items():
            s2 = steps[k2]
            shed = s2.shed_by_priority
            t.add_row(
                name,
                _percent(s2.well_behaved_success),
                f"{s2.well_behaved_p99_ms:.0f}",
                str(shed.get("batch", 0)),
                str(shed.get("interactive", 0)),
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

    def changes_lines(self, h: dict[str, Any] | None = None) -> list[str]:
        """A capacity-change run (the first by default) in a few lines: its timeline and the
        capacities, the adaptive limit's trace and baseline, each contender's goodput before, while
        halved (from the settling on) and restored; with a caveat when the halved part is too short
        to rank the contenders."""
        h = self.halving if h is None else h
        cap = h["capacity_rps"]
        (n0, n1), (m0, m1) = cap["nominal"], cap["measured"]
        change_at, restore_at = float(h["change_at_s"]), float(h["restore_at_s"])
        seed = f" (seed {h['seed']})" if "seed" in h else ""
        wb = f" ({h['well_behaved_rps']:.0f} by the well-behaved tenants)" if "well_behaved_rps" in h else ""
        lines = [
            f"capacity changes{seed} at {h['offered_rps']:.0f} rps offered{wb}: halved at {change_at:g} s, "
            f"back at {restore_at:g} s; capacity {m0:.1f} -> {m1:.1f} -> {m0:.1f} rps measured ({n0:.1f} -> "
            f"{n1:.1f} nominal)"
        ]
        trace = [(t, lim, None, probing) for t, lim, probing in h.get("limit_trace") or []]
        if trace:
            lines.append("adaptive limit, each second's mean (| capacity halved, back; p probing): "
                         + trace_line(trace, float(h["duration_s"])))
            base = [m for _, m in h.get("min_rtt_trace") or [] if m is not None]
            if base:
                lines.append(f"its baseline (min_rtt): {1000 * min(base):.0f}-{1000 * max(base):.0f} ms")
        lines.append(
            "goodput before/halved/restored (rps): "
            + ", ".join(
                f"{n} {r['before']['goodput_rps']:.1f}/{r['after']['goodput_rps']:.1f}/"
                f"{r['restored']['goodput_rps']:.1f}"
                for n, r in h["runs"].items()
            )
        )
        after = restore_at - change_at
        if after < MIN_RANKING_WINDOW_S:
            lines[-1] += (
                f" (caveat: {after:g} s after the halving is too short for a queue to build, so these "
                "numbers do not rank the contenders; the full run, without --quick, does)"
            )
        return lines

    def changes_table(self) -> Any:
        """The capacity-change runs of the adaptive contender, one row per seed: goodput while
        halved (and its share of the capacity measured and nominal), the well-behaved tenants'
        success, when goodput was back, the limit's means, the targets met (whole at 80 columns)."""
        from rich import box
        from rich.table import Table

        t = Table(title="capacity changes: ragguard-adaptive", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, collapse_padding=True)
        for col in ("seed", "halved\nrps", "of cap.\nmeas/nom", "well-\nbehaved", "back\nin s",
                    "limit before/\nhalved/back", "targets\nmet"):
            t.add_column(col, justify="right", no_wrap=True)
        for h in self.changes:
            run = h["runs"].get("ragguard-adaptive")
            if run is None:
                continue
            g = run["after"]["goodput_rps"]
            (_, n1), (_, m1) = h["capacity_rps"]["nominal"], h["capacity_rps"]["measured"]
            wb = run["after"]["well_behaved_success"]
            back = run["recovery_s"]
            limits = "/".join("-" if h.get(k) is None else f"{h[k]:.0f}"
                              for k in ("limit_before", "limit_after", "limit_restored"))
            rows = change_targets(h)
            t.add_row(str(h.get("seed", "")), f"{g:.1f}", f"{g / m1:.0%}/{g / n1:.0%}",
                      "-" if wb is None else _percent(wb), "-" if back is None else f"{back:.1f}", limits,
                      f"{sum(r['met'] for r in rows)} of {len(rows)}")
        return t

    def targets_table(self) -> Any:
        """The targets, MET or GAP, with what was measured: whole in an 80-column terminal."""
        from rich import box
        from rich.table import Table

        t = Table(
            title="targets (ratios within this one run)", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False
        )
        t.add_column("target", ratio=5)
        t.add_column("", no_wrap=True)
        t.add_column("measured", ratio=6)
        for row in self.targets():
            t.add_row(row["target"], "[green]MET[/green]" if row["met"] else "[red]GAP[/red]", row["detail"])
        return t

    def write_chart(self, path: Path) -> Path:
        """Goodput and P99 against offered load (knees marked), and each capacity-change run: the
        contenders' goodput and the adaptive limit over time."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        first = 2 if self.steps else 0
        changes = self.changes
        panels = first + len(changes)
        columns = panels if self.steps else min(panels, 3)  # several seeds: rows of three
        rows = -(-panels // columns)
        fig, grid = plt.subplots(rows, columns, figsize=(6 * columns, 4.6 * rows), squeeze=False)
        axes = list(grid.flat)
        for spare in axes[panels:]:
            spare.set_visible(False)
        if self.steps:
            self._chart_steps(axes[0], axes[1])
        for ax, h in zip(axes[first:panels], changes, strict=True):
            _chart_changes(ax, h)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        self.chart_path = path
        return path

    def _chart_steps(self, good: Any, p99: Any) -> None:
        knees = self.knees()
        x = self.offered_rps
        for name, steps in self.steps.items():
            (line,) = good.plot(x, [s.goodput_rps for s in steps], marker="o", label=name)
            p99.plot(x, [s.p99_ms for s in steps], marker="o", label=name, color=line.get_color())
            k = knees[name]
            if k is not None:
                good.plot([x[k]], [steps[k].goodput_rps], marker="X", markersize=14, color=line.get_color())
                p99.plot([x[k]], [steps[k].p99_ms], marker="X", markersize=14, color=line.get_color())
        good.plot(x, [min(v, self.capacity_rps) for v in x], ls=":", color="grey", label="capacity")
        good.set(xlabel="offered load (requests/s)", ylabel="goodput (answers/s)", title="goodput (X: knee)")
        p99.set(xlabel="offered load (requests/s)", ylabel="P99 latency (ms)", title="P99 (X: knee)",
                yscale="log")
        good.legend(fontsize=8)


def _chart_changes(ax: Any, h: dict[str, Any]) -> None:
    """One capacity-change run: each contender's goodput over time, the adaptive limit beside it."""
    for name, run in h.get("runs", {}).items():
        buckets = run["buckets"]
        ax.plot([b["t_s"] for b in buckets], [b["goodput_rps"] for b in buckets], label=name)
    for at in (h["change_at_s"], h["restore_at_s"]):
        ax.axvline(at, color="grey", ls="--")
    seed = f", seed {h['seed']}" if "seed" in h else ""
    ax.set(xlabel="time (s)", ylabel="goodput (answers/s)", title=f"capacity halved, back (dashed){seed}")
    limit = h.get("limit_trace") or []
    if limit:
        twin = ax.twinx()
        twin.step([p[0] for p in limit], [p[1] for p in limit], where="post", color="black", lw=1,
                  label="adaptive limit (retrieve)")
        twin.set_ylabel("adaptive limit (calls in flight)")
        twin.legend(loc="lower right", fontsize=8)
    ax.legend(loc="upper right", fontsize=8)


def _percent(share: float) -> str:
    """``share`` (0..1) as a percentage of at most five characters: 100%, 99.6%, 0.0%."""
    if math.isnan(share):
        return "-"
    return "100%" if share >= 0.9995 else f"{share:.1%}"


def _summary(step: StepSummary, *, samples: bool = True) -> dict[str, Any]:
    """``step`` as JSON: the requests' latencies (ms) only where asked (a round's; a merged step's
    are its rounds' together)."""
    out = asdict(step)
    if not samples:
        del out["ok_ms"], out["failed_ms"]
    return out


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
