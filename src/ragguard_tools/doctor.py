"""What the recent events mean: correlation rules over stalls, pool trouble, breakers, quotas and
fallbacks, and a timeline.

Rules, most telling first:

``stall_delayed_pool``         a loop stall overlaps pool waits or exhaustion: the loop was
                               blocked in X, so connection releases were delayed.
``breaker_opened_during_stall`` a breaker opened on slow calls or timeouts during a stall or
                               within ``grace_s`` after it: the dependency may be healthy; the
                               latency was ours (not for a trip by refused connections or errors).
``breaker_open``               which dependency's breaker opened, why, how often, for how long in
                               all, whether it was still not closed when the log ends, and how
                               many calls it refused.
``quota_rejections``           which tenant was refused, how often, why (rate, concurrency,
                               deadline) and when; the most refused first.
``fallbacks_served``           which stage answered from which fallback, how often, what share of
                               its answers (from the recorder's counts), and the errors behind it.
``failover``                   a model group's failover episode: which deployment was left, why
                               (its errors, or its breaker open: skipped without a call), which
                               took over, how many calls none could answer, and what the left
                               deployment's breaker did meanwhile (opened, its cooldown, back).
``shared_state``               Redis unreachable, or refusing ragguard's credentials, ACL
                               permissions or TLS (said apart): which components (quotas, shared
                               breakers) ran on local state, for how long, why, and whether they
                               were back.
``connection_leak``            a connection held too long, with the stack that acquired it.
``pool_exhausted``             pool exhaustion with no stall around it: the pool is too small for
                               this concurrency, or connections leak.
``loop_stall``                 stalls explained by nothing above, grouped by blocking frame; a
                               stall inside asyncio's own code says what that means, and one
                               whose stack held only Python's own code (``origin`` "runtime")
                               is worded as CPU starvation or a GC pause, not as code to move.

Every diagnosis also has a timeline: the notable moments in order, in seconds from the first record,
and, when stages ran under a deadline, where the requests' deadlines went, stage by stage (the
recorder's ``budget`` counts): for each stage, the most time left first (the order the stages
ran, but a stage nested in another, as embedding in retrieval, can come after later ones), the
time its calls had left when they started and what they spent of it, on average, and how many a
fallback answered or ran out of time.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import re
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ragguard import _validate as v
from ragguard._errors import InvalidInput
from ragguard.monitors._record import Record, check_record, default_recorder, load_records, to_record

__all__ = [
    "DEFAULT_EVENTS_FILE", "DEMO_EVENTS_FILE", "Diagnosis", "Finding", "Moment", "StageBudget", "diagnose",
    "doctor_main",
]

DEFAULT_EVENTS_FILE = "ragguard-events.jsonl"
DEMO_EVENTS_FILE = "ragguard-report/events.jsonl"  # where `ragguard demo` writes its run's events
_SLACK_S = 0.05  # events are stamped by different code paths; tolerate this much skew
_OPEN_STATES = {"open", "forced_open"}
_CLOSED_STATES = {"closed", "disabled"}
_EPISODE_GAP_S = 2.0  # refusals or fallbacks this far apart belong to different episodes
_MAX_TENANT_FINDINGS = 10
_MAX_TIMELINE = 60
_MAX_DETAILS = 12
_MAX_STALL_FINDINGS = 8  # loop_stall findings, one per place, the last for every other place

_QUOTA_WHY = {
    "rate": "it sent requests faster than its rate_per_s (and burst) allow",
    "concurrency": "it had max_concurrency requests in flight, and more waited longer than max_wait_s",
    "deadline": "its requests' deadlines would run out before a slot or a rate token came",
    "tokens": "its streams' token estimates did not fit its token_quota (generated tokens per window)",
}


@dataclass(frozen=True, slots=True)
class Finding:
    """One conclusion: ``kind`` (a rule name), ``severity`` (critical, warning, info), a one-line
    ``summary``, ``details`` lines (stacks, counts, transitions) and the numbers in ``data``."""

    kind: str
    severity: str
    summary: str
    details: tuple[str, ...] = ()
    data: dict[str, Any] = field(default_factory=dict)
    run: str = ""
    """The run it belongs to, when the log marks runs (:meth:`EventRecorder.mark_run`); ``""``
    when it does not, or for the records before the first mark."""


@dataclass(frozen=True, slots=True)
class Run:
    """A run the log marks (:meth:`EventRecorder.mark_run`): ``name``, and its first and last
    record in seconds after the log's first record (None when unknown). The records before the
    first mark form a run named ``""``."""

    name: str
    from_s: float | None
    to_s: float | None


@dataclass(frozen=True, slots=True)
class Moment:
    """One line of the timeline: ``at_s`` seconds after the first record (None when the record
    had no time), and ``what`` happened."""

    at_s: float | None
    what: str


@dataclass(frozen=True, slots=True)
class StageBudget:
    """Where the requests' deadlines went in stage ``stage``: ``calls`` of its calls ran under a
    deadline, which had ``left_s`` seconds left on average when they started and spent
    ``spent_s`` seconds on average; ``fallback`` of them a fallback answered, ``deadline`` ended
    with DeadlineExceeded. ``run``: as :attr:`Finding.run`."""

    stage: str
    calls: int
    left_s: float
    spent_s: float
    fallback: int = 0
    deadline: int = 0
    run: str = ""

    @property
    def spent_share(self) -> float:
        """``spent_s`` as a share of ``left_s`` (0.0 when nothing was left)."""
        return self.spent_s / self.left_s if self.left_s > 0 else 0.0

    def line(self, width: int = 14) -> str:
        """One line of the doctor's budget table."""
        text = (
            f"{self.stage:<{width}} {self.calls:>6} call(s): started with {_ms(self.left_s)} left, "
            f"spent {_ms(self.spent_s)} ({self.spent_share:.0%})"
        )
        also = [f"{self.fallback} answered by a fallback"] if self.fallback else []
        also += [f"{self.deadline} ran out of time"] if self.deadline else []
        return text + ("; " + ", ".join(also) if also else "")


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The findings over ``events`` records spanning ``span_s`` seconds, and their ``timeline``.

    ``started_wall`` is the Unix time of the first record (None when unknown); ``calls`` counts
    the guarded stage calls the recorder tallied (0 without a tally); ``runs`` the runs the log
    marks, in order (empty when it marks none), each finding naming its own (``Finding.run``);
    ``budget`` where the requests' deadlines went, stage by stage (:class:`StageBudget`, in the
    order the stages ran; empty when no stage ran under a deadline). The budget is a report,
    not a finding: it does not make a diagnosis unhealthy.
    """

    findings: tuple[Finding, ...]
    events: int
    span_s: float
    timeline: tuple[Moment, ...] = ()
    started_wall: float | None = None
    calls: int = 0
    runs: tuple[Run, ...] = ()
    budget: tuple[StageBudget, ...] = ()

    @property
    def healthy(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "events": self.events,
            "calls": self.calls,
            "span_s": round(self.span_s, 6),
            "started_wall": self.started_wall,
            "findings": [asdict(f) | {"details": list(f.details)} for f in self.findings],
            "timeline": [{"at_s": m.at_s, "what": m.what} for m in self.timeline],
            "runs": [asdict(r) for r in self.runs],
            "budget": [asdict(b) | {"spent_share": round(b.spent_share, 6)} for b in self.budget],
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def to_text(self) -> str:
        counted = f", {self.calls} guarded call(s) counted" if self.calls else ""
        head = (
            f"ragguard doctor: {len(self.findings)} finding(s) in {self.events} event(s){counted} "
            f"over {self.span_s:.1f} s"
        )
        lines = [head]
        if not self.findings:
            lines.append(_QUIET)
            if not self.budget:
                return lines[0] + "\n" + lines[1]
        runs = self.runs or (Run("", None, None),)
        for run in runs:
            findings = [f for f in self.findings if f.run == run.name]
            budget = self._budget_lines((run,))
            if self.runs and (findings or budget or run.name):
                lines.append(_run_header(run, len(findings)))
            for f in findings:
                lines.append(f"[{f.severity}] {f.summary}")
                lines.extend(f"    {d}" for d in f.details)
            lines.extend(budget)
        if self.timeline:
            since = "" if self.started_wall is None else f" (from {_utc(self.started_wall)})"
            lines.append(f"timeline{since}:")
            lines.extend(f"  {_offset(m.at_s)}  {m.what}" for m in self.timeline)
        return "\n".join(lines)


    def _budget_lines(self, runs: Sequence[Run]) -> list[str]:
        """The budget table of ``runs``: a title, then a line per stage."""
        names = {run.name for run in runs}
        rows = [b for b in self.budget if b.run in names]
        if not rows:
            return []
        width = max(14, *(len(b.stage) for b in rows))
        title = (
            "where the requests' deadlines went, stage by stage (means of the calls made under a "
            "deadline, the most time left first):"
        )
        return [title, *(f"  {b.line(width)}" for b in rows)]


_QUIET = "no stalls, pool exhaustion, leaks, breaker trips, quota refusals, fallbacks or failovers seen."


def _run_header(run: Run, findings: int) -> str:
    name = f"run {run.name!r}" if run.name else "before the first run"
    span = ""
    if run.from_s is not None and run.to_s is not None:
        span = f" (+{run.from_s:.1f} s to +{run.to_s:.1f} s)"
    return f"== {name}{span}: {findings} finding(s)"


def diagnose(events: Iterable[Any] | None = None, *, grace_s: float = 1.0) -> Diagnosis:
    """Correlate recent events and say what they mean.

    ``events``: event dataclasses or records (dicts as written by the event file); None reads
    the recorder started by :func:`ragguard.monitors.record_events`. When the records mark runs
    (``RunStarted``, :meth:`EventRecorder.mark_run`), each run is diagnosed on its own records
    (and the share of the recorder's counts made during it) and its findings name it.
    ``grace_s`` (seconds, >= 0): how long after a stall a breaker opening still counts as
    caused by it when the opening's calls' latencies were not recorded. Raises ConfigError for
    a negative ``grace_s``, :class:`~ragguard.InvalidInput` naming the record for a dict record
    without a field its type needs, and RuntimeError when ``events`` is None and no recorder runs.
    """
    grace_s = v.seconds("grace_s", grace_s, allow_zero=True)
    if events is None:
        recorder = default_recorder()
        if recorder is None:
            raise RuntimeError(
                "no events to diagnose: pass events, or call ragguard.monitors.record_events() first"
            )
        events = recorder.records()
    records = []
    for index, event in enumerate(events):
        record = _as_record(event)
        problem = check_record(record)
        if problem is not None:
            raise InvalidInput(f"record {index}: {problem}")
        records.append(record)
    return _by_run(records, grace_s)


def _by_run(records: list[Record], grace_s: float) -> Diagnosis:
    """One diagnosis over every run the records mark, each run's rules run on its own records."""
    marks = [r for r in records if r["type"] == "RunStarted" and _finite(r["t"])]
    marks.sort(key=lambda r: float(r["t"]))
    if not marks:
        return _Rules(records, grace_s).run()
    times = _times(records)
    t0 = min(times) if times else None
    bounds = [float(m["t"]) for m in marks]
    parts: list[list[Record]] = [[] for _ in range(len(marks) + 1)]
    for r in records:
        if r["type"] != "RunStarted":
            t = _when(r)
            parts[0 if t is None else bisect.bisect_right(bounds, t)].append(r)
    names = ["", *(str(m["run"]) for m in marks)]
    findings: list[Finding] = []
    moments: list[Moment] = []
    runs: list[Run] = []
    budget: list[StageBudget] = []
    calls = 0
    previous: Record | None = None  # the recorder's counts are cumulative: a run's are the difference
    for name, mark, part in zip(names, [None, *marks], parts, strict=True):
        tallies = [r for r in part if r["type"] == "Tally"]
        own = [r for r in part if r["type"] != "Tally"]
        if tallies:
            own.append(_tally_since(tallies[-1], previous))
            previous = tallies[-1]
        if not own and mark is None:
            continue  # nothing before the first mark
        rules = _Rules(own, grace_s, t0=t0)
        if mark is not None:
            rules.moment(float(mark["t"]), f"run {name!r} begins")
        result = rules.run(capped=False)
        findings.extend(replace(f, run=name) for f in result.findings)
        budget.extend(replace(b, run=name) for b in result.budget)
        moments.extend(result.timeline)
        calls += result.calls
        start = float(mark["t"]) if mark is not None else None
        spanned = [t for r in own if (t := _when(r)) is not None] + ([start] if start is not None else [])
        runs.append(Run(name, _since(t0, min(spanned, default=None)), _since(t0, max(spanned, default=None))))
    everything = _Rules([r for r in records if r["type"] not in ("RunStarted", "Tally")], grace_s)
    return Diagnosis(
        tuple(findings), sum(r["type"] not in ("RunStarted", "Tally") for r in records),
        max(times) - min(times) if times else 0.0, _capped_timeline(moments),
        everything.started_wall, calls, tuple(runs), tuple(budget),
    )  # fmt: skip


def _times(records: list[Record]) -> list[float]:
    """Every known time of ``records``: their own, and when a stall or a wait began."""
    times = [t for r in records if (t := _when(r)) is not None]
    times += [float(r["started_at"]) for r in records if _finite(r.get("started_at"))]
    return times


def _since(t0: float | None, t: float | None) -> float | None:
    return None if t0 is None or t is None else t - t0


def _tally_since(tally: Record, before: Record | None) -> Record:
    """The counts of cumulative ``tally`` made after the earlier ``before`` (None: all of them)."""
    if before is None:
        return tally

    def minus(now: Any, then: Any) -> Any:
        if isinstance(now, dict):
            old = then if isinstance(then, dict) else {}
            return {k: minus(n, old.get(k)) for k, n in now.items()}
        if _finite(now) and _finite(then):
            return now - then
        return now

    kept = ("stages", "calls", "rejected", "budget")
    return {**tally, **{k: minus(tally.get(k, {}), before.get(k)) for k in kept}}


def opened_times(opened: int, reopened: int) -> str:
    """How often a breaker opened, in the words the doctor and the demo's table share:
    ``opened 3 time(s) (1 after a failed trial)``. ``opened`` counts every move to open,
    ``reopened`` those from half-open (its trial calls failed)."""
    after = f" ({reopened} after a failed trial)" if reopened else ""
    return f"opened {opened} time(s){after}"


def _as_record(event: Any) -> Record:
    if isinstance(event, dict):
        return event
    return to_record(event, t=float("nan"), wall=float("nan"))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _s(seconds: float) -> str:
    return f"{seconds:.1f} s"


def _offset(at_s: float | None) -> str:
    return "    +? s" if at_s is None else f"{at_s:+8.2f} s"


def _utc(wall: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall))


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _when(r: Record) -> float | None:
    """A record's time: its own ``at`` when it has one, else ``t``; None when neither is known."""
    for key in ("at", "t"):
        if _finite(r.get(key)):
            return float(r[key])
    return None


