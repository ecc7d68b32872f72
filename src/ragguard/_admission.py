"""The answer that admission must be awaited, shared by the layers' gates and the quota backends.

A gate's ``enter`` (:mod:`ragguard.pipeline`) returns :data:`WAIT` when the call must ``await
enter_async()``; a quota backend's ``admit_now`` (:mod:`ragguard.quotas`) returns it when the request
must ``await acquire()``. One object, so the quota layer hands its backend's answer on as its own.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WAIT"]

WAIT: Any = object()
"""Admission needs an ``await``: ``enter_async()`` of a gate, ``acquire()`` of a quota backend."""
