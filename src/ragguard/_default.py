"""The process's default Guard, held below the modules that read it.

:func:`ragguard.default_guard` makes it on first use and :func:`ragguard.configure` replaces it
(both in :mod:`ragguard._guard`); :mod:`ragguard.testing` installs and restores one. What is built
below the Guard reads it here without importing the Guard: :mod:`ragguard._deadline` takes its
clock (:func:`clock`).
"""

from __future__ import annotations

from typing import Any

from ._clock import Clock, monotonic

__all__ = ["clock", "guard"]

guard: Any = None
"""The default :class:`~ragguard.Guard`, or None until one is made (``ragguard.default_guard()``)."""


def clock() -> Clock:
    """The default Guard's clock: the monotonic clock while none is made (the one it is built on)."""
    current = guard
    return monotonic if current is None else current.clock
