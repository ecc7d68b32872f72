"""Property tests (Hypothesis): quota invariants under random arrivals, holds and cancellations."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragguard
from ragguard import Guard, Policy, QuotaExceeded, TenantQuota

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

request = st.tuples(
    st.integers(0, 6),  # checkpoints before it arrives
    st.integers(0, 6),  # checkpoints it holds its slot
    st.one_of(st.none(), st.integers(0, 20)),  # driver step at which it is cancelled, if ever
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limit=st.integers(1, 4),
    may_wait=st.booleans(),
    requests=st.lists(request, min_size=1, max_size=30),
)
async def test_concurrency_never_exceeds_the_limit_and_nothing_leaks(
    limit: int, may_wait: bool, requests: list[tuple[int, int, int | None]]
) -> None:
    g = Guard(Policy(tenants={"t": TenantQuota(max_concurrency=limit, max_wait_s=5 if may_wait else 0)}))
    inside = 0
    peak = 0
    admitted = 0

    async def one(scope: anyio.CancelScope, arrive: int, hold: int) -> None:
        nonlocal inside, peak, admitted
        with scope:
            for _ in range(arrive):
                await anyio.sleep(0)
            try:
                async with g.tenant("t"):
                    inside += 1
                    admitted += 1
                    peak = max(peak, inside)
                    try:
                        for _ in range(hold):
                            await anyio.sleep(0)
                    finally:
                        inside -= 1
            except QuotaExceeded:
                pass

    scopes = [anyio.CancelScope() for _ in requests]
    async with anyio.create_task_group() as tg:
        for scope, (arrive, hold, _) in zip(scopes, requests, strict=True):
            tg.start_soon(one, scope, arrive, hold)
        for step in range(21):
            for scope, (_, _, cancel_at) in zip(scopes, requests, strict=True):
                if cancel_at == step:
                    scope.cancel()
            await anyio.sleep(0)
    assert peak <= limit
    assert inside == 0
    assert g.quotas.in_flight("t") == 0
    assert g.quotas.waiting("t") == 0
    if g.quotas._buckets.get("t") is not None:
        assert not g.quotas._buckets["t"].waiters
    if may_wait and all(c is None for _, _, c in requests):
        assert admitted == len(requests)  # with time to wait and no cancellation, everyone gets in


@settings(max_examples=60, deadline=None)
@given(
    rate=st.sampled_from([0.5, 1.0, 3.0, 10.0]),
    burst=st.integers(1, 5),
    gaps=st.lists(st.floats(0.0, 2.0, allow_nan=False), min_size=1, max_size=60),
)
async def test_rate_never_admits_more_than_burst_plus_rate_times_window(
    rate: float, burst: int, gaps: list[float]
) -> None:
    clock = ragguard.FakeClock()
    g = Guard(Policy(tenants={"t": TenantQuota(rate_per_s=rate, burst=burst)}), clock=clock)
    admitted: list[float] = []
    for gap in gaps:
        clock.advance(gap)
        try:
            async with g.tenant("t"):
                admitted.append(clock())
        except QuotaExceeded as exc:
            assert exc.reason == "rate"
            assert 0 < exc.retry_after_s <= 1.0 / rate + 1e-9
    for i, start in enumerate(admitted):
        for j in range(i, len(admitted)):
            window = admitted[j] - start
            assert j - i + 1 <= burst + rate * window + 1e-6
