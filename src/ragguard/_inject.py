"""The process-wide injection point of guarded calls, used by :mod:`ragguard.chaos`.

``active`` is None unless a chaos injector is installed for the whole process. Each Guard builds
its chains with a chaos layer only while an injector applies to it (its own, or this one), so with
none a guarded call pays nothing. Installing or removing the process-wide injector makes every Guard
rebuild its chains on their next call (``epoch`` changes). An injector wraps the innermost call of a
stage::

    async def __call__(self, stage: str, tenant: str, call: Callable[[], Awaitable[T]],
                       *, stream: bool = False) -> T

``stream=True`` when ``call`` opens a stream (up to its first item): faults that rewrite a result
must leave it alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = ["Injector", "active", "epoch", "install", "uninstall"]


class Injector(Protocol):
    async def __call__(
        self, stage: str, tenant: str, call: Callable[[], Awaitable[Any]], *, stream: bool = False
    ) -> Any: ...


active: Injector | None = None
epoch = 0
"""Bumped whenever ``active`` changes: compiled chains older than it are rebuilt."""


def install(injector: Injector) -> None:
    """Make ``injector`` wrap every guarded attempt in this process (replaces any other)."""
    global active, epoch
    if active is not injector:
        active = injector
        epoch += 1


def uninstall(injector: Injector | None = None) -> None:
    """Remove the installed injector (only if it is ``injector``, when given)."""
    global active, epoch
    if active is not None and (injector is None or active is injector):
        active = None
        epoch += 1
