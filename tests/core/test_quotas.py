"""Per-tenant quotas: FIFO bulkhead, GCRA rate, bounded waits, honest retry-after, releases."""

from __future__ import annotations

import random
import time
from typing import Any

import anyio
import pytest
from core_helpers import Recorder, no_sleep

import ragguard
from ragguard import (
    BreakerPolicy,
    BreakerState,
    ConfigError,
    DeadlineExceeded,
    Guard,
    InvalidInput,
    Policy,
    QuotaExceeded,
    RetryPolicy,
    StagePolicy,
    TenantQuota,
    current_tenant,
    deadline,
    remaining,
)
from ragguard.events import QuotaRejected
from ragguard.quotas import LocalQuotas

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def _guard(clock: Any = None, max_tenants: int | None = None, **quotas: TenantQuota) -> Guard:
    policy = Policy(tenants=quotas)
    options: dict[str, Any] = {}
    if clock is not None:
        options["clock"] = clock
    if max_tenants is not None:
        options["quotas"] = LocalQuotas(policy.quota, clock=clock or time.monotonic, max_tenants=max_tenants)
    return Guard(policy, **options)


async def _until(predicate: Any, what: str) -> None:
    for _ in range(10_000):
        if predicate():
            return
        await anyio.sleep(0)
    raise AssertionError(f"timed out waiting until {what}")


# -- concurrency: FIFO, bounded waits -------------------------------------------------------------


