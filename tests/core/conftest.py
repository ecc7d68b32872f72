"""Fixtures of the core tests: every async test runs on asyncio and on trio."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest
from core_helpers import Recorder

import ragguard
from ragguard import _inject
from ragguard.events import bus

# ``ragguard.deadline`` and ``ragguard.guard`` are the public callables; reach the modules directly.
guard_mod = importlib.import_module("ragguard.guard")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def _isolated_registry() -> Iterator[None]:
    """Each test gets the default registry and chaos hook as they were before it."""
    saved = guard_mod._default
    listeners = list(bus._listeners)
    try:
        yield
    finally:
        guard_mod._default = saved
        _inject.uninstall()
        bus._listeners[:] = listeners


@pytest.fixture
def deadline_clock() -> ragguard.FakeClock:
    """A FakeClock that drives every deadline: the default registry's clock, which ``deadline()``
    uses (a deadline is read on the clock it was set on, so a Guard with a real clock still sees
    it). The registry is restored after the test."""
    clock = ragguard.FakeClock(1000.0)
    ragguard.configure(clock=clock)
    return clock


@pytest.fixture
def events() -> Iterator[Recorder]:
    rec = Recorder()
    unsubscribe = bus.subscribe(rec)
    try:
        yield rec
    finally:
        unsubscribe()
