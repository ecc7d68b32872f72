"""Helpers of the monitor tests: run a coroutine on asyncio (debug off/on) or uvloop; collect events."""

from __future__ import annotations

import asyncio
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
