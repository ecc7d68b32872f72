"""Fixtures of the driver tests (calls and streams through the same layers). Every test runs with
each call driver: ``Node.drive`` itself, and the same written out per node (``_drivers.GENERATED``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ragguard import testing


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True, params=[True, False], ids=["written-out", "plain"])
def generated(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Chains put together in the test run the written-out driver, or the plain loop."""
    from ragguard.pipeline import _drivers

    before, _drivers.GENERATED = _drivers.GENERATED, request.param
    try:
        yield request.param
    finally:
        _drivers.GENERATED = before


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    testing.reset()
    try:
        yield
    finally:
        testing.reset()
