"""The adaptive limiter's queue: grant order, shedding order, gradual rejection, waits on the Guard clock."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from overload_helpers import settle

from ragguard import FakeClock, Overloaded
from ragguard.overload._gradient import LimitSettings
from ragguard.overload._limiter import AdaptiveLimiter, Permit, QueueSettings


def _limiter(
    clock: FakeClock, *, limit: int = 2, max_queue: float = 2.0, early_queue: float = 2.0,
    max_wait_s: float = 10.0, seed: int = 1, weights: dict[str, float] | None = None,
) -> AdaptiveLimiter:
    lim = AdaptiveLimiter(
        "search",
        LimitSettings(min_limit=1, initial_limit=limit, max_limit=limit, probe_limit=limit, probe_samples=1),
        QueueSettings(max_queue=max_queue, early_queue=early_queue, max_wait_s=max_wait_s),
        clock=clock, rng=random.Random(seed), timers=clock,
        weight_of=(lambda t: (weights or {}).get(t, 1.0)),
    )
    assert lim.limit == limit
    return lim


async def _queue(lim: AdaptiveLimiter, tenant: str, priority: str, log: list[Any],
                 wait_s: float = 10.0) -> asyncio.Task[None]:
    async def one() -> None:
        try:
            permit = await lim.acquire(tenant, priority, wait_s)
        except Overloaded as exc:
            log.append(("shed", tenant, priority, exc.reason))
            return
        log.append(("granted", tenant, priority, permit))

    task = asyncio.create_task(one())
    await settle()
    return task


async def _end(lim: AdaptiveLimiter, tasks: list[asyncio.Task[None]], log: list[Any]) -> None:
    """Cancel the calls still queued, give back the slots granted: nothing left in flight or queued."""
    for t in tasks:
        t.cancel()
    await settle()
    for e in log:
        if e[0] == "granted":
            lim.release(e[3], None)
    assert lim.in_flight == 0 and lim.waiters == []


def _hold(lim: AdaptiveLimiter, tenant: str, n: int) -> list[Permit]:
    permits = [lim.try_acquire(tenant) for _ in range(n)]
    assert all(p is not None for p in permits)
    return permits  # type: ignore[return-value]


@pytest.mark.anyio
async def test_a_freed_slot_goes_to_the_highest_priority_then_the_lightest_tenant() -> None:
    clock = FakeClock(auto_advance=False)
    lim = _limiter(clock, limit=2, max_queue=10, early_queue=10)
    held = _hold(lim, "hoarder", 2)
    assert lim.try_acquire("acme") is None  # full: must queue
    log: list[Any] = []
    tasks = [
        await _queue(lim, "hoarder", "batch", log),
        await _queue(lim, "hoarder", "interactive", log),
        await _queue(lim, "acme", "interactive", log),
        await _queue(lim, "ops", "critical", log),
    ]
    for permit in held:
        lim.release(permit, None)
    await settle()
    assert [(e[1], e[2]) for e in log] == [("ops", "critical"), ("acme", "interactive")]
    for e in list(log):
        lim.release(e[3], None)
    await settle()
    assert [(e[1], e[2]) for e in log[2:]] == [("hoarder", "interactive"), ("hoarder", "batch")]
    for t in tasks:
        await t
    assert lim.waiters == []


@pytest.mark.anyio
async def test_a_full_queue_sheds_the_lowest_priority_then_the_heaviest_tenant() -> None:
    clock = FakeClock(auto_advance=False)
    lim = _limiter(clock, limit=2, max_queue=1.5, early_queue=1.5)  # room for 3 waiters
    held = _hold(lim, "hoarder", 2)  # the hoarder holds every slot: the heaviest tenant
    log: list[Any] = []
    tasks = [
        await _queue(lim, "acme", "interactive", log),
        await _queue(lim, "hoarder", "interactive", log),
        await _queue(lim, "nightly", "batch", log),
    ]
    assert log == []
    # full: an interactive arrival sheds the batch call first
    tasks.append(await _queue(lim, "globex", "interactive", log))
    assert log == [("shed", "nightly", "batch", "queue")]
    # then, within one priority, the heaviest tenant's call
    tasks.append(await _queue(lim, "initech", "interactive", log))
    assert log[1] == ("shed", "hoarder", "interactive", "queue")
    # an arrival that is itself the worst is refused at once
    tasks.append(await _queue(lim, "nightly", "batch", log))
    assert log[2] == ("shed", "nightly", "batch", "limit")
    assert lim.shed == {"batch": 2, "interactive": 1, "critical": 0}
    for permit in held:
        lim.release(permit, None)
    await settle()
    granted = [e[1] for e in log if e[0] == "granted"]
    assert sorted(granted) == ["acme", "globex"]
    await _end(lim, tasks, log)


@pytest.mark.anyio
async def test_a_tenant_whose_calls_are_shed_stays_the_heavy_one() -> None:
    """Issue 32: at a saturated limit each tenant is admitted about as often as the others. Counted
    by admissions alone, a heavy tenant whose calls were shed looked as light as a well-behaved one,
    and a well-behaved tenant's burst of three queued calls made it the heavier: its calls waited
    behind the heavy tenant's and ran out of time. A call asked for counts, admitted or not."""
    clock = FakeClock(auto_advance=False)
    lim = _limiter(clock, limit=2, max_queue=10, early_queue=10)
    held = _hold(lim, "other", 2)
    log: list[Any] = []
    for _ in range(8):  # the heavy tenant asks on and on, and is refused (no time to queue)
        await _queue(lim, "hoarder", "interactive", log, wait_s=0.0)
    assert [e[0] for e in log] == ["shed"] * 8
    log.clear()
    tasks = [await _queue(lim, "acme", "interactive", log) for _ in range(3)]  # a burst
    tasks.append(await _queue(lim, "hoarder", "interactive", log))
    assert lim.usage("acme") < lim.usage("hoarder")
    for permit in held:
        lim.release(permit, None)
    await settle()
    assert [e[1] for e in log] == ["acme", "acme"]  # the burst first, the heavy tenant after
    for e in log:
        lim.release(e[3], None)
    await settle()
    for e in log[2:]:
        lim.release(e[3], None)
    for t in tasks:
        await t
    assert [e[1] for e in log] == ["acme", "acme", "acme", "hoarder"]


