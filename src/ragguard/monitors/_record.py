"""Recent events, kept in memory and optionally in a JSON-lines file that ``ragguard doctor`` reads.

One record per event: ``{"type": <class name>, "t": <monotonic s>, "wall": <unix s>, ...fields}``.
``t`` is the event's own time (``at``) when it has one, else the time it was recorded, so every
record of one process shares one time base and the diagnosis can overlap intervals.

The frequent events (every stage completion, breaker call and breaker rejection) are counted, not
kept one by one: a ``Tally`` record holds the counts since the recorder started, written to the
file at most once a second while they change and when the recorder closes, so the diagnosis can
say what share of a stage's answers a fallback served::

    {"type": "Tally", "t": ..., "wall": ..., "since": <monotonic s>,
     "stages": {stage: {outcome: n}}, "calls": {breaker: {outcome: n}}, "rejected": {breaker: n},
     "budget": {stage: {"calls": n, "left_s": s, "spent_s": s, "fallback": n, "deadline": n}}}

``budget`` says where the requests' deadlines went, stage by stage: of a stage's completions made
under a deadline, how many (``calls``), the seconds their deadlines had left when they started
(``left_s``, summed), the seconds they spent (``spent_s``, summed), how many a fallback answered
and how many ended with :class:`~ragguard.DeadlineExceeded` (``deadline``).

A breaker's opening says what its calls did since its previous transition (the last
:data:`_MAX_TRIP_OUTCOMES` slow or failed ones), so the diagnosis can tell a trip by slowness or
timeouts from one by refused connections::

    {"type": "BreakerTransition", ..., "new": "open", "reason": "failure rate 100.0% >= 50.0%",
     "causes": {"connection": 7, "timeout": 1}, "errors": {"ConnectionRefusedError": 7, "TimeoutError": 1}}

``causes`` counts ``slow`` (a slow success), ``timeout``, ``connection``, ``out_of_memory`` and
``error`` (any other counted failure); ``errors`` the failures' exception class names;
``latencies`` the slow and timed-out calls among them as ``[ended_at, duration_s]`` pairs (the
recorder's clock when their outcome arrived, seconds), so the diagnosis can weigh a loop stall
against how long those calls took.

A process that runs several experiments in one file (``ragguard demo``: unguarded, then
guarded) marks where each begins with :meth:`EventRecorder.mark_run`, a record
``{"type": "RunStarted", "t": ..., "wall": ..., "run": <name>}``; the diagnosis then speaks of
each run apart.

The file is complete once the recorder is closed: ``close()``, the end of a ``with`` block, or
interpreter exit (a recorder with a path registers its ``close`` with :mod:`atexit`).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from .. import _validate as v
from .. import events
from .._clock import Clock, monotonic
from .._errors import ConfigError, InvalidInput
from ..breakers._classify import is_connection_error, is_out_of_memory, is_timeout

__all__ = [
    "DEFAULT_KINDS",
    "TALLIED_KINDS",
    "EventRecorder",
    "check_record",
    "default_recorder",
    "load_records",
    "record_events",
    "to_record",
]

DEFAULT_KINDS: frozenset[str] = frozenset(
    {
        "LoopStall",
        "PoolExhausted",
        "ConnectionLeak",
        "BreakerTransition",
        "QuotaRejected",
        "RetryBudgetExhausted",
        "FallbackServed",
        "FailedOver",
        "SharedStateDegraded",
        "SharedStateRestored",
    }
)
"""Event types recorded by default: the rare, telling ones (not every CallOutcome), among them
ragguard's own switches between Redis and local state and a model group's failovers."""

TALLIED_KINDS: frozenset[str] = frozenset({"StageCompleted", "CallOutcome", "CallRejected"})
"""Event types counted in the ``Tally`` record (one per call: too many to keep one by one)."""

TALLY_EVERY_S = 1.0
_MAX_TRIP_OUTCOMES = 100  # slow or failed calls a breaker's opening is explained by, at most
_OPEN_STATES = frozenset({"open", "forced_open"})
_MAX_TALLY_KEYS = 1000  # stage or breaker names counted apart; later ones are counted as "other"

Record = dict[str, Any]
_default: EventRecorder | None = None
_UNSEEN: Any = object()


def to_record(event: Any, *, t: float, wall: float) -> Record:
    """A JSON-ready dict of a dataclass event (tuples become lists)."""
    if not dataclasses.is_dataclass(event) or isinstance(event, type):
        raise TypeError(f"not an event dataclass: {event!r}")
    fields = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    at = fields.get("at")
    rec: Record = {"type": type(event).__name__, "t": at if isinstance(at, float | int) else t, "wall": wall}
    for key, value in fields.items():
        rec[key] = list(value) if isinstance(value, tuple) else value
    return rec


class EventRecorder:
    """Keeps the last ``maxlen`` events of ``bus`` in memory and, given ``path``, appends them to a file.

    ``kinds`` the event class names kept (default :data:`DEFAULT_KINDS`; None keeps all);
    events of :data:`TALLIED_KINDS` are also counted in a ``Tally`` record (see the module
    docstring). ``max_bytes`` when the file grows past it, it is renamed to ``<path>.1`` (one
    generation kept) and a new one started. ``clock`` monotonic seconds. Raises ConfigError for
    ``maxlen < 1`` or ``max_bytes < 1024``.
    """

    def __init__(
        self,
        *,
        maxlen: int = 2048,
        path: str | os.PathLike[str] | None = None,
        kinds: Iterable[str] | None = DEFAULT_KINDS,
        max_bytes: int = 16 * 1024 * 1024,
        bus: events.EventBus | None = None,
        clock: Clock = monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        v.count("maxlen", maxlen, 1)
        v.size("max_bytes", max_bytes, low=1024)
        self.path = None if path is None else Path(path)
        self.kinds = None if kinds is None else frozenset(kinds)
        self.max_bytes = max_bytes
        self._records: deque[Record] = deque(maxlen=maxlen)
        self._bus = events.bus if bus is None else bus
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._unsubscribe: Callable[[], None] | None = None
        self._since = clock()
        self._stages: dict[str, dict[str, int]] = {}
        self._calls: dict[str, dict[str, int]] = {}
        self._rejected: dict[str, int] = {}
        self._budget: dict[str, dict[str, float]] = {}
        self._tally_changed = False
        self._tally_written = float("-inf")
        self._tallied: dict[type, Any] = {}
        self._bad_calls: dict[str, deque[_BadCall]] = {}

    def start(self) -> EventRecorder:
        """Subscribe to the bus; returns self. Starting twice is a no-op.

        With a ``path``, :meth:`close` is also registered to run at interpreter exit, so a
        program that never closes the recorder still leaves a complete file.
        """
        if self._unsubscribe is None:
            self._unsubscribe = self._bus.subscribe(self.record)
            if self.path is not None:
                atexit.register(self.close)
        return self

    def close(self) -> None:
        """Unsubscribe and write the last counts (the records stay readable). Closing twice,
        or again at interpreter exit, writes nothing more."""
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()
            atexit.unregister(self.close)
        with self._lock:
            if self._tally_changed and self.path is not None:
                self._append(self._tally_record())
                self._tally_changed = False

    def __enter__(self) -> EventRecorder:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def record(self, event: Any) -> None:
        """Keep ``event`` (the bus listener), count it when it is of :data:`TALLIED_KINDS`;
        events of other kinds are ignored."""
        kind = type(event)
        name = kind.__name__
        tallied = self._tallied.get(kind, _UNSEEN)
        if tallied is _UNSEEN:  # by class name along the MRO, so BreakerCallOutcome counts as a call
            tallied = self._tallied[kind] = next(
                (c.__name__ for c in kind.__mro__ if c.__name__ in TALLIED_KINDS), None
            )
        if tallied is not None:
            self._count(tallied, event)
        trip: Record | None = None
        if name == "BreakerTransition":
            trip = self._trip_outcomes(event)
        if self.kinds is not None and name not in self.kinds:
            return
        if not dataclasses.is_dataclass(event):
            return
        rec = to_record(event, t=self._clock(), wall=self._wall())
        if trip:
            rec.update(trip)
        with self._lock:
            self._records.append(rec)
            if self.path is not None:
                self._append(rec)

    def mark_run(self, run: str) -> None:
        """Record that run ``run`` (a non-empty name, at most 100 characters) begins now: the
        diagnosis reports the records from here to the next mark as that run's. Raises
        ConfigError for an empty or too long name."""
        if not isinstance(run, str) or not run.strip() or len(run) > 100:
            raise ConfigError(f"run must be a name of 1 to 100 characters, got {v.shown(run)}", field="run")
        rec: Record = {"type": "RunStarted", "t": self._clock(), "wall": self._wall(), "run": run}
        with self._lock:
            self._records.append(rec)
            if self.path is not None:
                self._append(rec)

    def records(self) -> list[Record]:
        """The kept records, oldest first, then the current ``Tally`` when anything was counted."""
        with self._lock:
            out = list(self._records)
            if self._stages or self._calls or self._rejected:
                out.append(self._tally_record())
            return out

    def _trip_outcomes(self, transition: Any) -> Record | None:
        """What breaker ``transition.breaker``'s calls did since its last transition, as the
        ``causes`` and ``errors`` of the record when it opens; forgotten at every transition."""
        with self._lock:
            seen = self._bad_calls.pop(str(getattr(transition, "breaker", "")), None)
        if not seen or getattr(transition, "new", None) not in _OPEN_STATES:
            return None
        causes: dict[str, int] = {}
        errors: dict[str, int] = {}
        latencies: list[list[float]] = []
        for cause, error, ended_at, duration_s in seen:
            causes[cause] = causes.get(cause, 0) + 1
            if error is not None:
                errors[error] = errors.get(error, 0) + 1
            if cause in _LATENCY_CAUSES and duration_s is not None:
                latencies.append([round(ended_at, 6), round(duration_s, 6)])
        return {"causes": causes, "errors": errors, "latencies": latencies}

    def _count(self, name: str, event: Any) -> None:
        outcome = str(getattr(event, "outcome", ""))
        bad: _BadCall | None = None
        if name == "CallOutcome" and outcome in _BAD_OUTCOMES:
            duration = getattr(event, "duration_s", None)
            known = float(duration) if isinstance(duration, int | float) and math.isfinite(duration) else None
            bad = (*_bad_call(outcome, event), self._clock(), known)
        with self._lock:
            if bad is not None:
                breaker = str(getattr(event, "breaker", ""))
                ring = self._bad_calls.get(breaker)
                if ring is None:
                    ring = deque(maxlen=_MAX_TRIP_OUTCOMES)
                    self._bad_calls[_key(self._bad_calls, breaker)] = ring
                ring.append(bad)
            if name == "CallRejected":
                key = _key(self._rejected, str(getattr(event, "breaker", "")))
                self._rejected[key] = self._rejected.get(key, 0) + 1
            else:
                table = self._stages if name == "StageCompleted" else self._calls
                owner = str(getattr(event, "stage" if name == "StageCompleted" else "breaker", ""))
                counts = table.setdefault(_key(table, owner), {})
                counts[outcome] = counts.get(outcome, 0) + 1
                if name == "StageCompleted":
                    self._spent(owner, outcome, event)
            self._tally_changed = True
            if self.path is not None:
                now = self._clock()
                if now - self._tally_written >= TALLY_EVERY_S:
                    self._tally_written = now
                    self._tally_changed = False
                    self._append(self._tally_record())

    def _spent(self, stage: str, outcome: str, event: Any) -> None:
        """Count what a stage completion under a deadline spent of it (the lock is held)."""
        left: Any = getattr(event, "deadline_s", None)
        took: Any = getattr(event, "duration_s", None)
        if not (_finite_number(left) and _finite_number(took)):
            return
        budget = self._budget.get(stage)
        if budget is None:
            budget = self._budget[_key(self._budget, stage)] = {
                "calls": 0, "left_s": 0.0, "spent_s": 0.0, "fallback": 0, "deadline": 0,
            }  # fmt: skip
        budget["calls"] += 1
        budget["left_s"] += left
        budget["spent_s"] += took
        if outcome == "fallback":
            budget["fallback"] += 1
        elif getattr(event, "error", "") == "DeadlineExceeded":
            budget["deadline"] += 1

    def _tally_record(self) -> Record:
        return {
            "type": "Tally",
            "t": self._clock(),
            "wall": self._wall(),
            "since": self._since,
            "stages": {k: dict(v) for k, v in self._stages.items()},
            "calls": {k: dict(v) for k, v in self._calls.items()},
            "rejected": dict(self._rejected),
            "budget": {k: dict(v) for k, v in self._budget.items()},
        }

    def _append(self, rec: Record) -> None:
        assert self.path is not None
        line = json.dumps(rec, separators=(",", ":"), default=str) + "\n"
        try:
            if self.path.exists() and self.path.stat().st_size + len(line) > self.max_bytes:
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line)
        except OSError:
            pass  # the in-memory ring still has it; a full disk must not break the service


_BAD_OUTCOMES = frozenset({"failure", "slow_success", "slow_failure"})
_LATENCY_CAUSES = frozenset({"slow", "timeout"})
_BadCall = tuple[str, str | None, float, float | None]  # cause, error class, ended at, duration_s
_NAME_CAUSES = (
    ("Timeout", "timeout"), ("TooSlow", "timeout"), ("Connect", "connection"), ("Refused", "connection"),
    ("Unavailable", "connection"), ("Memory", "out_of_memory"),
)  # fmt: skip


def _bad_call(outcome: str, event: Any) -> tuple[str, str | None]:
    """(cause, error class name) of a slow or failed call: ``slow`` for a slow success, else
    what its exception says (:func:`~ragguard.breakers.is_timeout`...), or its class name when
    the event carries only that."""
    error = getattr(event, "error", None)
    error = error if isinstance(error, str) else None
    if outcome == "slow_success":
        return "slow", None
    exc = getattr(event, "exception", None)
    if isinstance(exc, BaseException):
        if is_timeout(exc):
            return "timeout", error
        if is_connection_error(exc):
            return "connection", error
        if is_out_of_memory(exc):
            return "out_of_memory", error
        return "error", error
    for part, cause in _NAME_CAUSES:
        if error is not None and part in error:
            return cause, error
    return "error", error


def record_events(
    path: str | os.PathLike[str] | None = None,
    *,
    maxlen: int = 2048,
    kinds: Iterable[str] | None = DEFAULT_KINDS,
) -> EventRecorder:
    """Start the process's default recorder (replacing and closing a previous one);
    ``diagnose()`` reads it.

    The file ``path`` is complete when the recorder is closed: call ``close()``, or use it as a
    context manager (``with record_events(path):``); otherwise it is closed at interpreter exit.
    """
    global _default
    if _default is not None:
        _default.close()
    _default = EventRecorder(maxlen=maxlen, path=path, kinds=kinds).start()
    return _default


def default_recorder() -> EventRecorder | None:
    """The recorder started by :func:`record_events`, or None."""
    return _default


def _finite_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _key(table: dict[str, Any], name: str) -> str:
    return name if name in table or len(table) < _MAX_TALLY_KEYS else "other"


def load_records(path: str | os.PathLike[str]) -> list[Record]:
    """Records of a JSON-lines event file (and its ``.1`` generation), oldest first.

    Blank lines are skipped, and so is an unfinished last line (no newline yet: the service is
    writing it). Raises OSError when ``path`` cannot be read, and
    :class:`~ragguard.InvalidInput` naming the file and line for a line that is not UTF-8, not a
    JSON object, or a record without a field its type needs (:func:`check_record`).
    """
    p = Path(path)
    out: list[Record] = []
    older = p.with_name(p.name + ".1")
    for f in (older, p) if older.exists() else (p,):
        out.extend(_parse(f, f.read_bytes()))
    return out


def _parse(source: Path, data: bytes) -> Iterator[Record]:
    lines = data.split(b"\n")
    unfinished = len(lines) - 1 if lines[-1] else -1  # index of a last line with no newline
    for index, raw in enumerate(lines):
        if not raw.strip():
            continue
        where = f"{v.bounded(str(source), 200)}, line {index + 1}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = f"byte {exc.start + 1} of the line is {raw[exc.start]:#04x}"
            raise InvalidInput(f"{where}: not UTF-8 ({bad})") from None
        try:
            rec = json.loads(text)
        except ValueError:
            if index == unfinished:
                continue
            raise InvalidInput(f"{where}: not a JSON record: {v.shown(text)}") from None
        problem = check_record(rec)
        if problem is not None:
            raise InvalidInput(f"{where}: {problem}")
        yield rec


_NUMBER = "number"
_SCHEMA: dict[str, dict[str, Any]] = {
    "LoopStall": {"duration_s": _NUMBER, "started_at": _NUMBER, "at": _NUMBER, "frame": str},
    "PoolExhausted": {"pool": str, "reason": str, "in_use": _NUMBER, "max_connections": _NUMBER,
                      "waiting": _NUMBER, "wait_s": _NUMBER, "started_at": _NUMBER, "at": _NUMBER},
    "ConnectionLeak": {"pool": str, "held_s": _NUMBER},
    "BreakerTransition": {"breaker": str, "old": str, "new": str},
    "QuotaRejected": {"tenant": str, "reason": str, "retry_after_s": _NUMBER},
    "FallbackServed": {"stage": str, "fallback": str, "cause": str},
    "FailedOver": {"group": str, "deployment": str, "reason": str, "to": str},
    "RetryBudgetExhausted": {"stage": str},
    "SharedStateDegraded": {"component": str, "reason": str},
    "SharedStateRestored": {"component": str, "degraded_for_s": _NUMBER},
    "Tally": {"since": _NUMBER, "stages": dict, "calls": dict, "rejected": dict},
    "RunStarted": {"run": str},
}  # fmt: skip


def check_record(rec: Any) -> str | None:
    """What is wrong with record ``rec`` for the diagnosis, or None when nothing is.

    Every record is a JSON object with a string ``type`` and a number ``t``; the types the
    diagnosis reads also need their fields (a ``LoopStall`` its ``duration_s``, ``started_at``,
    ``at`` and ``frame``...). Records of other types pass with only ``type`` and ``t``.
    """
    if not isinstance(rec, dict):
        return f"not a JSON object but {type(rec).__name__}"
    kind = rec.get("type")
    if not isinstance(kind, str):
        return 'no "type" string'
    for name, want in (("t", _NUMBER), *_SCHEMA.get(kind, {}).items()):
        if name not in rec:
            return f"a {v.bounded(kind, 40)} record without its {name!r} field"
        got = rec[name]
        if want is _NUMBER:
            ok = isinstance(got, int | float) and not isinstance(got, bool)
        else:
            ok = isinstance(got, want)
        if not ok:
            what = "a number" if want is _NUMBER else f"a {want.__name__}"
            return f"a {v.bounded(kind, 40)} record whose {name!r} is not {what}: {v.shown(got)}"
    return None
