"""Helpers of the monitor tests: run a coroutine on asyncio (debug off/on) or uvloop; collect events."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from ragguard import events
from ragguard.monitors import StallDetector

LOOPS = ["asyncio", "asyncio-debug", "uvloop"]


def run_on(kind: str, main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run ``main()`` to completion on a fresh loop of ``kind``."""
    if kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        return uvloop.run(main())
    return asyncio.run(main(), debug=(kind == "asyncio-debug"))


class Collected(list[Any]):
    """Events received on a private bus."""

    def __init__(self) -> None:
        super().__init__()
        self.bus = events.EventBus()
        self.bus.subscribe(self.append)

    def of(self, cls: type) -> list[Any]:
        return [e for e in self if isinstance(e, cls)]


def waited_for_cpu_s(thread: threading.Thread | None = None) -> float:
    """Seconds ``thread`` (default: the calling one) has spent runnable but waiting for a CPU
    (Linux's ``schedstat``; 0.0 where it is missing, or once the thread ended): how much longer
    than its own work a stretch of it took on a loaded machine."""
    task = "thread-self" if thread is None else f"self/task/{thread.native_id}"
    path = f"/proc/{task}/schedstat"
    try:
        with open(path) as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class Waits:
    """What the loop thread and a stall detector's watchdog thread waited for a CPU over a stretch
    (see :func:`waited_for_cpu_s`): ``mark()`` on the loop thread at its start and at its end,
    while the detector runs. A loop that waited comes back late (a stall can outlast the blocking
    code by that much); a watchdog that waited looks late (a stall in idle mode can be caught that
    much later than one check interval into it)."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, float]] = []

    def mark(self, detector: StallDetector) -> None:
        dog = detector._thread
        self.marks.append((waited_for_cpu_s(), 0.0 if dog is None else waited_for_cpu_s(dog)))

    @property
    def loop_s(self) -> float:
        return self.marks[-1][0] - self.marks[0][0]

    @property
    def watchdog_s(self) -> float:
        return self.marks[-1][1] - self.marks[0][1]


class Span:
    """Times a blocking stretch as the loop thread really spent it: ``with Span() as s: ...``
    gives ``s.started``, ``s.ended`` (``time.monotonic``, the detector's clock) and
    ``s.seconds``; a ``time.sleep`` on a loaded machine overshoots by what the scheduler adds."""

    started = ended = 0.0

    def __enter__(self) -> Span:
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ended = time.monotonic()

    @property
    def seconds(self) -> float:
        return self.ended - self.started
