"""The front doors' server bulkhead on trio (ragguard's core runs on asyncio and trio): a waiting
call of the heaviest tenant is shed through a cancel scope, and gives back its quota slot."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from ragguard import FakeClock, Guard, Policy, QuotaExceeded, TenantQuota
from ragguard.quotas._server import ServerBulkhead

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


@pytest.fixture
def anyio_backend() -> Any:
    return "trio"


async def test_the_heaviest_tenants_waiting_call_is_shed_on_trio() -> None:
    policy = Policy(tenants={"flood": TenantQuota(max_concurrency=1, max_wait_s=60.0)})
    guard = Guard(policy, clock=FakeClock())
    bulkhead = ServerBulkhead(2)
    go = trio.Event()
    outcomes: list[str] = []

    async def call(tenant: str) -> None:
        try:
            async with bulkhead.seat(guard.tenant(tenant)):
                outcomes.append(f"{tenant} in")
                await go.wait()
        except QuotaExceeded as exc:
            outcomes.append(f"{tenant} {exc.reason}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, "flood")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(call, "flood")  # waits in its quota
        await trio.testing.wait_all_tasks_blocked()
        assert bulkhead.holding("flood") == 2 and bulkhead.waiting("flood") == 1
        nursery.start_soon(call, "calm")  # sheds it
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(outcomes) == ["calm in", "flood in", "flood server"]
        go.set()
    assert bulkhead.held == 0 and not bulkhead._holders
    assert guard.quotas.in_flight("flood") == 0 and guard.quotas.waiting("flood") == 0
