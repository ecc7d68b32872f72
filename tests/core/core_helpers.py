"""Helpers shared by the core tests (imported as ``core_helpers``)."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import ragguard
from ragguard.testing import EventRecorder

Recorder = EventRecorder  # the fixtures' ``events``: ragguard.testing's recorder


async def no_sleep(seconds: float) -> None:
    """A backoff sleep that takes no time (and is still a checkpoint)."""
    await anyio.sleep(0)


class SleepLog:
    """An injected backoff sleep: records each wait and advances ``clock`` (if given) by it."""

    def __init__(self, clock: ragguard.FakeClock | None = None) -> None:
        self.waits: list[float] = []
        self.clock = clock

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self.clock is not None:
            self.clock.advance(seconds)
        await anyio.sleep(0)


class _JumpingSelector(selectors.DefaultSelector):
    """A selector that, instead of waiting ``timeout`` seconds for I/O, moves its loop's clock on
    by ``timeout`` (and still waits when there is no timer: a thread may wake the loop)."""

    def __init__(self, advance: Callable[[float], None]) -> None:
        super().__init__()
        self._advance = advance

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            return super().select(None)
        ready = super().select(0)
        if not ready and timeout > 0:
            self._advance(timeout)
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on virtual time: ``loop.time()`` stands still while callbacks run and jumps
    to the next timer when the loop would otherwise wait. Timers fire in their order and at their
    time whatever the machine's load: a test of timer logic on it cannot be raced by a CPU stall."""

    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(_JumpingSelector(self._advance))

    def time(self) -> float:
        return self._now

    def _advance(self, seconds: float) -> None:
        self._now += seconds


def virtual_time_backends() -> list[Any]:
    """``anyio_backend`` values for a test on virtual time: asyncio on :class:`VirtualTimeLoop`,
    trio with a ``MockClock`` that jumps to the next deadline as soon as every task waits."""
    from trio.testing import MockClock

    return [
        pytest.param(("asyncio", {"loop_factory": VirtualTimeLoop}), id="asyncio-virtual-time"),
        pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-virtual-time"),
    ]