def _counted(counts: Counter[str]) -> str:
    return ", ".join(f"{name} {n}" for name, n in counts.most_common())


_CAUSE_MEANS = {
    "BreakerOpen": "breaker open",
    "EmbeddingUnavailable": "breaker open",
    "VectorStoreUnavailable": "breaker open",
    "RerankOutOfMemory": "breaker open",
    "StageTimeout": "stage timeout",
    "AttemptTimeout": "stage timeout",
    "DeadlineExceeded": "deadline spent",
}


_FAILOVER_WHY = {
    "open": "its breaker open (skipped without a call)",
    "limits": "its requests or tokens per minute spent",
    "failure": "failed",
    "timeout": "timed out",
    "rejection": "rejected the call (429, 529)",
    "overloaded": "its adaptive limit shed the call",
    "refused": "refused by ragguard",
    "context_length": "the request too long for its context window",
}
"""A :class:`~ragguard.events.FailedOver` reason, in words."""


def _causes(causes: Counter[str]) -> str:
    """``Counter`` of error class names, each of ragguard's own said in words."""
    return ", ".join(
        f"{name} {n}" + (f" ({_CAUSE_MEANS[name]})" if name in _CAUSE_MEANS else "")
        for name, n in causes.most_common()
    )


def _capped(lines: list[str], limit: int = _MAX_DETAILS) -> tuple[str, ...]:
    if len(lines) <= limit:
        return tuple(lines)
    return (*lines[:limit], f"... and {len(lines) - limit} more")