async def test_waiters_are_admitted_first_come_first_served() -> None:
    g = _guard(acme=TenantQuota(max_concurrency=1, max_wait_s=10))
    admitted: list[int] = []
    release = anyio.Event()

    async def holder() -> None:
        async with g.tenant("acme"):
            await release.wait()

    async def request(i: int) -> None:
        async with g.tenant("acme"):
            admitted.append(i)
            await anyio.sleep(0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await _until(lambda: g.quotas.in_flight("acme") == 1, "the holder is in")
        for i in range(10):
            tg.start_soon(request, i)
            await _until(lambda i=i: g.quotas.waiting("acme") == i + 1, f"waiter {i} queued")
        release.set()
        # a newcomer arriving while others wait must queue behind them, not take a freed slot
        await anyio.sleep(0)
        tg.start_soon(request, 99)
    assert admitted == [*range(10), 99]
    assert g.quotas.in_flight("acme") == 0 and g.quotas.waiting("acme") == 0


async def test_max_wait_s_bounds_the_wait(events: Recorder) -> None:
    g = _guard(acme=TenantQuota(max_concurrency=1, max_wait_s=0.05))
    async with g.tenant("acme"):
        started = time.monotonic()
        with pytest.raises(QuotaExceeded) as info:
            async with g.tenant("acme"):
                pass
        waited = time.monotonic() - started
    assert 0.04 <= waited < 5.0  # (the upper bound catches a hang, not slowness)
    assert info.value.tenant == "acme" and info.value.reason == "concurrency"
    assert info.value.retry_after_s > 0
    assert g.quotas.in_flight("acme") == 0 and g.quotas.waiting("acme") == 0
    await events.settle()
    assert [(e.tenant, e.reason) for e in events.of(QuotaRejected)] == [("acme", "concurrency")]


async def test_zero_max_wait_rejects_at_once() -> None:
    clock = ragguard.FakeClock()  # never advanced: a wait of any length would never end
    g = _guard(clock=clock, acme=TenantQuota(max_concurrency=2))
    async with g.tenant("acme"), g.tenant("acme"):
        with anyio.fail_after(5), pytest.raises(QuotaExceeded) as info:
            async with g.tenant("acme"):
                pass
        assert g.quotas.waiting("acme") == 0
    assert info.value.reason == "concurrency"


async def test_the_deadline_bounds_the_wait() -> None:
    g = _guard(acme=TenantQuota(max_concurrency=1, max_wait_s=30))
    async with g.tenant("acme"):
        started = time.monotonic()
        with pytest.raises(QuotaExceeded) as info:
            async with deadline(0.05), g.tenant("acme"):
                pass
        assert time.monotonic() - started < 5.0  # a hang, not slowness
    assert info.value.reason == "deadline"
    assert g.quotas.waiting("acme") == 0


async def test_a_waiter_admitted_in_time_gets_the_slot() -> None:
    g = _guard(acme=TenantQuota(max_concurrency=1, max_wait_s=5))
    order = []

    async def holder() -> None:
        async with g.tenant("acme"):
            order.append("holder in")
            await anyio.sleep(0.02)
        order.append("holder out")

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await _until(lambda: g.quotas.in_flight("acme") == 1, "holder in")
        async with g.tenant("acme"):
            order.append("waiter in")
    assert order == ["holder in", "holder out", "waiter in"]


# -- rate: GCRA with an honest retry_after_s ------------------------------------------------------


async def test_rate_retry_after_is_exactly_when_a_token_is_due() -> None:
    clock = ragguard.FakeClock()
    g = _guard(clock=clock, acme=TenantQuota(rate_per_s=4, burst=2))
    async with g.tenant("acme"), g.tenant("acme"):  # the burst
        pass
    with pytest.raises(QuotaExceeded) as info:
        async with g.tenant("acme"):
            pass
    assert info.value.reason == "rate" and info.value.tenant == "acme"
    assert info.value.retry_after_s == pytest.approx(0.25)
    clock.advance(0.1)
    with pytest.raises(QuotaExceeded) as info:
        async with g.tenant("acme"):
            pass
    assert info.value.retry_after_s == pytest.approx(0.15)  # a refusal spends nothing
    clock.advance(info.value.retry_after_s)
    async with g.tenant("acme"):  # admitted exactly when promised
        pass
    with pytest.raises(QuotaExceeded) as info:
        async with g.tenant("acme"):
            pass
    assert info.value.retry_after_s == pytest.approx(0.25)


async def test_rate_is_respected_over_a_simulated_period() -> None:
    clock = ragguard.FakeClock()
    rate, burst = 5.0, 5
    g = _guard(clock=clock, acme=TenantQuota(rate_per_s=rate, burst=burst))
    admitted: list[float] = []
    promises: list[tuple[float, float]] = []
    for _ in range(1000):  # one request every 10 ms for 10 s
        try:
            async with g.tenant("acme"):
                admitted.append(clock())
        except QuotaExceeded as exc:
            promises.append((clock(), clock() + exc.retry_after_s))
        clock.advance(0.01)
    assert rate * 10 <= len(admitted) <= rate * 10 + burst
    for start in (t / 10 for t in range(0, 91)):
        in_window = sum(1 for t in admitted if start <= t < start + 1.0)
        assert in_window <= rate + burst
    for start in (t / 10 for t in range(10, 91)):  # after the first burst, the rate itself
        assert sum(1 for t in admitted if start <= t < start + 1.0) <= rate + 1
    # every refusal's retry_after_s was honest: the next admission came exactly then (to the 10 ms
    # step of this simulation), never earlier
    checked = 0
    for refused_at, promise in promises:
        later = [a for a in admitted if a >= refused_at]
        if later:
            assert promise - 1e-9 <= later[0] <= promise + 0.01 + 1e-9
            checked += 1
    assert checked > 900


async def test_rate_and_concurrency_together() -> None:
    clock = ragguard.FakeClock()
    g = _guard(clock=clock, acme=TenantQuota(rate_per_s=1000, max_concurrency=1))
    async with g.tenant("acme"):
        with pytest.raises(QuotaExceeded) as info:
            async with g.tenant("acme"):
                pass
        assert info.value.reason == "concurrency"
    # the refused request gave its rate token back: the other 999 of the burst fit at once
    for _ in range(999):
        async with g.tenant("acme"):
            pass
    with pytest.raises(QuotaExceeded) as info:
        async with g.tenant("acme"):
            pass
    assert info.value.reason == "rate"


# -- releases -----------------------------------------------------------------------------------


async def test_slot_released_on_success_error_and_cancellation() -> None:
    g = _guard(acme=TenantQuota(max_concurrency=1, max_wait_s=1))
    async with g.tenant("acme"):
        assert g.quotas.in_flight("acme") == 1
    assert g.quotas.in_flight("acme") == 0
    with pytest.raises(KeyError):
        async with g.tenant("acme"):
            raise KeyError("user error")
    assert g.quotas.in_flight("acme") == 0
    with anyio.move_on_after(0.01):
        async with g.tenant("acme"):
            await anyio.sleep(10)
    assert g.quotas.in_flight("acme") == 0

    # a waiter cancelled while queued leaves no trace, and the next one is served
    async def hold(ev: anyio.Event) -> None:
        async with g.tenant("acme"):
            await ev.wait()

    ev = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(hold, ev)
        await _until(lambda: g.quotas.in_flight("acme") == 1, "held")
        with anyio.move_on_after(0.01):
            async with g.tenant("acme"):
                raise AssertionError("must not be admitted")
        assert g.quotas.waiting("acme") == 0
        ev.set()
    async with g.tenant("acme"):
        pass
    assert g.quotas.in_flight("acme") == 0


async def test_ten_thousand_randomly_cancelled_calls_leave_nothing_held() -> None:
    rng = random.Random(20240611)
    quota = TenantQuota(max_concurrency=8, max_wait_s=5)
    never_trips = BreakerPolicy(
        kind="generic", failure_rate_threshold=100, minimum_calls=1000, window_size=1000
    )
    stage = StagePolicy(
        timeout_s=5, breaker=never_trips, retry=RetryPolicy(attempts=2, retry_on=("connection",), jitter_s=0)
    )
    policy = Policy(
        tenants={"acme": quota},
        default_quota=TenantQuota(max_concurrency=4, max_wait_s=5),
        stages={"s": stage},
    )
    g = Guard(policy, sleep=no_sleep, rng=random.Random(1))
    inside = {"acme": 0, "default": 0}
    peak = {"acme": 0, "default": 0}
    outcomes = {"ok": 0, "cancelled": 0, "error": 0}

    @g.guard("s")
    async def work(steps: int, fail: bool) -> None:
        who = current_tenant()
        inside[who] += 1
        peak[who] = max(peak[who], inside[who])
        try:
            for _ in range(steps):
                await anyio.sleep(0)
            if fail:
                raise ConnectionError("flaky")
        finally:
            inside[who] -= 1

    async def one(scope: anyio.CancelScope, in_tenant: bool, steps: int, fail: bool) -> None:
        with scope:
            try:
                if in_tenant:
                    async with g.tenant("acme"):
                        await work(steps, fail)
                else:
                    await work(steps, fail)  # per-call quota of the default tenant
                outcomes["ok"] += 1
            except ConnectionError:
                outcomes["error"] += 1
        if scope.cancelled_caught:
            outcomes["cancelled"] += 1

    for _ in range(20):  # a hang ends at the suite's timeout; how fast is benchmarks' business
        plan: list[tuple[anyio.CancelScope, int | None]] = []
        async with anyio.create_task_group() as tg:
            for _ in range(500):
                scope = anyio.CancelScope()
                cancel_at = rng.randrange(0, 40) if rng.random() < 0.7 else None
                plan.append((scope, cancel_at))
                tg.start_soon(one, scope, rng.random() < 0.8, rng.randrange(0, 6), rng.random() < 0.2)
            for step in range(40):
                for scope, at in plan:
                    if at == step:
                        scope.cancel()
                await anyio.sleep(0)
    assert sum(outcomes.values()) == 10_000
    assert outcomes["cancelled"] > 2000 and outcomes["ok"] > 1000  # the plan really cut calls short
    assert peak["acme"] <= 8 and peak["default"] <= 4
    for tenant in ("acme", "default"):
        assert g.quotas.in_flight(tenant) == 0
        assert g.quotas.waiting(tenant) == 0
        assert not g.quotas._buckets[tenant].waiters  # no abandoned waiter left queued
    assert g.breaker("s").state is BreakerState.CLOSED
    # and the quota still admits its full concurrency
    async with (
        g.tenant("acme"),
        g.tenant("acme"),
        g.tenant("acme"),
        g.tenant("acme"),
        g.tenant("acme"),
        g.tenant("acme"),
        g.tenant("acme"),
        g.tenant("acme"),
    ):
        assert g.quotas.in_flight("acme") == 8


# -- tenant ids -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "a" * 65,
        "has space",
        "semi;colon",
        "-leading-dash",
        "ünïcode",
        "new\nline",
        "a/b",
        123,
        None,
        b"acme",
        ["acme"],
    ],
)
async def test_bad_tenant_ids_raise_value_error_and_create_no_bucket(bad: object) -> None:
    g = _guard(default=TenantQuota(max_concurrency=1))
    g.quotas._buckets.clear()
    with pytest.raises(ValueError) as info:
        async with g.tenant(bad):  # type: ignore[arg-type]
            pass
    assert isinstance(info.value, InvalidInput)
    assert "tenant id" in str(info.value)
    assert g.quotas._buckets == {}
    with pytest.raises(ValueError):
        ragguard.tenant(bad)  # type: ignore[arg-type]


