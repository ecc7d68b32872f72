"""What the recent events mean: correlation rules over stalls, pool trouble and breakers.

Rules, most telling first:

``stall_delayed_pool``         a loop stall overlaps pool waits or exhaustion: the loop was
                               blocked in X, so connection releases were delayed.
``breaker_opened_during_stall`` a breaker opened during a stall or within ``grace_s`` after it:
                               the dependency may be healthy; the latency was ours.
``connection_leak``            a connection held too long, with the stack that acquired it.
``pool_exhausted``             pool exhaustion with no stall around it: the pool is too small for
                               this concurrency, or connections leak.
``loop_stall``                 stalls explained by nothing above, grouped by blocking frame.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import _validate as v
from .._errors import ConfigError
from ._record import Record, default_recorder, load_records, to_record

__all__ = ["DEFAULT_EVENTS_FILE", "Diagnosis", "Finding", "diagnose", "doctor_main"]

DEFAULT_EVENTS_FILE = "ragguard-events.jsonl"
_SLACK_S = 0.05  # events are stamped by different code paths; tolerate this much skew
_OPEN_STATES = {"open", "forced_open"}


@dataclass(frozen=True, slots=True)
class Finding:
    """One conclusion: ``kind`` (a rule name), ``severity`` (critical, warning, info), a one-line
    ``summary``, ``details`` lines (stacks, counts) and the numbers in ``data``."""

    kind: str
    severity: str
    summary: str
    details: tuple[str, ...] = ()
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The findings over ``events`` records spanning ``span_s`` seconds."""

    findings: tuple[Finding, ...]
    events: int
    span_s: float

    @property
    def healthy(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "events": self.events,
            "span_s": round(self.span_s, 6),
            "findings": [asdict(f) | {"details": list(f.details)} for f in self.findings],
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def to_text(self) -> str:
        head = (
            f"ragguard doctor: {len(self.findings)} finding(s) in {self.events} event(s) "
            f"over {self.span_s:.1f} s"
        )
        if not self.findings:
            return head + "\nno stalls, pool exhaustion, leaks or stall-driven breaker trips seen."
        lines = [head]
        for f in self.findings:
            lines.append(f"[{f.severity}] {f.summary}")
            lines.extend(f"    {d}" for d in f.details)
        return "\n".join(lines)


def diagnose(events: Iterable[Any] | None = None, *, grace_s: float = 1.0) -> Diagnosis:
    """Correlate recent events and say what they mean.

    ``events``: event dataclasses or records (dicts as written by the event file); None reads
    the recorder started by :func:`ragguard.monitors.record_events`. ``grace_s`` (seconds, >= 0):
    how long after a stall a breaker opening still counts as caused by it. Raises ConfigError for
    a negative ``grace_s`` and RuntimeError when ``events`` is None and no recorder runs.
    """
    grace_s = v.seconds("grace_s", grace_s, allow_zero=True)
    if events is None:
        recorder = default_recorder()
        if recorder is None:
            raise RuntimeError(
                "no events to diagnose: pass events, or call ragguard.monitors.record_events() first"
            )
        events = recorder.records()
    records = [_as_record(e) for e in events]
    return _Rules(records, float(grace_s)).run()


def _as_record(event: Any) -> Record:
    if isinstance(event, dict):
        return event
    return to_record(event, t=float("nan"), wall=float("nan"))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


class _Rules:
    def __init__(self, records: list[Record], grace_s: float) -> None:
        self.records = records
        self.grace_s = grace_s
        self.by_type: dict[str, list[Record]] = defaultdict(list)
        for r in records:
            self.by_type[r["type"]].append(r)
        self.stalls = self.by_type["LoopStall"]
        self.explained: set[int] = set()

    def run(self) -> Diagnosis:
        findings = [
            *self._stall_pool(),
            *self._breaker_stall(),
            *self._leaks(),
            *self._exhaustion(),
            *self._plain_stalls(),
        ]
        times = [r["t"] for r in self.records if isinstance(r.get("t"), int | float) and r["t"] == r["t"]]
        span = max(times) - min(times) if times else 0.0
        return Diagnosis(tuple(findings), len(self.records), span)

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
                    f"the loop was blocked in {stall['frame']} for {_ms(stall['duration_s'])}; "
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

    def _breaker_stall(self) -> list[Finding]:
        out = []
        for tr in self.by_type["BreakerTransition"]:
            if tr.get("new") not in _OPEN_STATES:
                continue
            at = tr.get("at", tr["t"])
            stall = next(
                (s for s in self.stalls if s["started_at"] - _SLACK_S <= at <= s["at"] + self.grace_s), None
            )
            if stall is None:
                continue
            self.explained.add(id(stall))
            out.append(
                Finding(
                    "breaker_opened_during_stall",
                    "critical",
                    f"breaker {tr['breaker']!r} opened while the loop was stalled in {stall['frame']} "
                    f"({_ms(stall['duration_s'])}): the dependency may be healthy; the latency was ours",
                    tuple(f"at {line}" for line in stall.get("stack", [])[:8]),
                    {"breaker": tr["breaker"], "frame": stall["frame"], "stall_s": stall["duration_s"]},
                )
            )
        return out

    def _leaks(self) -> list[Finding]:
        out = []
        for leak in self.by_type["ConnectionLeak"]:
            stack = tuple(leak.get("stack", []))
            where = (
                f" acquired at {stack[0]}"
                if stack
                else " (turn on track_leaks=True to see where it was acquired)"
            )
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
        groups: dict[str, list[Record]] = defaultdict(list)
        for s in self.stalls:
            if id(s) not in self.explained:
                groups[s["frame"]].append(s)
        out = []
        for frame, hits in sorted(groups.items(), key=lambda kv: -sum(h["duration_s"] for h in kv[1])):
            total = sum(h["duration_s"] for h in hits)
            worst = max(hits, key=lambda h: h["duration_s"])
            out.append(
                Finding(
                    "loop_stall",
                    "warning",
                    f"the loop was blocked {len(hits)} time(s) in {frame} ({_ms(total)} in all, longest "
                    f"{_ms(worst['duration_s'])}): move that work off the loop "
                    "(asyncio.to_thread) or make it async",
                    tuple(f"at {line}" for line in worst.get("stack", [])[:8]),
                    {"frame": frame, "count": len(hits), "total_s": total, "max_s": worst["duration_s"]},
                )
            )
        return out


def doctor_main(argv: Sequence[str] | None = None) -> int:
    """``ragguard doctor``: diagnose a JSON-lines event file; prints text, or JSON with ``--json``.

    The file is the one a service writes with ``ragguard.monitors.record_events(path)``; the
    default is ``$RAGGUARD_EVENTS_FILE`` or ``./ragguard-events.jsonl``. Returns 0 when nothing
    was found, 1 when there are findings, 2 when the file cannot be read.
    """
    parser = argparse.ArgumentParser(prog="ragguard doctor", description="Explain recent ragguard events.")
    parser.add_argument(
        "--events",
        "-e",
        default=os.environ.get("RAGGUARD_EVENTS_FILE", DEFAULT_EVENTS_FILE),
        help="JSON-lines event file (default: $RAGGUARD_EVENTS_FILE or ./%(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    parser.add_argument(
        "--grace-s",
        type=float,
        default=1.0,
        help="seconds after a stall a breaker opening is still blamed on it (default 1.0)",
    )
    args = parser.parse_args(argv)
    try:
        records = load_records(args.events)
        result = diagnose(records, grace_s=args.grace_s)
    except OSError as exc:
        print(
            f"ragguard doctor: cannot read events file {args.events!r}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        print("  (a service writes it with ragguard.monitors.record_events(path))", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"ragguard doctor: {exc}", file=sys.stderr)
        return 2
    print(result.to_json() if args.json else result.to_text())
    return 0 if result.healthy else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(doctor_main())
