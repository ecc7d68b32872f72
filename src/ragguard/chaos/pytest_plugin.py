"""ragguard's pytest plugin (registered through the ``pytest11`` entry point)."""

from __future__ import annotations

import pytest

from .._clock import FakeClock


@pytest.fixture
def fake_clock() -> FakeClock:
    """A :class:`ragguard.FakeClock` starting at 0.0 seconds; advance it instead of sleeping."""
    return FakeClock()
