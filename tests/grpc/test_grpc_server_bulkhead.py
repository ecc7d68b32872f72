"""One greedy tenant must not cost a well-behaved one its calls at a real gRPC server's door.

grpc.aio counts a call against ``maximum_concurrent_rpcs`` from its arrival, the wait in its
tenant's quota included, and refuses the excess before the interceptor knows the tenant. The
interceptor's ``max_concurrent_rpcs`` keeps the door below that limit by tenant.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from grpc import aio
from grpc_helpers import Behaviors, call_kind, method, serving

import ragguard
from ragguard import ConfigError, Policy, TenantQuota
from ragguard.grpc import GuardServerInterceptor

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

CAPACITY = 8
FLOOD = (("x-tenant-id", "flood"),)
CALM = (("x-tenant-id", "calm"),)


def flood_guard(flood_wait_s: float = 2.0) -> ragguard.Guard:
    # the real clock: the handlers hold their calls for real time
    return ragguard.Guard(Policy(tenants={
        "flood": TenantQuota(max_concurrency=2, max_wait_s=flood_wait_s),  # 2 s: a long queue in its quota
        "calm": TenantQuota(max_concurrency=4, max_wait_s=0.5),
    }))


CALM_CALLS = 38


async def flood_and_calm(target: str, *, workers: int = 24, within_s: float = 20.0) -> Counter[Any]:
    """``workers`` callers of tenant ``flood`` each send again as soon as a call ends, for as long
    as tenant ``calm`` sends its CALM_CALLS calls, one every 40 ms (fewer only past ``within_s``, a
    bound on a stalled run). Each call holds the server 20 ms. Counts outcomes."""
    counts: Counter[Any] = Counter()
    loop = asyncio.get_running_loop()
    start = loop.time()
    done = asyncio.Event()
    async with aio.insecure_channel(target) as flood_ch, aio.insecure_channel(target) as calm_ch:
        flood, calm = method(flood_ch, "Unary"), method(calm_ch, "Unary")

        async def flooder() -> None:
            while not done.is_set() and loop.time() - start < within_s:
                try:
                    await flood(b"sleep:0.02", metadata=FLOOD, timeout=5)
                    counts["flood", "OK"] += 1
                except aio.AioRpcError as exc:
                    counts["flood", exc.code().name, exc.details()] += 1

        async def calm_caller() -> None:
            try:
                for sent in range(1, CALM_CALLS + 1):
                    if loop.time() - start >= within_s:
                        break
                    try:
                        await calm(b"sleep:0.02", metadata=CALM, timeout=5)
                        counts["calm", "OK"] += 1
                    except aio.AioRpcError as exc:
                        counts["calm", exc.code().name, exc.details()] += 1
                    await asyncio.sleep(max(0.0, sent * 0.04 - (loop.time() - start)))
            finally:
                done.set()

        await asyncio.gather(calm_caller(), *(flooder() for _ in range(workers)))
    return counts


def calm_success(counts: Counter[Any]) -> float:
    calm = sum(n for key, n in counts.items() if key[0] == "calm")
    return counts["calm", "OK"] / calm


@pytest.mark.parametrize("grpc_limit", [CAPACITY, 2 * CAPACITY])
async def test_without_a_door_bound_the_flood_costs_the_calm_tenant_its_calls(grpc_limit: int) -> None:
    """What main did: gRPC's own limit refuses the calm tenant's calls, the flood's queued calls
    holding the server's slots (raising that limit alone does not help)."""
    interceptor = GuardServerInterceptor(guard=flood_guard())
    async with serving(Behaviors(), [interceptor], maximum_concurrent_rpcs=grpc_limit) as target:
        counts = await flood_and_calm(target)
    refused_by_grpc = sum(n for key, n in counts.items()
                          if key[0] == "calm" and key[2:] == ("Concurrent RPC limit exceeded!",))
    assert refused_by_grpc > 0, counts
    assert calm_success(counts) < 0.99, counts


@pytest.mark.parametrize("flood_wait_s", [2.0, 0.0], ids=["flood-queues", "flood-refused-at-once"])
async def test_the_calm_tenant_keeps_its_calls_while_the_flood_is_refused(flood_wait_s: float) -> None:
    """The door holds at most CAPACITY calls, and the flood gives way first, whether its excess
    queues in its quota (shed by the door) or its quota refuses it at once: a refusal gives its
    seat back at once, so the flood's refusals in flight (as many as its callers) never fill the
    door. gRPC's own limit is unset, as docs/grpc.md says: it would count those refusals too."""
    interceptor = GuardServerInterceptor(guard=flood_guard(flood_wait_s), max_concurrent_rpcs=CAPACITY)
    async with serving(Behaviors(), [interceptor], maximum_concurrent_rpcs=None) as target:
        counts = await flood_and_calm(target)
    calm = sum(n for key, n in counts.items() if key[0] == "calm")
    assert calm == CALM_CALLS, counts
    assert calm_success(counts) >= 0.99, counts
    flood_refused = sum(n for key, n in counts.items() if key[:2] == ("flood", "RESOURCE_EXHAUSTED"))
    assert flood_refused > 0 and counts["flood", "OK"] > 0, counts
    assert interceptor.bulkhead is not None and interceptor.bulkhead.held == 0  # every seat given back


