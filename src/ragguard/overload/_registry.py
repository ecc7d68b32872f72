"""Per-stage state of the overload layers, kept beside the Guard's :class:`~ragguard.layers.Stage`.

A stage's limiter, throttle and hedge state are shared by every function decorated with the
stage's name, as its breaker is; they live in a weak map keyed by the Stage object (forgotten with
it), built on first use from the stage's policy.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ..layers import Stage

__all__ = ["shared", "stage_parts"]

T = TypeVar("T")

_parts: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def shared(stage: Stage, key: str, make: Callable[[], T]) -> T:
    """The ``key`` part of ``stage`` (``"limiter"``, ``"throttle"``, ``"hedge"``), made once."""
    parts = _parts.get(stage)
    if parts is None:
        parts = _parts[stage] = {}
    got = parts.get(key)
    if got is None:
        got = parts[key] = make()
    return got


def stage_parts(stage: Stage) -> dict[str, Any]:
    """The overload parts ``stage`` has built so far (key -> object)."""
    return dict(_parts.get(stage) or {})
