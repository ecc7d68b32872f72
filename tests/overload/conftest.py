"""Fixtures of the overload tests: asyncio (the queue and hedge use its timers), a fresh registry."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _isolated_registry(isolated_registry: None) -> None:
    """Each test gets the default registry, chaos hook and listeners as they were before it."""
