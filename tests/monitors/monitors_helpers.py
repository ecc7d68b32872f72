"""Helpers of the monitor tests: run a coroutine on asyncio (debug off/on) or uvloop; collect events."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from ragguard import events

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


def waited_for_cpu_s() -> float:
    """Seconds the calling thread has spent runnable but waiting for a CPU (Linux's
    ``/proc/thread-self/schedstat``; 0.0 where it is missing): how much longer than its own work a
    stretch of the loop thread took on a loaded machine."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


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
