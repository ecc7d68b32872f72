from collections.abc import AsyncIterator

import pytest


@pytest.fixture(scope="package")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="package", autouse=True)
async def _one_event_loop_for_grpc_tests(anyio_backend: str) -> AsyncIterator[None]:
    # grpc.aio's completion-queue poller hands events of an earlier call to that call's loop;
    # when each test had its own loop, a late event found a closed loop and failed a later
    # test. Holding one anyio runner for this directory keeps a single loop for all of it.
    yield
