"""Fixtures of the layer unit tests: each layer object driven directly (enter/exit, recover,
around) with a fake ``proceed``/``again`` and a FakeClock; nothing sleeps."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ragguard import testing
from ragguard.testing import EventRecorder


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    testing.reset()
    try:
        yield
    finally:
        testing.reset()


@pytest.fixture
def events() -> Iterator[EventRecorder]:
    with EventRecorder() as recorder:
        yield recorder