def _episodes(times: list[float]) -> list[tuple[float, float, int]]:
    """(first, last, count) of runs of times with gaps under ``_EPISODE_GAP_S``."""
    out: list[tuple[float, float, int]] = []
    for t in sorted(times):
        if out and t - out[-1][1] <= _EPISODE_GAP_S:
            first, _, n = out[-1]
            out[-1] = (first, t, n + 1)
        else:
            out.append((t, t, 1))
    return out


_LATENCY_CAUSES = ("slow", "timeout")
_REASON_LATENCY = ("slow", "timeout", "timed out", "deadline")
_REASON_OTHER = ("connect", "refused", "unavailable", "reset", "memory", "oom")


def _tripped_by_latency(tr: Record) -> bool | None:
    """Whether breaker transition ``tr`` (to open) was caused by slow calls or timeouts: True,
    False, or None when neither its ``reason`` nor the ``causes`` the recorder adds say.

    A reason that names slowness decides (``slow-call rate ...``, ``... trial calls were
    slow``); else at least half of the recorded slow or failed calls were slow or timed out;
    else a reason that names a timeout, or another failure (``ConnectionError: ...``)."""
    reason = str(tr.get("reason") or "").lower()
    if "slow" in reason:
        return True
    causes = tr.get("causes")
    if isinstance(causes, dict):
        counts = {str(k): float(n) for k, n in causes.items() if _finite(n) and n > 0}
        if counts:
            latency = sum(n for k, n in counts.items() if k in _LATENCY_CAUSES)
            return bool(2 * latency >= sum(counts.values()))
    if any(word in reason for word in _REASON_LATENCY):
        return True
    if any(word in reason for word in _REASON_OTHER):
        return False
    return None


def _errors_seen(tr: Record) -> str:
    """`` (ConnectionRefusedError 7, TimeoutError 1)``: the failures the recorder saw before an
    opening, or ``""``."""
    errors = tr.get("errors")
    if not isinstance(errors, dict):
        return ""
    counts = Counter({str(k): int(n) for k, n in errors.items() if _finite(n) and n > 0})
    return f" ({v.bounded(_counted(counts), 200)})" if counts else ""


def _latencies(tr: Record) -> list[tuple[float, float]]:
    """The (ended at, seconds taken) of the slow or timed-out calls before opening ``tr``, as
    the recorder gives them (``latencies``); malformed pairs are skipped."""
    pairs = tr.get("latencies")
    if not isinstance(pairs, list):
        return []
    ok = [p for p in pairs if isinstance(p, list) and len(p) == 2 and _finite(p[0]) and _finite(p[1])]
    return [(float(p[0]), float(p[1])) for p in ok if p[1] > 0]


def _where(stall: Record) -> str:
    """Where a stall was caught, in words even when no stack sample was."""
    return str(stall.get("frame") or "") or _NO_SAMPLE


_NO_SAMPLE = "(no stack sample caught)"


def _is_asyncio_own(stall: Record) -> bool:
    filename = str(stall.get("filename") or stall.get("frame", ""))
    return f"{os.sep}asyncio{os.sep}" in filename or "/asyncio/" in filename


def _capped_timeline(moments: Iterable[Moment]) -> tuple[Moment, ...]:
    """The moments in time order, at most ``_MAX_TIMELINE``; the rest said in one last line at
    the time of the first left out."""
    ordered = sorted(moments, key=lambda m: (m.at_s is None, m.at_s or 0.0))
    if len(ordered) <= _MAX_TIMELINE:
        return tuple(ordered)
    rest = ordered[_MAX_TIMELINE:]
    timed = [m.at_s for m in rest if m.at_s is not None]
    until = f", until {_offset(max(timed)).strip()}" if timed else ""
    return (*ordered[:_MAX_TIMELINE], Moment(rest[0].at_s, f"... and {len(rest)} more moments{until}"))


