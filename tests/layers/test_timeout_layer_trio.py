"""The timeout layer on trio: a native cancel scope per attempt (FakeClock timers need asyncio)."""

from __future__ import annotations

import pytest
from layer_helpers import make_call
from test_timeout_layer import gated

from ragguard import DeadlineExceeded, FakeClock, StageTimeout, deadline
from ragguard.layers._timeout import TimeoutLayer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


async def test_on_trio_a_native_cancel_scope_bounds_the_attempt() -> None:
    import trio

    layer = TimeoutLayer("s", 0.02, 0.0, FakeClock())  # FakeClock timers need asyncio: trio's clock

    async def forever() -> None:
        await trio.sleep_forever()

    with pytest.raises(StageTimeout):
        await gated(layer, make_call(), forever)

    async def quick() -> str:
        await trio.lowlevel.checkpoint()
        return "ok"

    assert await gated(layer, make_call(), quick) == "ok"
    clock = FakeClock()
    with deadline(0.02, clock=clock):
        call = make_call()
        with pytest.raises(DeadlineExceeded):
            await gated(TimeoutLayer("s", 5.0, 0.0, None), call, forever)
    assert call.by_deadline
