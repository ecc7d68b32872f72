"""Fixtures of the generation-stage tests: asyncio (FakeClock timers need it) unless a test asks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gen_helpers import Recorder


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _isolated_registry(isolated_registry: None) -> None:
    """Each test gets the default registry, chaos hook and listeners as they were before it."""


@pytest.fixture
def events() -> Iterator[Recorder]:
    with Recorder() as rec:  # subscribed to the global bus until the test ends
        yield rec
