"""The front doors' server-wide bulkhead (ragguard.quotas._server) over both quota backends: the
tenant holding the most calls gives way first, a shed or cancelled call gives back everything,
in memory (LocalQuotas) as over a real redis-server (RedisQuotas)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from distributed_helpers import PATIENT, leases_in

from ragguard import ConfigError, FakeClock, Guard, Policy, QuotaExceeded, TenantQuota
from ragguard.quotas import LocalQuotas
from ragguard.quotas._server import ServerBulkhead, server_bulkhead
from ragguard.redis import RedisBackend
from ragguard.redis._keys import quota_keys

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

POLICY = Policy(tenants={
    "flood": TenantQuota(max_concurrency=1, max_wait_s=60.0),
    "calm": TenantQuota(max_concurrency=4, max_wait_s=60.0),
    "heavy": TenantQuota(max_concurrency=4, max_wait_s=60.0, weight=2.0),
    "eager": TenantQuota(max_concurrency=1, max_wait_s=0.0),  # no queue: its excess refused at once
})


class Calls:
    """Calls through ``bulkhead`` as tasks that hold their seat until let go."""

    def __init__(self, guard: Guard, bulkhead: ServerBulkhead) -> None:
        self.guard, self.bulkhead = guard, bulkhead
        self.go = asyncio.Event()

    def start(self, tenant: str) -> asyncio.Task[str]:
        async def call() -> str:
            async with self.bulkhead.seat(self.guard.tenant(tenant)):
                await self.go.wait()
            return "ok"

        return asyncio.ensure_future(call())


async def until(check: Callable[[], bool]) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.002)
    raise AssertionError("not reached")


async def heaviest_gives_way(guard: Guard, settled: Callable[[], Awaitable[None]]) -> None:
    bulkhead = ServerBulkhead(2)
    calls = Calls(guard, bulkhead)
    running = calls.start("flood")
    await until(lambda: bulkhead.holding("flood") == 1 and bulkhead.waiting("flood") == 0)
    queued = calls.start("flood")  # its quota's one slot is taken: it waits
    await until(lambda: bulkhead.waiting("flood") == 1)
    assert bulkhead.held == 2  # the server is full

    calm = calls.start("calm")  # lighter: the flood's waiting call is shed for it
    with pytest.raises(QuotaExceeded) as info:
        await queued
    assert info.value.reason == "server" and info.value.tenant == "flood" and info.value.retry_after_s > 0
    await until(lambda: bulkhead.holding("calm") == 1 and bulkhead.waiting("calm") == 0)
    await until(lambda: bulkhead.held == 2)  # the shed call's seat, once its task ended
    assert bulkhead.shed == 1 and bulkhead.holding("flood") == 1

    # full again; the flood holds as much as calm would with this arrival: the arrival is refused
    with pytest.raises(QuotaExceeded) as refused:
        await calls.start("flood")
    assert refused.value.reason == "server"
    await until(lambda: bulkhead.held == 2)
    assert bulkhead.refused == 1

    calls.go.set()
    assert await running == "ok" and await calm == "ok"
    await asyncio.sleep(0)  # the tasks' done callbacks give back their seats
    assert bulkhead.held == 0 and bulkhead.holding("flood") == 0 and not bulkhead._holders
    quiet(guard)
    await settled()


async def cancelled_gives_back_everything(guard: Guard, settled: Callable[[], Awaitable[None]]) -> None:
    bulkhead = ServerBulkhead(4)
    calls = Calls(guard, bulkhead)
    running = calls.start("flood")
    await until(lambda: bulkhead.holding("flood") == 1)
    queued = calls.start("flood")
    await until(lambda: bulkhead.waiting("flood") == 1)
    for task in (queued, running):
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await asyncio.sleep(0)
    assert bulkhead.held == 0 and not bulkhead._holders
    quiet(guard)
    again = calls.start("flood")  # the quota's slot is free again
    await until(lambda: bulkhead.holding("flood") == 1 and bulkhead.waiting("flood") == 0)
    calls.go.set()
    assert await again == "ok"
    await settled()


async def refusals_give_back_their_seats(guard: Guard, settled: Callable[[], Awaitable[None]]) -> None:
    """A refused call's task lives on while the server sends its refusal (gRPC and uvicorn count
    it until then); the door gives its seat back at once, so a tenant sending again the moment it
    is refused cannot fill the door with its refusals and turn the others away."""
    bulkhead = ServerBulkhead(2)
    calls = Calls(guard, bulkhead)
    running = calls.start("eager")
    await until(lambda: bulkhead.holding("eager") == 1 and bulkhead.waiting("eager") == 0)
    sending = asyncio.Event()  # the refusals' statuses still being sent
    told: list[str] = []

    async def refused(tenant: str) -> str:
        try:
            async with bulkhead.seat(guard.tenant(tenant)):
                return "admitted"
        except QuotaExceeded as exc:
            told.append(exc.reason)
            await sending.wait()
            return exc.reason

    refusals = []
    for n in range(1, 4):  # one after another: each refused by its quota, its task still sending
        refusals.append(asyncio.ensure_future(refused("eager")))
        await until(lambda: len(told) == n)  # noqa: B023 (awaited before n changes)
    assert bulkhead.held == 1 and bulkhead.holding("eager") == 1  # the running call alone

    calm = calls.start("calm")  # one call running: room for it
    await until(lambda: bulkhead.holding("calm") == 1)
    more = asyncio.ensure_future(refused("eager"))  # the server full: eager holds the most
    sending.set()
    assert [await t for t in refusals] == ["concurrency"] * 3 and await more == "server"
    calls.go.set()
    assert await running == "ok" and await calm == "ok"
    await asyncio.sleep(0)
    assert bulkhead.held == 0 and not bulkhead._holders and not bulkhead._ending
    quiet(guard)
    await settled()


async def test_local_quotas_refusals_give_back_their_seats() -> None:
    guard = Guard(POLICY, clock=FakeClock())
    await refusals_give_back_their_seats(guard, _nothing)


async def test_local_quotas_heaviest_gives_way() -> None:
    guard = Guard(POLICY, clock=FakeClock())
    await heaviest_gives_way(guard, _nothing)


async def test_local_quotas_cancelled_gives_back_everything() -> None:
    guard = Guard(POLICY, clock=FakeClock())
    await cancelled_gives_back_everything(guard, _nothing)


@pytest.mark.parametrize(
    "scenario", [heaviest_gives_way, cancelled_gives_back_everything, refusals_give_back_their_seats]
)
async def test_redis_quotas(client: Any, scenario: Callable[..., Awaitable[None]]) -> None:
    prefix = f"t-{scenario.__name__}"
    guard = Guard(POLICY, backend=RedisBackend(client, prefix=prefix, **PATIENT))
    try:
        await scenario(guard, _no_leases(client, prefix))
    finally:
        await guard.aclose()


async def test_weight_divides_what_a_tenant_holds() -> None:
    """heavy (weight 2) holding 2 calls is as light as a tenant holding 1: a calm arrival on a full
    server does not shed heavy's waiting call, and is itself refused."""
    guard = Guard(POLICY, clock=FakeClock())
    bulkhead = ServerBulkhead(3)
    calls = Calls(guard, bulkhead)
    held = [calls.start("heavy") for _ in range(2)]
    calm = calls.start("calm")
    await until(lambda: bulkhead.held == 3)
    with pytest.raises(QuotaExceeded):
        await calls.start("calm")  # calm would hold 2 (load 2) > heavy's 2 / 2
    assert bulkhead.holding("heavy") == 2
    calls.go.set()
    for task in (*held, calm):
        assert await task == "ok"