KINDS = ["Unary", "StreamGen", "ClientStream", "BidiGen"]  # the four kinds of RPC


ONE_AT_A_TIME = Policy(tenants={"flood": TenantQuota(max_concurrency=1, max_wait_s=10.0)})


@asynccontextmanager
async def one_running_one_waiting(
    kind: str, interceptor: GuardServerInterceptor, behaviors: Behaviors
) -> AsyncIterator[tuple[Any, asyncio.Future[Any], asyncio.Future[Any]]]:
    """A server behind ``interceptor`` where tenant ``flood`` (one call at a time) runs one call
    of ``kind``, held in its handler, and has a second waiting in its quota: yields the channel
    and the two calls."""
    bulkhead = interceptor.bulkhead
    assert bulkhead is not None
    async with serving(behaviors, [interceptor]) as target, aio.insecure_channel(target) as ch:
        running = asyncio.ensure_future(call_kind(ch, kind, b"hold", metadata=FLOOD, timeout=10))
        await asyncio.wait_for(behaviors.entered.wait(), 5)
        waiting = asyncio.ensure_future(call_kind(ch, kind, b"second", metadata=FLOOD, timeout=10))
        for _ in range(200):
            if bulkhead.waiting("flood"):
                break
            await asyncio.sleep(0.005)
        assert bulkhead.holding("flood") == 2 and bulkhead.waiting("flood") == 1
        yield ch, running, waiting


@pytest.mark.parametrize("kind", KINDS)
async def test_a_waiting_call_of_the_heaviest_tenant_is_shed_for_a_lighter_arrival(kind: str) -> None:
    """Server full (capacity 2, no headroom): flood holds one running call and one waiting in its
    quota; a calm arrival sheds the waiting one (RESOURCE_EXHAUSTED, retry-after) and runs."""
    guard = ragguard.Guard(ONE_AT_A_TIME)
    interceptor = GuardServerInterceptor(guard=guard, max_concurrent_rpcs=2, headroom=0)
    behaviors = Behaviors()
    async with one_running_one_waiting(kind, interceptor, behaviors) as (ch, running, waiting):
        got = await call_kind(ch, kind, b"calm", metadata=CALM, timeout=5)
        assert b'"tenant": "calm"' in got[0]
        with pytest.raises(aio.AioRpcError) as info:
            await waiting
        assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        trailing = dict(info.value.trailing_metadata() or ())
        assert float(trailing["retry-after"]) > 0
        assert "server" in (info.value.details() or "")
        behaviors.release.set()
        await running
    bulkhead = interceptor.bulkhead
    assert bulkhead is not None and bulkhead.held == 0 and bulkhead.shed == 1 and bulkhead.refused == 0
    assert guard.quotas.in_flight("flood") == 0 and guard.quotas.waiting("flood") == 0


@pytest.mark.parametrize("kind", KINDS)
async def test_a_cancelled_call_gives_back_its_seat_and_its_quota_slot(kind: str) -> None:
    guard = ragguard.Guard(ONE_AT_A_TIME)
    interceptor = GuardServerInterceptor(guard=guard, max_concurrent_rpcs=4)
    bulkhead = interceptor.bulkhead
    assert bulkhead is not None
    async with one_running_one_waiting(kind, interceptor, Behaviors()) as (_, running, waiting):
        waiting.cancel()  # the queued one (its client leaves)
        running.cancel()  # and the running one
        for _ in range(200):
            if bulkhead.held == 0:
                break
            await asyncio.sleep(0.005)
        for call in (waiting, running):
            with pytest.raises(asyncio.CancelledError):
                await call
    assert bulkhead.held == 0 and bulkhead.holding("flood") == 0
    assert guard.quotas.in_flight("flood") == 0 and guard.quotas.waiting("flood") == 0


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_concurrent_rpcs": 0}, "max_concurrent_rpcs"),
        ({"max_concurrent_rpcs": True}, "max_concurrent_rpcs"),
        ({"max_concurrent_rpcs": "16"}, "max_concurrent_rpcs"),
        ({"max_concurrent_rpcs": 8, "headroom": 8}, "headroom"),
        ({"max_concurrent_rpcs": 8, "headroom": -1}, "headroom"),
        ({"headroom": 2}, "headroom"),
    ],
)
def test_bad_options_are_config_errors_naming_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        GuardServerInterceptor(**options)
    assert info.value.field == field
    assert field in str(info.value)