class _Rules:
    def __init__(self, records: list[Record], grace_s: float, *, t0: float | None = None) -> None:
        self.grace_s = grace_s
        self.by_type: dict[str, list[Record]] = defaultdict(list)
        for r in records:
            self.by_type[r["type"]].append(r)
        tallies = self.by_type.pop("Tally", [])
        self.tally = tallies[-1] if tallies else None  # cumulative: the last one written holds all
        self.records = [r for r in records if r["type"] != "Tally"]
        self.stalls = self.by_type["LoopStall"]
        self.explained: set[int] = set()
        times = _times(records)  # tallies too: the log lasts till then
        self.t0 = t0 if t0 is not None else min(times) if times else None
        self.span = max(times) - min(times) if times else 0.0
        self.end = max(times) if times else None
        self.started_wall: float | None = None
        for r in self.records:  # the wall time of the first record, from one that has both clocks
            t = _when(r)
            if t is not None and self.t0 is not None and _finite(r.get("wall")):
                self.started_wall = float(r["wall"]) - (t - self.t0)
                break
        self.timeline: list[tuple[float | None, str]] = []

    def rel(self, t: float | None) -> float | None:
        return None if t is None or self.t0 is None else t - self.t0

    def at(self, t: float | None) -> str:
        at_s = self.rel(t)
        return "+? s" if at_s is None else f"+{at_s:.1f} s"

    def moment(self, t: float | None, what: str) -> None:
        self.timeline.append((self.rel(t), what))

    def run(self, *, capped: bool = True) -> Diagnosis:
        findings = [
            *self._stall_pool(),
            *self._breaker_stall(),
            *self._breakers(),
            *self._quotas(),
            *self._fallbacks(),
            *self._failovers(),
            *self._shared_state(),
            *self._leaks(),
            *self._exhaustion(),
            *self._plain_stalls(),
        ]
        self._retry_budget()
        moments = [Moment(at_s, what) for at_s, what in self.timeline]
        timeline = _capped_timeline(moments) if capped else tuple(moments)
        calls = 0
        if self.tally is not None:
            calls = sum(n for counts in self.tally["stages"].values() for n in counts.values() if _finite(n))
        return Diagnosis(
            tuple(findings), len(self.records), self.span, timeline, self.started_wall, calls,
            budget=self._budget(),
        )  # fmt: skip

    def _budget(self) -> tuple[StageBudget, ...]:
        """Where the deadlines went, from the recorder's ``budget`` counts (see the module docstring)."""
        given = self.tally.get("budget") if self.tally is not None else None
        if not isinstance(given, dict):
            return ()
        rows = []
        for stage, counts in given.items():
            if not isinstance(counts, dict):
                continue
            n: Any = counts.get("calls")
            left: Any = counts.get("left_s")
            spent: Any = counts.get("spent_s")
            if not (_finite(n) and n >= 1 and _finite(left) and _finite(spent)):
                continue
            fallback, deadline = counts.get("fallback", 0), counts.get("deadline", 0)
            rows.append(StageBudget(
                str(stage), int(n), max(0.0, left / n), max(0.0, spent / n),
                int(fallback) if _finite(fallback) else 0, int(deadline) if _finite(deadline) else 0,
            ))  # fmt: skip
        rows.sort(key=lambda b: (-b.left_s, b.stage))
        return tuple(rows)

    # -- the loop and the pools ----------------------------------------------------------------------

    def _overlapping_stall(self, start: float, end: float) -> Record | None:
        for s in self.stalls:
            if start <= s["at"] + _SLACK_S and end >= s["started_at"] - _SLACK_S:
                return s
        return None

    def _stall_pool(self) -> list[Finding]:
        out = []
        pool_events = self.by_type["PoolExhausted"]
        for stall in self.stalls:
            hits = [
                p
                for p in pool_events
                if p["started_at"] <= stall["at"] + _SLACK_S and p["at"] >= stall["started_at"] - _SLACK_S
            ]
            if not hits:
                continue
            self.explained.add(id(stall))
            pools = sorted({p["pool"] for p in hits})
            worst = max(p["wait_s"] for p in hits)
            out.append(
                Finding(
                    "stall_delayed_pool",
                    "critical",
                    f"the loop was blocked in {_where(stall)} for {_ms(stall['duration_s'])}; "
                    f"pool releases were delayed ({len(hits)} pool event(s) on {', '.join(pools)}, "
                    f"longest wait {_ms(worst)})",
                    tuple(f"at {line}" for line in stall.get("stack", [])[:8]),
                    {
                        "frame": stall["frame"],
                        "stall_s": stall["duration_s"],
                        "pools": pools,
                        "max_wait_s": worst,
                    },
                )
            )
        return out

    def _stalled_s(self, start: float, end: float) -> tuple[float, Record | None]:
        """Seconds of ``[start, end]`` the loop spent in stalls, and the stall that took most."""
        total, most, worst = 0.0, 0.0, None
        for s in self.stalls:
            overlap = min(end, s["at"]) - max(start, s["started_at"])
            if overlap > 0:
                total += overlap
                if overlap > most:
                    most, worst = overlap, s
        return total, worst

    def _breaker_stall(self) -> list[Finding]:
        """A breaker that opened on slow calls or timeouts the loop's stalls explain.

        With the calls' latencies recorded (``latencies``: when each slow or timed-out call
        ended, how long it took), a call is explained when stalls took at least half its time
        (without them it would have taken half as long: a 29 ms stall cannot explain a 3 s call),
        and the opening is blamed when at least half its slow or timed-out calls are. Without
        them, a stall up to ``grace_s`` before the opening is a possible cause, said as such. A
        trip the record shows was caused by other failures (refused connections, out of memory,
        errors) is never blamed: a stall makes calls slow, not refused."""
        out = []
        for tr in self.by_type["BreakerTransition"]:
            if tr.get("new") not in _OPEN_STATES:
                continue
            at = _when(tr)
            latency = _tripped_by_latency(tr)
            if at is None or latency is False:
                continue
            calls = _latencies(tr)
            finding = self._weighed(tr, calls) if calls else self._coincided(tr, at, latency)
            if finding is not None:
                out.append(finding)
        return out

    def _weighed(self, tr: Record, calls: list[tuple[float, float]]) -> Finding | None:
        explained: list[tuple[float, float, float]] = []
        worst: Record | None = None
        for ended, took in calls:
            stalled, stall = self._stalled_s(ended - took, ended)
            if stalled >= took / 2:
                explained.append((ended, took, stalled))
                if stall is not None and (worst is None or stall["duration_s"] > worst["duration_s"]):
                    worst = stall
        if worst is None or 2 * len(explained) < len(calls):
            return None
        for ended, took, _ in explained:
            for s in self.stalls:
                if s["started_at"] < ended and s["at"] > ended - took:
                    self.explained.add(id(s))
        took = statistics.median(t for _, t, _ in explained)
        stalled = statistics.median(s for _, _, s in explained)
        return Finding(
            "breaker_opened_during_stall",
            "critical",
            f"breaker {tr['breaker']!r} opened on slow calls or timeouts while the loop was stalled: "
            f"{len(explained)} of its {len(calls)} slow or timed-out call(s) spent at least half their time "
            f"in loop stalls (median {_ms(stalled)} of {_ms(took)}; the longest stall in {_where(worst)}, "
            f"{_ms(worst['duration_s'])}): the dependency may be healthy; the latency was ours",
            tuple(f"at {line}" for line in worst.get("stack", [])[:8]),
            {"breaker": tr["breaker"], "frame": worst["frame"], "stall_s": worst["duration_s"],
             "cause_recorded": True, "weighed": True, "explained_calls": len(explained),
             "latency_calls": len(calls), "median_call_s": took, "median_stalled_s": stalled},
        )  # fmt: skip

    def _coincided(self, tr: Record, at: float, latency: bool | None) -> Finding | None:
        stall = next(
            (s for s in self.stalls if s["started_at"] - _SLACK_S <= at <= s["at"] + self.grace_s), None
        )
        if stall is None:
            return None
        self.explained.add(id(stall))
        why = " on slow calls or timeouts" if latency else ""
        after = max(0.0, at - stall["at"])
        when = "during" if after <= _SLACK_S else f"{_ms(after)} after"
        return Finding(
            "breaker_opened_during_stall",
            "warning",
            f"breaker {tr['breaker']!r} opened{why} {when} a {_ms(stall['duration_s'])} loop stall in "
            f"{_where(stall)}: the latency may have been ours, not the dependency's. Its calls' latencies "
            "were not recorded (ragguard.monitors.record_events records them), so whether the stall was "
            "long enough to explain them is unknown",
            tuple(f"at {line}" for line in stall.get("stack", [])[:8]),
            {"breaker": tr["breaker"], "frame": stall["frame"], "stall_s": stall["duration_s"],
             "cause_recorded": latency is not None, "weighed": False},
        )  # fmt: skip

    # -- breakers, quotas, fallbacks -------------------------------------------------------------------

    def _breakers(self) -> list[Finding]:
        by_breaker: dict[str, list[Record]] = defaultdict(list)
        for tr in self.by_type["BreakerTransition"]:
            by_breaker[tr["breaker"]].append(tr)
        rejected: dict[str, Any] = dict(self.tally["rejected"]) if self.tally is not None else {}
        out = []
        for name in sorted(by_breaker, key=lambda b: min((_when(t) or 0.0) for t in by_breaker[b])):
            trs = sorted(by_breaker[name], key=lambda r: _when(r) or 0.0)
            lines = []
            for tr in trs:
                reason = f": {tr['reason']}" if tr.get("reason") else ""
                reason += _errors_seen(tr)
                text = f"breaker {name!r} {tr['old']} -> {tr['new']}{reason}"
                self.moment(_when(tr), text)
                lines.append(f"{self.at(_when(tr))} {tr['old']} -> {tr['new']}{reason}")
            finding = self._breaker_finding(name, trs, lines, rejected.pop(name, 0))
            if finding is not None:
                out.append(finding)
        for name, n in sorted(rejected.items(), key=lambda kv: -kv[1]):
            if _finite(n) and n > 0:  # open since before the log began
                out.append(Finding(
                    "breaker_open", "warning",
                    f"breaker {name!r} refused {n} call(s) without calling its dependency; it was open "
                    "before the log began",
                    (), {"breaker": name, "episodes": 0, "rejected": n},
                ))  # fmt: skip
        return out

    def _breaker_finding(
        self, name: str, trs: list[Record], lines: list[str], refused: Any
    ) -> Finding | None:
        episodes: list[dict[str, Any]] = []
        current: dict[str, Any] | None = None
        for tr in trs:
            at = _when(tr)
            if tr["new"] in _OPEN_STATES:
                if current is None:
                    current = {"start": at, "reason": tr.get("reason", ""), "reopened": 0, "end": None}
                    episodes.append(current)
                elif tr["old"] == "half_open":
                    current["reopened"] += 1
            elif tr["new"] in _CLOSED_STATES and current is not None:
                current["end"] = at
                current = None
        if not episodes:
            return None
        end = self.end
        spans = []
        for ep in episodes:
            stop = ep["end"] if ep["end"] is not None else end
            known = stop is not None and ep["start"] is not None
            spans.append(max(0.0, stop - ep["start"]) if known else 0.0)
        total, longest = sum(spans), max(spans)
        still_open = episodes[-1]["end"] is None
        reopened = sum(ep["reopened"] for ep in episodes)
        first = episodes[0]
        summary = (
            f"breaker {name!r} {opened_times(len(episodes) + reopened, reopened)}, first at "
            f"{self.at(first['start'])}"
            f"{f' ({first_reason})' if (first_reason := first['reason']) else ''}: the dependency was "
            f"kept out of the call path (open, then trial calls) {_s(total)} in all (longest {_s(longest)})"
        )
        if still_open:
            summary += f"; still not closed when the log ends ({_s(spans[-1])} after it opened)"
        if _finite(refused) and refused:
            summary += f"; it refused {refused} call(s) without calling the dependency"
        details = list(lines)
        calls = self.tally["calls"].get(name) if self.tally is not None else None
        if isinstance(calls, dict) and calls:
            ran = sum(n for n in calls.values() if _finite(n))
            bad = {k: n for k, n in calls.items() if k != "success" and _finite(n) and n}
            details.append(f"calls it let through: {ran} ({_counted(Counter(bad)) or 'all succeeded'})")
        causes = Counter(f["cause"] for f in self.by_type["FallbackServed"] if f["stage"] == name)
        if causes:
            details.append(f"errors behind the stage's fallbacks: {_causes(causes)}")
        severity = "critical" if still_open or (self.span and total > self.span / 2) else "warning"
        return Finding(
            "breaker_open",
            severity,
            summary,
            _capped(details),
            {"breaker": name, "opened": len(episodes) + reopened, "episodes": len(episodes),
             "open_s": total, "longest_s": longest,
             "still_open": still_open, "reopened": reopened, "rejected": refused if _finite(refused) else 0,
             "reasons": [ep["reason"] for ep in episodes]},
        )  # fmt: skip

    def _quotas(self) -> list[Finding]:
        by_tenant: dict[str, list[Record]] = defaultdict(list)
        for r in self.by_type["QuotaRejected"]:
            by_tenant[r["tenant"]].append(r)
        total = sum(len(rs) for rs in by_tenant.values())
        ranked = sorted(by_tenant.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        out: list[Finding] = []
        for tenant, rs in ranked:
            reasons = Counter(r["reason"] for r in rs)
            times = [t for r in rs if (t := _when(r)) is not None]
            episodes = _episodes(times)
            for first, last, n in episodes:
                self.moment(first, f"tenant {tenant!r} refused {n} time(s) until {self.at(last)}")
            if len(out) >= _MAX_TENANT_FINDINGS:
                continue
            top = reasons.most_common(1)[0][0]
            why = _QUOTA_WHY.get(top, f"reason {top!r}")
            window = f" from {self.at(min(times))} to {self.at(max(times))}" if times else ""
            share = ""
            if len(by_tenant) > 1:
                share = f", {len(rs) * 100 / total:.0f}% of all {total} quota refusals"
            retry = [r["retry_after_s"] for r in rs if _finite(r["retry_after_s"])]
            details = []
            if len(reasons) > 1:
                details = [f"{reason}: {n} ({_QUOTA_WHY.get(reason, 'see the QuotaRejected events')})"
                           for reason, n in reasons.most_common()]  # fmt: skip
            if retry:
                details.append(f"told to retry after {_ms(statistics.median(retry))} (median)")
            details.extend(f"{self.at(a)} to {self.at(b)}: {n} refused" for a, b, n in episodes)
            out.append(Finding(
                "quota_rejections", "warning",
                f"tenant {tenant!r} was refused {len(rs)} time(s) ({_counted(reasons)}){window}{share}: "
                f"{why}",
                _capped(details),
                {"tenant": tenant, "count": len(rs), "reasons": dict(reasons), "share": len(rs) / total},
            ))  # fmt: skip
        rest = ranked[_MAX_TENANT_FINDINGS:]
        if rest:
            n = sum(len(rs) for _, rs in rest)
            out.append(Finding(
                "quota_rejections", "warning",
                f"{len(rest)} more tenant(s) were refused {n} time(s) in all",
                (), {"tenants": len(rest), "count": n},
            ))  # fmt: skip
        return out

    def _fallbacks(self) -> list[Finding]:
        by_stage: dict[str, list[Record]] = defaultdict(list)
        for r in self.by_type["FallbackServed"]:
            by_stage[r["stage"]].append(r)
        stages = self.tally["stages"] if self.tally is not None else {}
        out = []
        for stage, rs in sorted(by_stage.items(), key=lambda kv: -len(kv[1])):
            used = Counter(r["fallback"] for r in rs)
            causes = Counter(r["cause"] for r in rs)
            times = [t for r in rs if (t := _when(r)) is not None]
            for fallback in used:
                for first, last, n in _episodes([t for r in rs if r["fallback"] == fallback
                                                 and (t := _when(r)) is not None]):  # fmt: skip
                    what = f"stage {stage!r} answered {n} time(s) from {fallback} until {self.at(last)}"
                    self.moment(first, what)
            counts = stages.get(stage)
            share: float | None = None
            of = ""
            if isinstance(counts, dict):
                answered = sum(n for n in counts.values() if _finite(n))
                degraded = counts.get("fallback", 0)
                if answered and _finite(degraded):
                    share = degraded / answered
                    of = f", {share * 100:.1f}% of its {answered} answers,"
            window = f" from {self.at(min(times))} to {self.at(max(times))}" if times else ""
            summary = (
                f"stage {stage!r} answered {len(rs)} time(s) from a fallback ({_counted(used)}){of}"
                f"{window}; the errors behind them: {_causes(causes)}"
            )
            severity = "info" if share is not None and share < 0.05 else "warning"
            out.append(Finding(
                "fallbacks_served", severity, summary, (),
                {"stage": stage, "count": len(rs), "fallbacks": dict(used), "causes": dict(causes),
                 "share": share},
            ))  # fmt: skip
        return out

    def _failovers(self) -> list[Finding]:
        """One finding per model group and deployment it left, per episode (failovers less than
        ``_EPISODE_GAP_S`` apart): why it was left, who took over, and its breaker meanwhile."""
        by_left: dict[tuple[str, str], list[Record]] = defaultdict(list)
        for r in self.by_type["FailedOver"]:
            by_left[(str(r["group"]), str(r["deployment"]))].append(r)
        out = []
        for (group, left), rs in sorted(by_left.items(), key=lambda kv: min(_when(r) or 0.0 for r in kv[1])):
            timed = [(t, r) for r in rs if (t := _when(r)) is not None]
            if not timed:
                out.append(self._failover(group, left, rs, None, None))
            for first, last, _ in _episodes([t for t, _ in timed]):
                inside = [r for t, r in timed if first <= t <= last]
                out.append(self._failover(group, left, inside, first, last))
        return out

    def _failover(
        self, group: str, left: str, rs: list[Record], first: float | None, last: float | None
    ) -> Finding:
        reasons = Counter(str(r["reason"]) for r in rs)
        errors = Counter(str(r.get("error") or "") for r in rs if r.get("error"))
        took = Counter(str(r["to"]) for r in rs if r["to"])
        lost = sum(1 for r in rs if not r["to"])
        breaker = next((str(r["breaker"]) for r in rs if r.get("breaker")), "")
        window = "" if first is None else f" from {self.at(first)} to {self.at(last)}"
        why = [_FAILOVER_WHY.get(reason, reason) + f" {n}" for reason, n in reasons.most_common()]
        behind = f" (errors: {_causes(errors)})" if errors else ""
        answered = f"{_counted(took)} took over" if took else "no other deployment answered"
        if lost and took:
            answered += f"; {lost} call(s) found no deployment to answer (NoDeploymentAvailable)"
        summary = (
            f"model group {group!r} left deployment {left!r} {len(rs)} time(s){window}: "
            f"{', '.join(why)}{behind}; {answered}"
        )
        self.moment(first, f"model group {group!r} failed over from {left!r} {len(rs)} time(s) until "
                    f"{self.at(last)} ({_counted(reasons)})")  # fmt: skip
        meanwhile = self._breaker_meanwhile(breaker, first, last)
        return Finding(
            "failover", "warning" if took else "critical", summary, meanwhile,
            {"group": group, "deployment": left, "count": len(rs), "reasons": dict(reasons),
             "errors": dict(errors), "to": dict(took), "unanswered": lost, "breaker": breaker},
        )  # fmt: skip

    def _breaker_meanwhile(self, breaker: str, first: float | None, last: float | None) -> tuple[str, ...]:
        """What ``breaker`` (the left deployment's) did from its last transition before ``first``
        to the first that closed it after ``last``: its opening, its cooldown, whether it came back."""
        if not breaker:
            return ()
        trs = sorted((r for r in self.by_type["BreakerTransition"] if r["breaker"] == breaker),
                     key=lambda r: _when(r) or 0.0)  # fmt: skip
        if first is not None:
            before = [i for i, r in enumerate(trs) if (_when(r) or 0.0) < first]
            trs = trs[before[-1] if before else 0 :]
        shown: list[Record] = []
        for tr in trs:
            shown.append(tr)
            if tr["new"] in _CLOSED_STATES and last is not None and (_when(tr) or 0.0) >= last:
                break
        if not shown:
            return (f"its breaker {breaker!r} did not change state: it stayed closed, and each call tried "
                    "it first",)  # fmt: skip
        lines = []
        for tr in shown:
            reason = f" ({v.bounded(str(tr['reason']), 120)})" if tr.get("reason") else ""
            at = self.at(_when(tr))
            lines.append(f"its breaker {breaker!r} {tr['old']} -> {tr['new']} at {at}{reason}")
        if shown[-1]["new"] in _CLOSED_STATES:
            lines.append("it took calls again once its breaker closed (cooldown over, trials answered)")
        else:
            lines.append(f"its breaker was still {shown[-1]['new']} when the log ends")
        return _capped(lines)

    def _retry_budget(self) -> None:
        by_stage: dict[str, list[float]] = defaultdict(list)
        for r in self.by_type["RetryBudgetExhausted"]:
            t = _when(r)
            if t is not None:
                by_stage[r["stage"]].append(t)
        for stage, times in by_stage.items():
            for first, last, n in _episodes(times):
                what = f"stage {stage!r}: retry budget spent, {n} retry(ies) refused until {self.at(last)}"
                self.moment(first, what)

    # -- ragguard's own use of Redis ------------------------------------------------------------------

    def _shared_state(self) -> list[Finding]:
        """Per component, its outages: from a SharedStateDegraded to the SharedStateRestored that
        ends it (its ``degraded_for_s``), or to the end of the log."""
        switches = sorted(
            self.by_type["SharedStateDegraded"] + self.by_type["SharedStateRestored"],
            key=lambda r: _when(r) or 0.0,
        )
        if not switches:
            return []
        local_s: dict[str, float] = {}
        down_since: dict[str, float | None] = {}
        outages: Counter[str] = Counter()
        reasons: dict[str, str] = {}
        for r in switches:
            component, at = str(r["component"]), _when(r)
            if r["type"] == "SharedStateDegraded":
                if component in down_since:
                    continue  # already degraded: a repeat says nothing new
                down_since[component] = at
                outages[component] += 1
                reasons.setdefault(component, str(r.get("reason", "")))
                why = v.bounded(str(r["reason"]), 120)
                self.moment(at, f"{_redis_problem(str(r['reason']))}: {component} on local state ({why})")
            else:
                since = down_since.pop(component, None)
                down = float(r["degraded_for_s"]) if _finite(r["degraded_for_s"]) else 0.0
                if since is not None and at is not None and not down:
                    down = max(0.0, at - since)
                local_s[component] = local_s.get(component, 0.0) + down
                self.moment(at, f"{component} back on Redis after {_s(down)}")
        for component, since in down_since.items():  # still degraded when the log ends
            if since is not None and self.end is not None:
                local_s[component] = local_s.get(component, 0.0) + max(0.0, self.end - since)
        components = sorted(outages, key=lambda c: (-local_s.get(c, 0.0), c))
        if not components:
            return []
        still = sorted(down_since)
        longest = max(local_s.get(c, 0.0) for c in components)
        more = len(components) - 8
        shown = ", ".join(components[:8]) + (f" and {more} more" if more > 0 else "")
        misconfigured = all(reasons.get(c, "").startswith(_MISCONFIGURED) for c in components)
        what = (
            "Redis refused ragguard's configuration (credentials, ACL permissions or TLS: fix the "
            "client's settings; waiting will not help)" if misconfigured else "Redis unreachable"
        )
        summary = (
            f"shared state: {what}, ran on local state for {_s(longest)} (component "
            f"{shown}); calls were not failed for it, but quotas and breakers were counted per process"
        )
        if still and len(still) == len(components):
            summary += "; none was back on Redis when the log ends"
        elif still:
            summary += f"; still on local state when the log ends: {', '.join(still[:8])}"
        details = tuple(
            f"{c}: {outages[c]} outage(s), {_s(local_s.get(c, 0.0))} on local state, first after "
            f"{v.bounded(reasons.get(c, ''), 200)}"
            for c in components[:_MAX_DETAILS]
        )
        data = {
            "components": components,
            "local_s": {c: round(local_s.get(c, 0.0), 3) for c in components},
            "outages": dict(outages),
            "still_degraded": still,
        }
        return [Finding("shared_state", "warning", summary, details, data)]

    # -- leaks, exhaustion, stalls -------------------------------------------------------------------------

    def _leaks(self) -> list[Finding]:
        out = []
        for leak in self.by_type["ConnectionLeak"]:
            stack = tuple(leak.get("stack", []))
            where = (
                f" acquired at {stack[0]}"
                if stack
                else " (turn on track_leaks=True to see where it was acquired)"
            )
            self.moment(_when(leak), f"a connection of pool {leak['pool']} held {leak['held_s']:.1f} s")
            out.append(
                Finding(
                    "connection_leak",
                    "warning",
                    f"a connection of pool {leak['pool']} was held {leak['held_s']:.1f} s "
                    f"without release;{where}",
                    tuple(f"at {line}" for line in stack),
                    {"pool": leak["pool"], "held_s": leak["held_s"]},
                )
            )
        return out

    def _exhaustion(self) -> list[Finding]:
        lone: dict[str, list[Record]] = defaultdict(list)
        for p in self.by_type["PoolExhausted"]:
            use = f"{p['in_use']}/{p['max_connections']} in use"
            self.moment(_when(p), f"pool {p['pool']} ran short ({p['reason']}, {use})")
            if self._overlapping_stall(p["started_at"], p["at"]) is None:
                lone[p["pool"]].append(p)
        out = []
        for pool, hits in sorted(lone.items()):
            reasons = sorted({h["reason"] for h in hits})
            peak = max(hits, key=lambda h: h["in_use"])
            out.append(
                Finding(
                    "pool_exhausted",
                    "warning",
                    f"pool {pool} ran short {len(hits)} time(s) ({', '.join(reasons)}; "
                    f"up to {peak['in_use']}/{peak['max_connections']} in use, "
                    f"{max(h['waiting'] for h in hits)} waiting, "
                    f"longest wait {_ms(max(h['wait_s'] for h in hits))}) with no loop stall: "
                    "the pool is too small for this concurrency, or connections leak",
                    (),
                    {
                        "pool": pool,
                        "count": len(hits),
                        "reasons": reasons,
                        "max_in_use": peak["in_use"],
                        "max_connections": peak["max_connections"],
                    },
                )
            )
        return out

    def _plain_stalls(self) -> list[Finding]:
        """Stalls no rule above explained: the starved ones (the loop thread waited for a CPU
        through most of them) in one finding, the others grouped by where they were caught."""
        groups: dict[str, list[Record]] = defaultdict(list)
        starved: list[Record] = []
        for s in self.stalls:
            if _starved(s):
                starved.append(s)
            else:
                self.moment(s["started_at"], f"the loop blocked {_ms(s['duration_s'])} in {_where(s)}")
                if id(s) not in self.explained:
                    groups[s["frame"]].append(s)
        out = self._starvation(starved)
        ranked = sorted(groups.items(), key=lambda kv: -sum(h["duration_s"] for h in kv[1]))
        rest: list[tuple[str, list[Record]]] = []
        if len(ranked) > _MAX_STALL_FINDINGS:  # the places that cost the most, then one line for the rest
            ranked, rest = ranked[: _MAX_STALL_FINDINGS - 1], ranked[_MAX_STALL_FINDINGS - 1 :]
        for frame, hits in ranked:
            total = sum(h["duration_s"] for h in hits)
            worst = max(hits, key=lambda h: h["duration_s"])
            summary = _stall_summary(frame, hits, total, worst)
            out.append(
                Finding(
                    "loop_stall",
                    "warning",
                    summary,
                    tuple(f"at {line}" for line in worst.get("stack", [])[:8]),
                    {
                        "frame": frame,
                        "count": len(hits),
                        "total_s": total,
                        "max_s": worst["duration_s"],
                        "asyncio_own": _is_asyncio_own(worst),
                        "origin": _whose(worst),
                        "samples": sum(int(h.get("samples") or 0) for h in hits),
                    },
                )
            )
        if rest:
            hits = [h for _, group in rest for h in group]
            worst = max(hits, key=lambda h: h["duration_s"])
            lost = _ms(sum(h["duration_s"] for h in hits))
            out.append(Finding(
                "loop_stall", "info",
                f"{len(hits)} more stall(s) of the loop ({lost} in all) in {len(rest)} other places, the "
                f"longest {_ms(worst['duration_s'])} in {_where(worst)}",
                (), {"frame": "", "count": len(hits), "places": len(rest), "max_s": worst["duration_s"]},
            ))  # fmt: skip
        return out

    def _starvation(self, starved: list[Record]) -> list[Finding]:
        """One finding for the stalls the loop thread spent mostly waiting, runnable, for a CPU."""
        for first, last, n in _episodes([s["started_at"] for s in starved]):
            lost = sum(s["duration_s"] for s in starved if first <= s["started_at"] <= last)
            self.moment(first, f"the loop thread was starved of CPU {n} time(s) ({_ms(lost)} in all) "
                        f"until {self.at(last)}")  # fmt: skip
        unexplained = [s for s in starved if id(s) not in self.explained]
        if not unexplained:
            return []
        total = sum(s["duration_s"] for s in unexplained)
        waited = sum(float(s["waited_s"]) for s in unexplained)
        ran = sum(float(s["ran_s"]) for s in unexplained if _finite(s.get("ran_s")))
        longest = max(s["duration_s"] for s in unexplained)
        caught = Counter(_where(s) for s in unexplained)
        summary = (
            f"the loop thread was starved of CPU: {len(unexplained)} stall(s), {_ms(total)} in all (longest "
            f"{_ms(longest)}), spent mostly waiting, runnable, for a CPU ({_ms(waited)} waiting, {_ms(ran)} "
            "running). The machine (or the container's CPU quota) had no core free for the loop: that is no "
            "code of yours to move off the loop, and the frames it was caught in are wherever it was "
            "preempted. Look at the host's load and the other processes on it, or the container's CPU limit"
        )
        details = [f"caught in {where}: {n} time(s)" for where, n in caught.most_common(5)]
        if len(caught) > 5:
            details.append(f"... and {len(caught) - 5} more places")
        return [Finding(
            "loop_starved", "warning", summary, tuple(details),
            {"count": len(unexplained), "total_s": total, "max_s": longest, "waited_s": waited, "ran_s": ran},
        )]  # fmt: skip


def _starved(stall: Record) -> bool:
    """The loop thread waited, runnable, for a CPU through at least half of ``stall``."""
    waited = stall.get("waited_s")
    return isinstance(waited, int | float) and _finite(waited) and bool(2 * waited >= stall["duration_s"])


def _blocked(stall: Record) -> bool:
    """The loop thread neither ran nor waited for a CPU through most of ``stall``: it slept."""
    ran, waited = stall.get("ran_s"), stall.get("waited_s")
    if not (isinstance(ran, int | float) and isinstance(waited, int | float) and _finite(ran + waited)):
        return False
    return bool(2 * (ran + waited) < stall["duration_s"])


_RAGGUARD_PATH = re.compile(r"[/\\](?:site-packages|dist-packages|src)[/\\]ragguard[/\\](?!demo[/\\])")
_HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "")


