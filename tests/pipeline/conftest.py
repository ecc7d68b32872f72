"""Fixtures of the driver tests (compiled nodes, calls and streams through the same layers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ragguard import testing


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