@pytest.mark.anyio
async def test_a_light_tenants_burst_is_not_weighed_as_a_flood() -> None:
    """A queued call counts once in its tenant's usage, as asked for: counted again as queued, a
    burst of five from a tenant that sent nothing else weighed as much as seven from a tenant
    that keeps sending (its flood bounded by its quota), and the burst waited behind the flood."""
    clock = FakeClock(auto_advance=False)
    lim = _limiter(clock, limit=2, max_queue=10, early_queue=10)
    held = _hold(lim, "other", 2)
    log: list[Any] = []
    for _ in range(4):
        await _queue(lim, "hoarder", "interactive", log, wait_s=0.0)  # refused: no time to queue
    tasks = [await _queue(lim, "hoarder", "interactive", log) for _ in range(3)]
    tasks += [await _queue(lim, "acme", "interactive", log) for _ in range(5)]
    assert lim.usage("acme") == pytest.approx(5.0) and lim.usage("hoarder") == pytest.approx(7.0)
    for permit in held:
        lim.release(permit, None)
    await settle()
    assert [e[1] for e in log if e[0] == "granted"] == ["acme", "acme"]
    await _end(lim, tasks, log)


@pytest.mark.anyio
async def test_the_queue_rejects_gradually_as_it_fills() -> None:
    """From early_queue x limit on, an arrival sheds a call with a probability rising to 1 at the bound."""
    fills = {}
    for fill in (0, 2, 5, 8, 10):
        shed = 0
        trials = 400
        for seed in range(trials):
            clock = FakeClock(auto_advance=False)
            lim = _limiter(clock, limit=1, max_queue=10.0, early_queue=0.0, seed=seed)
            lim.try_acquire("a")
            lim.waiters.extend(_fake_waiter(lim, "b", "interactive") for _ in range(fill))
            try:
                lim._enqueue(_fake_waiter(lim, "c", "interactive"))
            except Overloaded:
                shed += 1
            else:
                shed += len(lim.waiters) <= fill  # someone else was shed to make room
        fills[fill] = shed / trials
    assert fills[0] == pytest.approx(1 / 11, abs=0.05)
    assert fills[5] == pytest.approx(6 / 11, abs=0.08)
    assert fills[10] == 1.0
    assert fills[0] < fills[2] < fills[5] < fills[8] < fills[10]


