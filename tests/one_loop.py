"""One anyio runner (one asyncio loop) for all the tests of a directory that use grpc.aio.

grpc.aio's completion-queue poller hands the events of an earlier call to that call's loop; when
each test had its own loop, a late event found a closed loop and failed a later test ("Event loop
is closed" from ``PollerCompletionQueue._handle_events``). So a directory whose tests make gRPC
calls leases one runner for the whole of the directory, and releases it when the run leaves it.
(A package-scoped async fixture did this before, but a directory without ``__init__.py`` is no
package: the fixture lived until the end of the session, and every anyio test collected after the
directory ran on its asyncio loop, trio tests included.)
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from anyio.pytest_plugin import get_runner


class OneLoop:
    """The lease of one directory: call :meth:`setup` and :meth:`teardown` from its conftest's
    ``pytest_runtest_setup`` / ``pytest_runtest_teardown`` hooks."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lease: AbstractContextManager[Any] | None = None

    def setup(self, item: pytest.Item) -> None:
        if self._lease is None:
            self._lease = get_runner("asyncio", {})
            self._lease.__enter__()

    def teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        if self._lease is not None and (
            nextitem is None or self.directory not in Path(nextitem.path).resolve().parents
        ):
            lease, self._lease = self._lease, None
            lease.__exit__(None, None, None)
