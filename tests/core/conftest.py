"""Fixtures of the core tests: every async test runs on asyncio and on trio."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from core_helpers import Recorder

import ragguard


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def _isolated_registry(isolated_registry: None) -> None:
    """Each test gets the default registry, chaos hook and listeners as they were before it."""


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
    with Recorder() as rec:  # subscribed to the global bus until the test ends
        yield rec