def _fake_waiter(lim: AdaptiveLimiter, tenant: str, priority: str) -> Any:
    from ragguard.overload._limiter import _Waiter

    return _Waiter(tenant, priority, next(lim._seq))


@pytest.mark.anyio
async def test_a_queued_call_waits_at_most_max_wait_s_of_the_guard_clock() -> None:
    clock = FakeClock(auto_advance=False)
    lim = _limiter(clock, limit=1, max_queue=4, early_queue=4)
    held = _hold(lim, "a", 1)
    log: list[Any] = []
    task = await _queue(lim, "b", "interactive", log, wait_s=0.5)
    clock.advance(0.49)
    await settle()
    assert log == []
    clock.advance(0.02)
    await settle()
    assert log == [("shed", "b", "interactive", "queue")]
    await task
    assert lim.waiters == [] and lim.in_flight == 1
    lim.release(held[0], None)
    assert lim.in_flight == 0


@pytest.mark.anyio
async def test_a_cancelled_waiter_leaves_the_queue_and_a_granted_one_gives_its_slot_back() -> None:
    clock = FakeClock(auto_advance=False)
    lim = _limiter(clock, limit=1, max_queue=4, early_queue=4)
    held = _hold(lim, "a", 1)
    log: list[Any] = []
    waiting = await _queue(lim, "b", "interactive", log)
    waiting.cancel()
    await settle()
    assert lim.waiters == [] and waiting.cancelled()

    granted = await _queue(lim, "c", "interactive", log)
    lim.release(held[0], None)  # the slot is handed to c...
    granted.cancel()  # ...which is cancelled before it runs again
    await settle()
    assert granted.cancelled() and log == []
    assert lim.in_flight == 0 and lim.waiters == []  # the slot it was handed went back


@pytest.mark.anyio
async def test_no_queue_sheds_at_once_and_the_deadline_refuses_a_wait_it_cannot_afford() -> None:
    clock = FakeClock(auto_advance=False)
    lim = _limiter(clock, limit=1, max_queue=0.0, early_queue=0.0)
    _hold(lim, "a", 1)
    with pytest.raises(Overloaded) as info:
        await lim.acquire("b", "critical", 5.0)
    assert info.value.reason == "limit" and info.value.retry_after_s > 0
    with pytest.raises(Overloaded) as info:
        await lim.acquire("b", "critical", 0.0, by_deadline=True)  # the deadline left no time to wait
    assert info.value.reason == "deadline"
    with pytest.raises(Overloaded) as info:
        await lim.acquire("b", "critical", 0.0)  # no wait allowed (max_wait_s 0): no place to queue
    assert info.value.reason == "limit"
    assert "overloaded" in str(info.value) and "'b'" in str(info.value)


def test_on_trio_a_queued_call_is_granted_or_shed_after_its_wait() -> None:
    import trio

    clock = FakeClock(auto_advance=False)
    lim = _limiter(clock, limit=1, max_queue=4, early_queue=4)
    held = _hold(lim, "a", 1)
    got: list[Any] = []

    async def waiter(wait_s: float) -> None:
        try:
            got.append(await lim.acquire("b", "interactive", wait_s))
        except Overloaded as exc:
            got.append(exc.reason)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter, 0.05)  # trio: the loop's own clock bounds the wait
            await trio.sleep(0.2)
            assert got == ["queue"] and lim.waiters == []
            nursery.start_soon(waiter, 5.0)
            await trio.sleep(0.01)
            lim.release(held[0], None)

    trio.run(main)
    assert isinstance(got[1], Permit) and lim.in_flight == 1
    lim.release(got[1], None)
    assert lim.in_flight == 0
