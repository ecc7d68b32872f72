"""Helpers shared by the core tests (imported as ``core_helpers``)."""

from __future__ import annotations

from typing import Any

import anyio

import ragguard


class Recorder:
    """Collects the events of the global bus (delivered on a later loop iteration)."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def __call__(self, event: Any) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    async def settle(self) -> None:
        for _ in range(5):
            await anyio.sleep(0)


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
