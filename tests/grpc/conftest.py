from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from anyio.pytest_plugin import get_runner

HERE = Path(__file__).resolve().parent


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# grpc.aio's completion-queue poller hands events of an earlier call to that call's loop; when each
# test had its own loop, a late event found a closed loop and failed a later test. So one anyio
# runner (one loop) is leased for the whole of this directory, and released when the run leaves it.
# (A package-scoped async fixture did this before, but a directory without __init__.py is no
# package: the fixture lived until the end of the session, and every anyio test collected after
# this directory ran on its asyncio loop, trio tests included.)
_lease: AbstractContextManager[Any] | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _lease
    if _lease is None:
        _lease = get_runner("asyncio", {})
        _lease.__enter__()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    global _lease
    if _lease is not None and (nextitem is None or HERE not in Path(nextitem.path).resolve().parents):
        lease, _lease = _lease, None
        lease.__exit__(None, None, None)