async def test_headroom_is_for_tenants_lighter_than_the_heaviest() -> None:
    guard = Guard(POLICY, clock=FakeClock())
    bulkhead = ServerBulkhead(3, headroom=1)  # full at 2
    calls = Calls(guard, bulkhead)
    held = [calls.start("calm") for _ in range(2)]  # both run: nothing to shed
    await until(lambda: bulkhead.held == 2)
    with pytest.raises(QuotaExceeded):
        await calls.start("calm")  # the heaviest itself: no headroom for it
    held.append(calls.start("flood"))  # lighter: takes the headroom
    await until(lambda: bulkhead.held == 3)
    with pytest.raises(QuotaExceeded):
        await calls.start("heavy")  # the server is at capacity
    calls.go.set()
    for task in held:
        assert await task == "ok"


async def test_a_thousand_tenant_ids_leave_nothing_behind() -> None:
    guard = Guard(Policy(), clock=FakeClock())
    bulkhead = ServerBulkhead(8)

    async def one_after_another() -> None:  # one task: each seat is given back at the next
        for i in range(1000):
            async with bulkhead.seat(guard.tenant(f"t{i}")):
                assert bulkhead.held == 1
        assert bulkhead.held == 1 and len(bulkhead._holders) == 1  # the last, until the task ends

    await asyncio.ensure_future(one_after_another())
    await asyncio.sleep(0)
    assert bulkhead.held == 0 and not bulkhead._holders and not bulkhead._ending


@pytest.mark.parametrize(
    ("capacity", "headroom", "field"),
    [(0, None, "cap"), (2.5, None, "cap"), (True, None, "cap"), (4, 4, "headroom"), (4, -1, "headroom"),
     (None, 1, "headroom"), (10**7, None, "cap")],
)
def test_bad_options_name_the_field(capacity: Any, headroom: Any, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        server_bulkhead("cap", capacity, headroom)
    assert info.value.field == field


def quiet(guard: Guard) -> None:
    """The quotas hold nothing in this process (RedisQuotas: not even in its local fallback)."""
    quotas = guard.quotas
    local = quotas if isinstance(quotas, LocalQuotas) else quotas.fallback
    assert local.in_flight("flood") == 0 and local.waiting("flood") == 0
    if not isinstance(quotas, LocalQuotas):
        assert not quotas._running.get("flood")  # no shared lease held here


async def _nothing() -> None:
    return None


def _no_leases(client: Any, prefix: str) -> Callable[[], Awaitable[None]]:
    async def settled() -> None:
        """Every shared lease is given back in Redis (the releases land in the background)."""
        keys = [quota_keys(t, prefix)[0] for t in ("flood", "calm")]
        for _ in range(200):
            if not any([await leases_in(client, k) for k in keys]):
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"leases left in Redis: {[await leases_in(client, k) for k in keys]}")

    return settled


async def test_a_cancel_during_a_redis_admission_is_never_swallowed(client: Any) -> None:
    """redis-py may take in a cancellation of the task while a command is in flight and complete
    the command (redis/redis-py#2028): the admission must end cancelled all the same, its lease
    given back, at whichever loop step the cancellation lands (the seat's shedding relies on it)."""
    guard = Guard(POLICY, backend=RedisBackend(client, prefix="t-cancel", **PATIENT))
    go = asyncio.Event()

    async def call() -> None:
        async with guard.tenant("flood"):
            await go.wait()

    try:
        for steps in range(12):
            task = asyncio.ensure_future(call())
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=2)
            assert done, f"the cancellation {steps} loop steps in was swallowed"
            assert task.cancelled()
            await _no_leases(client, "t-cancel")()
    finally:
        go.set()
        await guard.aclose()
