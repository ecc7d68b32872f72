"""Helpers of the bench tests (imported as ``bench_helpers``): a capacity-change run as the runner
writes it, and requests answered or failed as a function of time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ragguard_tools.bench._changes import limit_phases, timeline
from ragguard_tools.demo.loadgen import RequestRecord

WELL_BEHAVED = {"acme", "globex"}


def records(
    duration_s: float, rate: float, outcome: Callable[[float, str], str], latency_s: float = 0.1
) -> list[RequestRecord]:
    """Requests of ``acme`` (well-behaved) and ``hoarder`` sent every ``1 / rate`` seconds in turn,
    each ending ``latency_s`` later as ``outcome(sent at, tenant)`` says."""
    out = []
    for i in range(int(duration_s * rate)):
        at = i / rate
        tenant = "acme" if i % 2 else "hoarder"
        out.append(RequestRecord(at, tenant, 0, latency_s, outcome(at, tenant)))
    return out


def changes_run(
    duration_s: float,
    *,
    adaptive: dict[str, Any] | None = None,
    limits: tuple[float, float, float] = (16.0, 8.0, 20.0),
    measured: tuple[float, float] = (55.0, 30.0),
) -> dict[str, Any]:
    """A capacity-change run as ``_Bench.halving`` returns it: the unguarded service and the
    adaptive one (``adaptive`` overrides its windows), the limit at ``limits`` before, halved and
    restored (sampled every 100 ms, a probe at the start)."""
    change_at, restore_at = timeline(duration_s)

    def phase(t: float) -> float:
        return limits[0] if t < change_at else limits[1] if t < restore_at else limits[2]

    trace = [(t / 10, phase(t / 10), 0.068, t < 3) for t in range(int(duration_s * 10))]
    run = {"before": {"goodput_rps": 53.3}, "after": {"goodput_rps": 28.3, "offered_rps": 53.3,
           "well_behaved_success": 1.0, "well_behaved_requests": 120},
           "restored": {"goodput_rps": 52.0, "offered_rps": 53.3}, "recovery_s": 0.5}  # fmt: skip
    run.update(adaptive or {})
    out = {
        "seed": 7, "offered_rps": 44.0, "well_behaved_rps": 16.5, "duration_s": duration_s,
        "change_at_s": change_at, "restore_at_s": restore_at,
        "capacity_rps": {"nominal": [66.7, 33.3], "measured": list(measured)},
        "runs": {"unguarded": {"before": {"goodput_rps": 53.3}, "after": {"goodput_rps": 43.3},
                               "restored": {"goodput_rps": 50.0}},
                 "ragguard-adaptive": run},
        "limit_trace": [[t, lim, probing] for t, lim, _, probing in trace],
        "min_rtt_trace": [[t, m] for t, _, m, _ in trace],
    }  # fmt: skip
    out.update(limit_phases(trace, duration_s))
    return out