async def test_valid_tenant_ids_are_accepted() -> None:
    g = _guard(default=TenantQuota(max_concurrency=1))
    for tid in ("a", "A" * 64, "acme.eu-1", "user@example.org", "org:team_7"):
        async with g.tenant(tid):
            assert current_tenant() == tid
    assert current_tenant() == "default"


async def test_bad_tenant_id_in_a_policy_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        Policy.parse({"tenants": {"bad id": {"max_concurrency": 1}}})


async def test_a_flood_of_tenant_ids_keeps_buckets_bounded() -> None:
    clock = ragguard.FakeClock()
    policy = Policy(default_quota=TenantQuota(max_concurrency=2, rate_per_s=100))
    quotas = LocalQuotas(policy.quota, clock=clock, max_tenants=50)
    g = Guard(policy, clock=clock, quotas=quotas)
    for i in range(2000):
        async with g.tenant(f"tenant-{i}"):
            pass
        clock.advance(0.05)  # each tenant's rate token is spent by the time the next arrives
        assert len(quotas._buckets) <= 50
    # a busy tenant is never evicted
    async with g.tenant("busy"):
        for i in range(200):
            async with g.tenant(f"other-{i}"):
                pass
            clock.advance(0.05)
        assert quotas.in_flight("busy") == 1


