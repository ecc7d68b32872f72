from __future__ import annotations

from pathlib import Path

import pytest

from one_loop import OneLoop

_one_loop = OneLoop(Path(__file__).resolve().parent)  # its tests make gRPC calls: tests/one_loop.py


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _one_loop.setup(item)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    _one_loop.teardown(item, nextitem)
