from __future__ import annotations

from pathlib import Path

import pytest

from one_loop import OneLoop

HERE = Path(__file__).resolve().parent


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


_one_loop = OneLoop(HERE)  # one loop for the directory's gRPC calls (see tests/one_loop.py)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _one_loop.setup(item)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    _one_loop.teardown(item, nextitem)