# -- tenant context -------------------------------------------------------------------------------


async def test_tenant_timeout_becomes_the_deadline(deadline_clock: ragguard.FakeClock) -> None:
    g = _guard(clock=deadline_clock, acme=TenantQuota(timeout_s=0.5), slow=TenantQuota(timeout_s=30))
    assert remaining() is None
    async with g.tenant("acme"):
        assert remaining() == pytest.approx(0.5)
        assert current_tenant() == "acme"
    assert remaining() is None and current_tenant() == "default"
    async with deadline(0.2), g.tenant("slow"):
        assert remaining() == pytest.approx(0.2)  # the caller's shorter deadline wins


async def test_tenant_deadline_bounds_guarded_calls() -> None:
    g = Guard(Policy(tenants={"acme": TenantQuota(timeout_s=0.05)}))

    @g.guard("search")
    async def search() -> None:
        await anyio.sleep(10)

    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        async with g.tenant("acme"):
            await search()
    assert time.monotonic() - started < 5.0  # not the 10 s the call would take


async def test_calls_inside_a_tenant_block_take_no_second_slot() -> None:
    g = Guard(Policy(default_quota=TenantQuota(max_concurrency=1)))

    @g.guard("s")
    async def work() -> str:
        return current_tenant()

    async with g.tenant("acme"):  # acme gets its own default quota of 1
        assert await work() == "acme"
        assert await work() == "acme"
    assert await work() == "default"  # outside: the default tenant's per-call slot
    assert g.quotas.in_flight("default") == 0


async def test_per_call_quota_outside_a_tenant_block() -> None:
    g = Guard(Policy(default_quota=TenantQuota(max_concurrency=1)))
    gate = anyio.Event()

    @g.guard("s")
    async def work() -> None:
        await gate.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(work)
        await _until(lambda: g.quotas.in_flight("default") == 1, "first call in")
        with pytest.raises(QuotaExceeded):
            await work()
        gate.set()
    assert g.quotas.in_flight("default") == 0


async def test_waiters_that_give_up_do_not_pile_up_behind_a_stuck_slot() -> None:
    g = _guard(acme=TenantQuota(max_concurrency=1, max_wait_s=0.001))
    async with g.tenant("acme"):  # holds the only slot for the whole test
        for _ in range(300):
            with pytest.raises(QuotaExceeded):
                async with g.tenant("acme"):
                    pass
        for _ in range(300):
            with anyio.move_on_after(0):
                async with g.tenant("acme"):
                    pass
        assert len(g.quotas._buckets["acme"].waiters or ()) <= 1  # not one object per refused request
        with pytest.raises(QuotaExceeded) as info:
            async with g.tenant("acme"):
                pass
        assert info.value.retry_after_s < 1.0  # the estimate does not count long-gone waiters
    assert g.quotas.in_flight("acme") == 0


