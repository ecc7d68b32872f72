"""The injection point of guarded calls, used by :mod:`ragguard.chaos`.

``active`` is None unless a chaos injector is installed; a guarded call checks it once per
attempt and otherwise pays nothing. An injector wraps the innermost call of a stage::

    async def __call__(self, stage: str, tenant: str, call: Callable[[], Awaitable[T]]) -> T
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = ["Injector", "active", "install", "uninstall"]


class Injector(Protocol):
    async def __call__(self, stage: str, tenant: str, call: Callable[[], Awaitable[Any]]) -> Any: ...


active: Injector | None = None


def install(injector: Injector) -> None:
    """Make ``injector`` wrap every guarded attempt in this process (replaces any other)."""
    global active
    active = injector


def uninstall(injector: Injector | None = None) -> None:
    """Remove the installed injector (only if it is ``injector``, when given)."""
    global active
    if injector is None or active is injector:
        active = None
