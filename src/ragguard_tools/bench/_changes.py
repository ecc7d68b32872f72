"""The capacity-change run of ``ragguard bench``: what a user feels when the dependency loses half of
its capacity, and when it gets it back.

At 80% of the dependency's capacity (measured, see below), ``block_ms`` doubles a third of the way
through the run (the dependency serves half as many calls, half as many at once) and is back two
thirds of the way through. Every contender gets the same arrival plan; the adaptive contender's
``retrieve`` limit is sampled every 100 ms. A window's goodput is the answers that came back in it,
per second (an answer sent while halved that came back after the capacity was restored does not count
as halved work); its load is the requests sent in it, and the well-behaved tenants' success is that
of the requests they sent in it. From each contender's requests:

- *halved*: goodput from ``SETTLE_S`` after the halving until the capacity is back, against the new
  capacity (or the load sent, if less), and the well-behaved tenants' success;
- *restored*: how long after the capacity is back the goodput is at ``SHARE`` of the capacity (or of
  the load sent, if less) from then to the end of the run, and whether the limit grew back (its mean
  over the last half of the run's restored part against its mean while halved).

The capacity is measured before each run (``_Bench.measure_capacity``: as many embedding and
vector-store calls as the backends answer with 16 callers in a loop, at ``block_ms`` and twice it):
the nominal ``1000 / block_ms`` leaves out the backends' own work per call and overstates what they
can serve (by 10-20% on a shared 2-core machine: 80% of it is a service already queueing). Both are
reported.

The targets (the adaptive contender): after the halving, goodput >= ``SHARE`` of the new capacity and
well-behaved tenants >= 99% success; after the restoring, goodput back at ``SHARE`` within
``RECOVER_S`` and the limit grown by ``LIMIT_GROWTH``. A limit that stays put while goodput collapses
fails the first (the line says the limit did not move): a target on the limit alone ("it settled")
is met by a limit that never moves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..demo.loadgen import RequestRecord

__all__ = [
    "LIMIT_GROWTH",
    "LOAD",
    "RECOVER_S",
    "SETTLE_S",
    "SHARE",
    "change_targets",
    "limit_phases",
    "recovery_s",
    "summarize_run",
    "timeline",
    "trace_line",
    "window",
]

LOAD = 0.8
"""The load of the run, as a share of the capacity measured before it."""
SETTLE_S = 2.0
"""Seconds after the halving before goodput is measured (the limit's time to follow)."""
RECOVER_S = 5.0
"""Seconds after the capacity is back within which goodput must be back."""
SHARE = 0.9
"""The share of the capacity (or of the load sent, if less) a contender must serve."""
WELL_BEHAVED = 0.99
LIMIT_GROWTH = 1.5
"""How much the limit must grow back when the capacity doubles again."""
STEP_S = 0.5


def timeline(duration_s: float) -> tuple[float, float]:
    """(halving, restoring) clock times of a run of ``duration_s`` seconds: a third and two thirds."""
    return duration_s / 3, 2 * duration_s / 3


def settle_s(change_at: float, restore_at: float) -> float:
    """Seconds after the halving before goodput counts: ``SETTLE_S``, or half the halved part of a
    run too short for it (``--quick``)."""
    return min(SETTLE_S, (restore_at - change_at) / 2)


def window(records: Sequence[RequestRecord], a: float, b: float, wb: set[str]) -> dict[str, Any]:
    """[a, b): the answers that came back in it and the requests sent in it, per second; the
    well-behaved tenants' success and every outcome of the requests sent in it."""
    part = [r for r in records if a <= r.at_s < b]
    answered = sum(1 for r in records if r.outcome == "ok" and a <= r.at_s + r.latency_s < b)
    mine = [r for r in part if r.tenant in wb]
    outcomes: dict[str, int] = {}
    for r in part:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    theirs: dict[str, int] = {}
    for r in mine:
        theirs[r.outcome] = theirs.get(r.outcome, 0) + 1
    span = max(b - a, 1e-9)
    return {
        "goodput_rps": round(answered / span, 2),
        "offered_rps": round(len(part) / span, 2),
        "well_behaved_success": round(theirs.get("ok", 0) / len(mine), 4) if mine else None,
        "well_behaved_requests": len(mine),
        "outcomes": outcomes,
        "well_behaved_outcomes": theirs,
    }


def _enough(w: dict[str, Any], capacity_rps: float) -> bool:
    return bool(w["goodput_rps"] >= SHARE * min(w["offered_rps"], capacity_rps))


def recovery_s(
    records: Sequence[RequestRecord], restore_at: float, end: float, capacity_rps: float
) -> float | None:
    """Seconds from ``restore_at`` to the first moment (in steps of 0.5 s) from which on goodput is
    at ``SHARE`` of ``capacity_rps`` (or of the load sent, if less) both in its first second and
    over the rest of the run; None if never (with at least a second left)."""
    t = restore_at
    while t <= end - 1.0 + 1e-9:
        if _enough(window(records, t, t + 1.0, set()), capacity_rps) and _enough(
            window(records, t, end, set()), capacity_rps
        ):
            return round(t - restore_at, 2)
        t += STEP_S
    return None


def summarize_run(
    records: Sequence[RequestRecord],
    *,
    duration_s: float,
    well_behaved: set[str],
    capacity_rps: Sequence[float],
) -> dict[str, Any]:
    """One contender's capacity-change run: its windows (see the module docstring), the time its
    goodput took to come back, and its goodput in 0.5 s buckets. ``capacity_rps``: (full, halved)."""
    change_at, restore_at = timeline(duration_s)
    settle = settle_s(change_at, restore_at)
    buckets = []
    t = 0.0
    while t < duration_s - 1e-9:
        w = window(records, t, t + STEP_S, well_behaved)
        buckets.append({"t_s": round(t + STEP_S / 2, 3), "goodput_rps": w["goodput_rps"],
                        "well_behaved_success": w["well_behaved_success"]})
        t += STEP_S
    return {
        "before": window(records, 0.0, change_at, well_behaved),
        "after": window(records, change_at + settle, restore_at, well_behaved),
        "restored": window(records, restore_at, duration_s, well_behaved),
        "recovery_s": recovery_s(records, restore_at, duration_s, capacity_rps[0]),
        "buckets": buckets,
    }


Trace = Sequence[tuple[float, int, float | None, bool]]
"""The adaptive limit sampled: (seconds into the run, limit, baseline seconds, probing)."""


def limit_phases(trace: Trace, duration_s: float) -> dict[str, float | None]:
    """The limit's mean before the halving (its last two thirds), while halved (from the settling
    on) and restored (the last half of that part); probes left out (they pin the limit on purpose)."""
    change_at, restore_at = timeline(duration_s)
    settle = settle_s(change_at, restore_at)

    def mean(a: float, b: float) -> float | None:
        values = [lim for t, lim, _, probing in trace if a <= t < b and not probing]
        return round(sum(values) / len(values), 2) if values else None

    return {
        "limit_before": mean(change_at / 3, change_at),
        "limit_after": mean(change_at + settle, restore_at),
        "limit_restored": mean((restore_at + duration_s) / 2, duration_s),
    }


def trace_line(trace: Trace, duration_s: float) -> str:
    """The limit's mean over each second of the run, ``|`` where the capacity halves and where it is
    back (a probe's samples left out; ``p`` for a second spent probing)."""
    change_at, restore_at = timeline(duration_s)
    parts: list[str] = []
    for second in range(math.ceil(duration_s - 1e-9)):
        for mark in (change_at, restore_at):
            if second - 1 < mark <= second and second:
                parts.append("|")
        values = [lim for t, lim, _, probing in trace if second <= t < second + 1 and not probing]
        parts.append(f"{sum(values) / len(values):.0f}" if values else "p")
    return " ".join(parts)


def change_targets(
    h: dict[str, Any], name: str = "ragguard-adaptive", label: str = ""
) -> list[dict[str, Any]]:
    """The capacity-change run's targets on contender ``name``, each MET or GAP with the numbers
    behind it (none when the contender did not run); ``label`` heads each target (a seed's)."""
    run = h.get("runs", {}).get(name)
    if run is None:
        return []
    nominal, measured = h["capacity_rps"]["nominal"], h["capacity_rps"]["measured"]
    full, halved = measured
    after, restored = run["after"], run["restored"]
    lb, la, lr = h.get("limit_before"), h.get("limit_after"), h.get("limit_restored")
    out = []
    want = SHARE * min(after["offered_rps"], halved)
    g = after["goodput_rps"]
    detail = (f"{g:.1f} rps: {g / halved:.0%} of {halved:.1f} measured ({g / nominal[1]:.0%} of "
              f"{nominal[1]:.1f} nominal)")
    if lb is not None and la is not None:
        detail += f"; limit {lb:.1f} -> {la:.1f}"
        if g < want and la >= 0.8 * lb:
            detail += ": the limit did not move while goodput collapsed"
    out.append({"target": f"{label}after capacity halves, adaptive goodput from {SETTLE_S:g} s on >= "
                          f"{SHARE:.0%} of the new capacity", "met": g >= want, "detail": detail})
    wb = after["well_behaved_success"]
    out.append({
        "target": f"{label}after capacity halves, well-behaved tenants >= {WELL_BEHAVED:.0%} success",
        "met": wb is not None and wb >= WELL_BEHAVED,
        "detail": "no well-behaved requests" if wb is None
        else f"{wb:.1%} of {after['well_behaved_requests']} requests",
    })
    rec = run["recovery_s"]
    grew = lr is not None and la is not None and lr >= LIMIT_GROWTH * la
    detail = ("goodput not back" if rec is None else f"goodput back in {rec:.1f} s") + (
        f" ({restored['goodput_rps']:.1f} rps of {restored['offered_rps']:.1f} sent, capacity {full:.1f} "
        "measured)")
    if la is not None and lr is not None:
        detail += f"; limit {la:.1f} -> {lr:.1f}" + ("" if grew else f" (not {LIMIT_GROWTH:g}x)")
    out.append({
        "target": f"{label}after capacity is back, the limit grows back and goodput is >= {SHARE:.0%} of "
                  f"it within {RECOVER_S:g} s",
        "met": rec is not None and rec <= RECOVER_S and grew,
        "detail": detail,
    })
    return out
