"""Fixtures of the HTTP tests (ASGI middleware, httpx transport).

The client side runs on asyncio; servers run in threads (see ``http_helpers.running``).
"""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _isolated_registry(isolated_registry: None) -> None:
    """Each test gets the default registry, chaos hook and listeners as they were before it."""