# -- a changed limit applies to hand-offs (issue 13 items 1 and 2) --------------------------------


class _Changing:
    """A tenant quota the test changes while requests hold and wait."""

    def __init__(self, quota: TenantQuota) -> None:
        self.quota = quota

    def __call__(self, tenant: str) -> TenantQuota:
        return self.quota


async def _hold(q: LocalQuotas, held: list[str], name: str, scopes: dict[str, anyio.CancelScope]) -> None:
    with anyio.CancelScope() as scope:
        scopes[name] = scope
        lease = await q.acquire("acme")
        try:
            held.append(name)
            await anyio.sleep_forever()
        finally:
            q.release(lease)


async def _queued(q: LocalQuotas, scopes: dict[str, anyio.CancelScope], name: str) -> None:
    await _until(lambda: name in scopes and q.waiting("acme") == len(scopes), f"{name} queued")


async def test_a_release_under_a_lowered_limit_does_not_over_grant() -> None:
    quota = _Changing(TenantQuota(max_concurrency=2, max_wait_s=10))
    q = LocalQuotas(quota)
    a, b = await q.acquire("acme"), await q.acquire("acme")
    held: list[str] = []
    scopes: dict[str, anyio.CancelScope] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(_hold, q, held, "waiter", scopes)
        await _until(lambda: q.waiting("acme") == 1, "the waiter queued")
        quota.quota = TenantQuota(max_concurrency=1, max_wait_s=10)
        q.release(a)
        await anyio.sleep(0.01)
        assert (q.in_flight("acme"), q.waiting("acme"), held) == (1, 1, [])  # was 2 in flight, limit 1
        q.release(b)
        await _until(lambda: held == ["waiter"], "the waiter admitted under the new limit")
        assert q.in_flight("acme") == 1
        tg.cancel_scope.cancel()
    assert q.in_flight("acme") == 0 and q.waiting("acme") == 0


async def test_a_granted_waiter_cancelled_hands_on_only_below_the_current_limit() -> None:
    quota = _Changing(TenantQuota(max_concurrency=2, max_wait_s=10))
    q = LocalQuotas(quota)
    a, b = await q.acquire("acme"), await q.acquire("acme")
    held: list[str] = []
    scopes: dict[str, anyio.CancelScope] = {}
    async with anyio.create_task_group() as tg:
        for name in ("first", "second"):
            tg.start_soon(_hold, q, held, name, scopes)
            await _queued(q, scopes, name)
        quota.quota = TenantQuota(max_concurrency=1, max_wait_s=10)
        q.release(a)  # the slot goes to "first" (in flight 2 -> 2: the new limit is read only now)
        scopes["first"].cancel()  # ... which is cancelled before it runs: its slot is given back
        await anyio.sleep(0.01)
        assert q.in_flight("acme") == 1 and q.waiting("acme") == 1  # "second" waits: 1 >= limit 1
        assert "second" not in held
        q.release(b)
        await _until(lambda: "second" in held, "second admitted once b is released")
        assert q.in_flight("acme") == 1
        tg.cancel_scope.cancel()
    assert q.in_flight("acme") == 0 and q.waiting("acme") == 0


async def test_a_raised_limit_wakes_the_waiters_it_frees() -> None:
    quota = _Changing(TenantQuota(max_concurrency=1, max_wait_s=10))
    q = LocalQuotas(quota)
    a = await q.acquire("acme")
    held: list[str] = []
    scopes: dict[str, anyio.CancelScope] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(_hold, q, held, "queued", scopes)
        await _until(lambda: q.waiting("acme") == 1, "one request queued")
        quota.quota = TenantQuota(max_concurrency=3, max_wait_s=10)
        with anyio.fail_after(2):  # was: both waited out max_wait_s although two slots were free
            newcomer = await q.acquire("acme")
            await _until(lambda: held == ["queued"], "the queued request woken by the raise")
        assert q.in_flight("acme") == 3 and q.waiting("acme") == 0
        q.release(newcomer)
        tg.cancel_scope.cancel()
    q.release(a)
    assert q.in_flight("acme") == 0


