"""Fixtures of the overload tests: asyncio (the queue and hedge use its timers), a fresh registry."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest

from ragguard import _inject
from ragguard.events import bus

guard_mod = importlib.import_module("ragguard.guard")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _isolated_registry() -> Iterator[None]:
    saved = guard_mod._default
    listeners = list(bus._listeners)
    try:
        yield
    finally:
        guard_mod._default = saved
        _inject.uninstall()
        bus._listeners[:] = listeners
