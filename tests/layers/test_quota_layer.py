"""The quota layer: the default tenant's admission for calls made outside a request."""

from __future__ import annotations

import anyio
import pytest
from layer_helpers import make_call

from ragguard import FakeClock, Guard, Policy, QuotaExceeded, TenantQuota
from ragguard.layers import Bound
from ragguard.layers._quota import QuotaLayer, build
from ragguard.pipeline import NO_EXIT, WAIT
from ragguard.quotas import LocalQuotas

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


def _quotas(clock: FakeClock, **quota: float) -> LocalQuotas:
    limits = TenantQuota(**quota)
    return LocalQuotas(lambda tenant: limits, clock=clock)


async def test_a_call_outside_a_request_takes_a_slot_until_it_exits() -> None:
    clock = FakeClock()
    quotas = _quotas(clock, max_concurrency=2)
    layer = QuotaLayer(quotas)
    call = make_call()
    first = layer.enter(call)
    if first is WAIT:  # a tenant's first request creates its bucket on the slow path
        first = await layer.enter_async(call)
    second = layer.enter(call)
    assert second is not WAIT and second is not None
    assert quotas.in_flight("default") == 2
    assert layer.enter(call) is WAIT  # full: the driver must await enter_async
    assert layer.exit(call, second, None) is None
    assert quotas.in_flight("default") == 1
    assert layer.exit(call, first, ConnectionError("failed")) is None  # released on failure too
    assert quotas.in_flight("default") == 0


async def test_a_full_quota_refuses_without_a_wait_allowance() -> None:
    clock = FakeClock()
    quotas = _quotas(clock, max_concurrency=1, max_wait_s=0)
    layer = QuotaLayer(quotas)
    call = make_call()
    held = await layer.enter_async(call)
    assert layer.enter(call) is WAIT
    with pytest.raises(QuotaExceeded) as refused:
        await layer.enter_async(call)
    assert refused.value.tenant == "default"
    assert quotas.in_flight("default") == 1  # the refusal took nothing
    layer.exit(call, held, None)
    assert quotas.in_flight("default") == 0


async def test_a_waiter_is_handed_the_slot_an_exit_gives_back() -> None:
    clock = FakeClock()
    quotas = _quotas(clock, max_concurrency=1, max_wait_s=60)
    layer = QuotaLayer(quotas)
    call = make_call()
    held = await layer.enter_async(call)
    got: list[object] = []

    async def wait() -> None:
        got.append(await layer.enter_async(call))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        assert quotas.waiting("default") == 1
        layer.exit(call, held, None)
    assert got and got[0] is not None
    assert quotas.in_flight("default") == 1
    layer.exit(call, got[0], None)
    assert quotas.in_flight("default") == 0


async def test_a_cancelled_wait_holds_nothing() -> None:
    clock = FakeClock()
    quotas = _quotas(clock, max_concurrency=1, max_wait_s=60)
    layer = QuotaLayer(quotas)
    call = make_call()
    held = await layer.enter_async(call)
    async with anyio.create_task_group() as tg:
        tg.start_soon(layer.enter_async, call)
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert quotas.waiting("default") == 0
    layer.exit(call, held, anyio.get_cancelled_exc_class()())  # a cancelled call releases its slot
    assert quotas.in_flight("default") == 0


async def test_inside_a_request_the_call_was_admitted_on_entry() -> None:
    g = Guard(Policy(default_quota=TenantQuota(max_concurrency=1)), clock=FakeClock())
    layer = QuotaLayer(g.quotas)
    call = make_call()
    async with g.tenant("acme"):
        assert layer.enter(call) is NO_EXIT  # no second admission, nothing to release
    assert g.quotas.in_flight("default") == 0


def test_build_leaves_the_layer_out_without_a_default_quota() -> None:
    bound = Bound("s", make_call().fn, stream=False)
    assert build(Guard().stage("s"), bound) is None
    limited = Guard(Policy(default_quota=TenantQuota(rate_per_s=5)))
    assert isinstance(build(limited.stage("s"), bound), QuotaLayer)