async def test_a_raised_limit_is_applied_by_the_next_release_too() -> None:
    quota = _Changing(TenantQuota(max_concurrency=1, max_wait_s=10))
    q = LocalQuotas(quota)
    a = await q.acquire("acme")
    held: list[str] = []
    scopes: dict[str, anyio.CancelScope] = {}
    async with anyio.create_task_group() as tg:
        for name in ("w1", "w2", "w3"):
            tg.start_soon(_hold, q, held, name, scopes)
            await _queued(q, scopes, name)
        quota.quota = TenantQuota(max_concurrency=2, max_wait_s=10)
        q.release(a)  # frees one slot under a limit now 2: two waiters go in, first come first served
        await _until(lambda: len(held) == 2, "two admitted")
        assert sorted(held) == ["w1", "w2"]  # first come, first served (trio may run them in any order)
        assert q.in_flight("acme") == 2 and q.waiting("acme") == 1
        tg.cancel_scope.cancel()
    assert q.in_flight("acme") == 0 and q.waiting("acme") == 0


# -- a wait that times out as the caller is cancelled ends cancelled (issue 13 item 3) --------------


async def test_a_wait_timeout_in_the_cycle_of_an_outside_cancel_ends_cancelled(anyio_backend: str) -> None:
    """The wait's own timeout and an outside cancellation become due in one loop iteration (the
    loop is blocked past both): the request must end cancelled, not refused, holding nothing."""
    q = LocalQuotas(lambda t: TenantQuota(max_concurrency=1, max_wait_s=0.02))
    holder = await q.acquire("acme")
    outcome: list[str] = []

    async def request() -> None:
        try:
            lease = await q.acquire("acme")
        except QuotaExceeded:
            outcome.append("refused")
            return
        q.release(lease)
        outcome.append("admitted")

    if anyio_backend == "asyncio":
        import asyncio

        task = asyncio.create_task(request())
        await asyncio.sleep(0)  # queued: its 20 ms timeout is armed
        asyncio.get_running_loop().call_later(0.02, task.cancel)  # a native Task.cancel(), as 20 ms pass
        time.sleep(0.05)  # both become due in the same iteration
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        with anyio.CancelScope(deadline=anyio.current_time() + 0.02) as outside:
            async with anyio.create_task_group() as tg:
                tg.start_soon(request)
                await anyio.sleep(0)
                time.sleep(0.05)
                await anyio.sleep(0)
        assert outside.cancelled_caught
    assert outcome == []
    assert q.in_flight("acme") == 1 and q.waiting("acme") == 0
    q.release(holder)


# -- honest backpressure: retry_after_s from the ages of the calls in flight (issue 12) ---------------


async def _observe_holds(q: LocalQuotas, clock: ragguard.FakeClock, hold_s: float, n: int) -> None:
    for _ in range(n):
        lease = await q.acquire("acme")
        clock.advance(hold_s)
        q.release(lease)


async def test_a_caller_who_waits_as_told_is_admitted_when_the_holders_finish() -> None:
    clock = ragguard.FakeClock(100.0)
    q = LocalQuotas(lambda t: TenantQuota(max_concurrency=2), clock=clock)
    await _observe_holds(q, clock, 0.3, 5)  # calls hold a slot for 300 ms
    holders = [await q.acquire("acme"), await q.acquire("acme")]  # both start now
    with pytest.raises(QuotaExceeded) as info:
        await q.acquire("acme")
    told = info.value.retry_after_s
    assert 0.29 <= told <= 0.31  # was 0.15: hold x queue / limit, as if the two were half done
    clock.advance(told)
    if clock() >= holders[0].started + 0.3:  # the holders finish as expected
        for lease in holders:
            q.release(lease)
    retry = await q.acquire("acme")  # admitted at once
    assert retry is not None and q.in_flight("acme") == 1


async def test_retry_after_counts_the_ages_of_the_calls_in_flight() -> None:
    clock = ragguard.FakeClock(100.0)
    q = LocalQuotas(lambda t: TenantQuota(max_concurrency=2), clock=clock)
    await _observe_holds(q, clock, 0.3, 5)
    old = await q.acquire("acme")
    clock.advance(0.2)
    young = await q.acquire("acme")
    with pytest.raises(QuotaExceeded) as info:
        await q.acquire("acme")
    assert info.value.retry_after_s == pytest.approx(0.1)  # the older call is due in 100 ms
    clock.advance(0.1)
    q.release(old)
    assert await q.acquire("acme") is not None
    q.release(young)


