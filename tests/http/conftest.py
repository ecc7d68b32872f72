"""Fixtures of the HTTP tests (ASGI middleware, httpx transport).

The client side runs on asyncio; servers run in threads (see ``http_helpers.running``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest

guard_mod = importlib.import_module("ragguard.guard")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _isolated_registry() -> Iterator[None]:
    """Each test gets the default registry as it was before it."""
    saved = guard_mod._default
    try:
        yield
    finally:
        guard_mod._default = saved
