"""Recent events, kept in memory and optionally in a JSON-lines file that ``ragguard doctor`` reads.

One record per event: ``{"type": <class name>, "t": <monotonic s>, "wall": <unix s>, ...fields}``.
``t`` is the event's own time (``at``) when it has one, else the time it was recorded, so every
record of one process shares one time base and the diagnosis can overlap intervals.
"""

from __future__ import annotations

import dataclasses
import json
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

__all__ = ["DEFAULT_KINDS", "EventRecorder", "default_recorder", "load_records", "record_events", "to_record"]

DEFAULT_KINDS: frozenset[str] = frozenset(
    {
        "LoopStall",
        "PoolExhausted",
        "ConnectionLeak",
        "BreakerTransition",
        "QuotaRejected",
        "RetryBudgetExhausted",
        "FallbackServed",
    }
)
"""Event types recorded by default: the rare, telling ones (not every CallOutcome)."""

Record = dict[str, Any]
_default: EventRecorder | None = None


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
    ``max_bytes`` when the file grows past it, it is renamed to ``<path>.1`` (one generation
    kept) and a new one started. ``clock`` monotonic seconds. Raises ConfigError for
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

    def start(self) -> EventRecorder:
        """Subscribe to the bus; returns self. Starting twice is a no-op."""
        if self._unsubscribe is None:
            self._unsubscribe = self._bus.subscribe(self.record)
        return self

    def close(self) -> None:
        """Unsubscribe (the records stay readable)."""
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()

    def __enter__(self) -> EventRecorder:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def record(self, event: Any) -> None:
        """Keep ``event`` (the bus listener); events of other kinds are ignored."""
        if self.kinds is not None and type(event).__name__ not in self.kinds:
            return
        if not dataclasses.is_dataclass(event):
            return
        rec = to_record(event, t=self._clock(), wall=self._wall())
        with self._lock:
            self._records.append(rec)
            if self.path is not None:
                self._append(rec)

    def records(self) -> list[Record]:
        """The kept records, oldest first."""
        with self._lock:
            return list(self._records)

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


def record_events(
    path: str | os.PathLike[str] | None = None,
    *,
    maxlen: int = 2048,
    kinds: Iterable[str] | None = DEFAULT_KINDS,
) -> EventRecorder:
    """Start the process's default recorder (replacing a previous one); ``diagnose()`` reads it."""
    global _default
    if _default is not None:
        _default.close()
    _default = EventRecorder(maxlen=maxlen, path=path, kinds=kinds).start()
    return _default


def default_recorder() -> EventRecorder | None:
    """The recorder started by :func:`record_events`, or None."""
    return _default


def load_records(path: str | os.PathLike[str]) -> list[Record]:
    """Records of a JSON-lines event file (and its ``.1`` generation), oldest first.

    Skips lines that are not JSON objects with a ``type``. Raises OSError when ``path`` is missing.
    """
    p = Path(path)
    out: list[Record] = []
    older = p.with_name(p.name + ".1")
    for f in (older, p) if older.exists() else (p,):
        out.extend(_parse(f.read_text(encoding="utf-8").splitlines()))
    return out


def _parse(lines: Iterable[str]) -> Iterator[Record]:
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("type"), str):
            yield rec