def _whose(stall: Record) -> str:
    """A stall's ``origin``, with ragguard's own frames said as ``ragguard`` even in a log
    written before the detector knew them apart (it called them the application's, a library's
    or Python's own)."""
    origin = str(stall.get("origin") or "")
    filename = str(stall.get("filename") or "")
    if origin in ("app", "library", "runtime") and filename:
        ours = _RAGGUARD_PATH.search(filename) or (
            filename.startswith(_HERE) and not filename.startswith(os.path.join(_HERE, "demo", ""))
        )
        if ours:
            return "ragguard"
    return origin


def _stall_summary(frame: str, hits: list[Record], total: float, worst: Record) -> str:
    """What stalls caught in ``frame`` mean, in words fit for whose code the frame is."""
    longest = _ms(worst["duration_s"])
    blocked = all(_blocked(h) for h in hits)
    if not frame:
        text = (
            f"the loop was blocked {len(hits)} time(s) ({_ms(total)} in all, longest {longest}) and no stack "
            "sample was caught: the watchdog thread got no CPU or GIL before each stall ended (a starved or "
            "busy process, or a stall barely over the threshold), so there is no frame to name"
        )
        if blocked:
            text += (
                "; the loop thread neither ran nor waited for a CPU through most of them: it was blocked "
                "(a system call, a sleep, or the GIL held by another thread)"
            )
        return text
    caught = f"the loop was blocked {len(hits)} time(s) in {frame} ({_ms(total)} in all, longest {longest})"
    whose = _whose(worst)
    if whose == "ragguard":
        return (
            f"{caught}: that is ragguard's own code, not yours to move off the loop. Caught there on a "
            "loaded machine it usually means the loop thread was preempted while running it; if it recurs "
            "on an idle machine, it is ragguard's to fix: report it with this stack"
        )
    if _is_asyncio_own(worst):
        return caught + (
            ": that is asyncio's own code, not a callback of yours (_process_events queues the "
            "callbacks of the sockets that became ready). The time went to the loop's own work "
            "between callbacks: a burst of many ready sockets at once, a garbage-collection pause, "
            "or another thread holding the GIL (CPU-bound threads, C extensions that keep it). "
            "There is no function of yours to move off the loop: look at thread CPU use, gc pauses "
            "(gc.callbacks) and how many connections become ready together"
        )
    if all(_whose(h) == "runtime" for h in hits):
        times = "" if len(hits) == 1 else f" ({len(hits)} times, longest {longest})"
        if blocked:
            return (
                f"the loop thread was blocked for {_ms(total)}{times} inside {frame}, neither running "
                "nor waiting for a CPU: a blocking call (a lock, a sleep, I/O) run on the loop, or the GIL "
                "held by another thread. Only Python's own code was on the loop's stack: look for a "
                "blocking function passed to the loop as a callback, and for threads that keep the GIL"
            )
        return (
            f"the loop thread did not run for {_ms(total)}{times} inside {frame}: the process may have "
            "been starved of CPU or paused by GC. Only Python's own code (the standard library, asyncio) "
            "was on the loop's stack, no code of yours to move off the loop: look at the machine's load "
            "and at gc pauses (gc.callbacks)"
        )
    return caught + ": move that work off the loop (asyncio.to_thread) or make it async"


