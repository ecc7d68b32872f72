"""The process's default registry, as seen from below :mod:`ragguard.guard`.

:mod:`ragguard.guard` installs its ``default_guard`` here when it is imported (``import ragguard``
does), so the modules the Guard is built from (:mod:`ragguard.deadline` for the default clock,
:mod:`ragguard.status` and :mod:`ragguard.metrics` for the default registry) read it without
importing the Guard: the import graph stays a tree below it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["default_registry", "install"]

_lookup: Callable[[], Any] | None = None


def install(lookup: Callable[[], Any]) -> None:
    """Make ``lookup()`` the way to the default registry (called once, by :mod:`ragguard.guard`)."""
    global _lookup
    _lookup = lookup


def default_registry() -> Any:
    """The default :class:`~ragguard.Guard` (built on first use, as ``ragguard.default_guard()``)."""
    assert _lookup is not None, "ragguard/__init__.py imports ragguard.guard, which installs it"
    return _lookup()
