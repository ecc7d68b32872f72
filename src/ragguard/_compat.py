"""The private asyncio names ragguard uses, in one place, each with a public equivalent.

The attempt-timeout fast path needs the running loop and the current task without the frames of
the public calls; ``tests/core/test_compat.py`` checks each name against its public counterpart on
the running Python, so a Python release that changes them fails a test instead of a user's call.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["PY311", "current_task", "running_loop"]

PY311 = sys.version_info < (3, 12)
"""3.11: ``asyncio.wait_for`` can swallow a cancellation (fixed in 3.12, cpython gh-86296)."""

running_loop: Callable[[], asyncio.AbstractEventLoop | None] = asyncio._get_running_loop
"""The running asyncio loop, or None (under trio, or outside a loop); public: ``get_running_loop``."""

if sys.version_info >= (3, 12):
    current_task: Callable[[Any], Any] = asyncio.current_task  # C-accelerated from 3.12
else:  # pragma: no cover - 3.11's current_task is Python code around this dict
    current_task = asyncio.tasks._current_tasks.get  # type: ignore[attr-defined]
"""``current_task(loop)``: the task running on ``loop``, or None; public: ``asyncio.current_task``."""