def doctor_main(argv: Sequence[str] | None = None) -> int:
    """``ragguard doctor``: diagnose a JSON-lines event file; prints text, or JSON with ``--json``.

    The file is the one a service writes with ``ragguard.monitors.record_events(path)``; the
    default is ``$RAGGUARD_EVENTS_FILE`` or ``./ragguard-events.jsonl``, else, when only that is
    missing, ``./ragguard-report/events.jsonl`` (what ``ragguard demo`` writes). Returns 0 when nothing
    was found, 1 when there are findings, 2 when the file cannot be read or a line of it is not a
    record (the message names the line) or an option is out of range.
    """
    parser = argparse.ArgumentParser(prog="ragguard doctor", description="Explain recent ragguard events.")
    parser.add_argument(
        "--events",
        "-e",
        default=None,
        help=f"JSON-lines event file (default: $RAGGUARD_EVENTS_FILE or ./{DEFAULT_EVENTS_FILE}, else "
        f"./{DEMO_EVENTS_FILE} when only that exists)",
    )
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    parser.add_argument(
        "--grace-s",
        type=float,
        default=1.0,
        help="seconds after a stall a breaker opening is still blamed on it (default 1.0)",
    )
    args = parser.parse_args(argv)
    path = _events_file(args.events)
    try:
        records = load_records(path)
        result = diagnose(records, grace_s=args.grace_s)
    except OSError as exc:
        print(f"ragguard doctor: cannot read events file {path!r}: {exc.strerror or exc}", file=sys.stderr)
        print("  (a service writes it with ragguard.monitors.record_events(path); ragguard demo writes "
              f"{DEMO_EVENTS_FILE}, or events.jsonl in its --out folder)", file=sys.stderr)  # fmt: skip
        return 2
    except InvalidInput as exc:  # a malformed line (named), or a bad --grace-s
        print(f"ragguard doctor: {exc}", file=sys.stderr)
        return 2
    print(result.to_json() if args.json else result.to_text())
    return 0 if result.healthy else 1