async def test_retry_after_before_any_release_uses_the_ages_in_flight() -> None:
    clock = ragguard.FakeClock(100.0)
    q = LocalQuotas(lambda t: TenantQuota(max_concurrency=1), clock=clock)
    lease = await q.acquire("acme")
    clock.advance(0.15)  # nothing has finished yet; this call has run 150 ms
    with pytest.raises(QuotaExceeded) as info:
        await q.acquire("acme")
    assert info.value.retry_after_s == pytest.approx(0.15)  # was 0.01: "10 ms per call"
    q.release(lease)


async def test_retry_after_counts_the_callers_queued_ahead(deadline_clock: ragguard.FakeClock) -> None:
    clock = ragguard.FakeClock(100.0)
    q = LocalQuotas(lambda t: TenantQuota(max_concurrency=1, max_wait_s=60), clock=clock)
    await _observe_holds(q, clock, 0.3, 5)
    holder = await q.acquire("acme")
    held: list[Any] = []
    async with anyio.create_task_group() as tg:

        async def queued() -> None:
            held.append(await q.acquire("acme"))

        tg.start_soon(queued)
        await _until(lambda: q.waiting("acme") == 1, "one caller queued")
        clock.advance(0.1)
        with pytest.raises(QuotaExceeded) as info:
            with deadline(0):  # no time to wait: refused with the estimate
                await q.acquire("acme")
        told = info.value.retry_after_s
        assert told == pytest.approx(0.5)  # the holder's 200 ms left, then the queued caller's 300 ms
        clock.advance(0.2)
        q.release(holder)  # on time
        await _until(lambda: len(held) == 1, "the queued caller admitted")
        clock.advance(0.3)
        q.release(held[0])  # on time
    assert clock() == pytest.approx(100.0 + 5 * 0.3 + 0.1 + told)  # the refused caller's retry moment
    assert await q.acquire("acme") is not None


async def test_quota_waits_follow_the_guards_clock(anyio_backend: str) -> None:
    """One time source: on a FakeClock, a wait for a rate token lets fake time pass, and a wait for a
    slot ends when the test advances the clock past ``max_wait_s`` (nothing sleeps for real)."""
    if anyio_backend != "asyncio":
        pytest.skip("FakeClock timers cancel asyncio tasks; trio has its own MockClock")
    clock = ragguard.FakeClock()
    g = _guard(clock=clock, acme=TenantQuota(rate_per_s=2, burst=1, max_wait_s=5),
               solo=TenantQuota(max_concurrency=1, max_wait_s=3))
    async with g.tenant("acme"):
        pass
    started = time.monotonic()
    async with g.tenant("acme"):  # the next token is 0.5 s away: the clock's sleep lets it pass
        assert clock() == pytest.approx(0.5)
    assert time.monotonic() - started < 0.5

    outcome: list[BaseException | None] = []

    async def queued() -> None:
        try:
            async with g.tenant("solo"):
                outcome.append(None)
        except QuotaExceeded as exc:
            outcome.append(exc)

    async with g.tenant("solo"), anyio.create_task_group() as tg:
        tg.start_soon(queued)
        await _until(lambda: g.quotas.waiting("solo") == 1, "the second request queues")
        clock.advance(2.9)
        await anyio.sleep(0)
        assert outcome == []  # still within max_wait_s on the fake clock
        clock.advance(0.2)
        await _until(lambda: bool(outcome), "the wait times out")
    assert isinstance(outcome[0], QuotaExceeded) and outcome[0].reason == "concurrency"
    assert time.monotonic() - started < 2.0  # fake seconds, not real ones


async def test_a_slot_taken_for_a_request_admitted_elsewhere_is_counted_and_given_back() -> None:
    """The Redis quotas' fallback counts the requests Redis admitted (take_slot) so that, across a
    switch to local state, one replica never runs more than the limit; give_slot frees them."""
    g = _guard(acme=TenantQuota(max_concurrency=2, max_wait_s=0))
    quotas = g.quotas
    taken = [quotas.take_slot("acme") for _ in range(3)]  # may go past the limit: admitted elsewhere
    assert quotas.in_flight("acme") == 3
    with pytest.raises(QuotaExceeded):
        async with g.tenant("acme"):
            pass
    for lease in taken:
        quotas.give_slot(lease)
        quotas.give_slot(lease)  # idempotent
    assert quotas.in_flight("acme") == 0
    async with g.tenant("acme"):
        assert quotas.in_flight("acme") == 1
    assert quotas.take_slot("unlimited-tenant") is None
