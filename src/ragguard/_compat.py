"""The private asyncio names ragguard uses, in one place, each with a public equivalent.

The attempt-timeout fast path needs the running loop and the current task without the frames (and,
for the loop, the ``getpid()``) of the public calls; ``tests/core/test_compat.py`` checks each name
against its public counterpart on the running Python, so a Python release that changes them fails
a test instead of a user's call.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from threading import get_ident
from typing import Any

__all__ = ["PY311", "current_task", "running_loop"]

PY311 = sys.version_info < (3, 12)
"""3.11: ``asyncio.wait_for`` can swallow a cancellation (fixed in 3.12, cpython gh-86296)."""

_get_running_loop: Callable[[], asyncio.AbstractEventLoop | None] = asyncio._get_running_loop
_loop_last: Any = None  # the loop running_loop() found last, if it records its thread (_thread_id)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The running asyncio loop, or None (under trio, or outside a loop); public:
    ``asyncio.get_running_loop``.

    ``asyncio._get_running_loop`` calls ``getpid()`` on every call (a system call, about 200 ns
    here: more than the rest of a guarded call's timer). The loop found last is kept, and is the
    running one exactly while it runs in this thread: an asyncio loop records the thread running
    it (``_thread_id``, set by ``run_forever`` and cleared when it stops), and a thread runs at most
    one loop at a time. Anything else (another thread, another loop, a loop without the record,
    such as uvloop's) takes the public path; a forked child forgets the parent's loop.
    """
    loop = _loop_last
    if loop is not None and loop._thread_id == get_ident():
        return loop  # type: ignore[no-any-return]
    return _find_running_loop()


def _forget_loop() -> None:
    global _loop_last
    _loop_last = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_loop)


def _find_running_loop() -> asyncio.AbstractEventLoop | None:
    global _loop_last
    loop = _get_running_loop()
    if loop is not None and getattr(loop, "_thread_id", None) == get_ident():
        _loop_last = loop
    return loop


if sys.version_info >= (3, 12):
    current_task: Callable[[Any], Any] = asyncio.current_task  # C-accelerated from 3.12
else:  # pragma: no cover - 3.11's current_task is Python code around this dict
    current_task = asyncio.tasks._current_tasks.get  # type: ignore[attr-defined]
"""``current_task(loop)``: the task running on ``loop``, or None; public: ``asyncio.current_task``."""