def _events_file(given: str | None) -> str:
    """The file ``ragguard doctor`` reads: ``--events``, else ``$RAGGUARD_EVENTS_FILE``, else
    :data:`DEFAULT_EVENTS_FILE`; when that default is missing and the demo's
    :data:`DEMO_EVENTS_FILE` exists, that one (said on stderr)."""
    if given is not None:
        return given
    from_env = os.environ.get("RAGGUARD_EVENTS_FILE")
    if from_env:
        return from_env
    if not os.path.exists(DEFAULT_EVENTS_FILE) and os.path.isfile(DEMO_EVENTS_FILE):
        print(f"ragguard doctor: no ./{DEFAULT_EVENTS_FILE}; reading ./{DEMO_EVENTS_FILE}, which "
              "ragguard demo wrote (--events FILE to choose)", file=sys.stderr)  # fmt: skip
        return DEMO_EVENTS_FILE
    return DEFAULT_EVENTS_FILE


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(doctor_main())


_MISCONFIGURED = "misconfigured:"
"""How a SharedStateDegraded's reason starts when Redis refused ragguard's credentials, ACL
permissions or TLS (``distributed._link``), rather than being unreachable."""


def _redis_problem(reason: str) -> str:
    if reason.startswith(_MISCONFIGURED):
        return "Redis refused ragguard's configuration"
    return "Redis unreachable"
