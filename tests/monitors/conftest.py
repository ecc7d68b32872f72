"""Fixtures of the monitor tests."""

from __future__ import annotations

import pytest
from monitors_helpers import Collected


@pytest.fixture
def collected() -> Collected:
    """Events of a private bus, for monitors given ``bus=collected.bus``."""
    return Collected()


@pytest.fixture
def anyio_backend() -> str:
    """Async tests here run on asyncio (redis.asyncio and the stall detector are asyncio's)."""
    return "asyncio"
