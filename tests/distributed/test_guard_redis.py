"""`Guard(policy, redis=client)`: the guard's own breakers and tenant quotas live in Redis."""

from __future__ import annotations

from typing import Any

import pytest
from distributed_helpers import PATIENT

import ragguard
from ragguard import BreakerState, Guard, Policy, QuotaExceeded, TenantQuota
from ragguard.redis import RedisBackend, RedisQuotas, SharedCircuitBreaker

pytestmark = pytest.mark.anyio


async def test_two_guards_on_one_redis_share_quota_and_breaker_state(client: Any) -> None:
    policy = Policy(tenants={"acme": TenantQuota(max_concurrency=1, max_wait_s=0.3)})
    a = Guard(policy, backend=RedisBackend(client, prefix="t-share", **PATIENT))
    b = Guard(policy, backend=RedisBackend(client, prefix="t-share", **PATIENT))
    try:
        assert isinstance(a.quotas, RedisQuotas)
        assert isinstance(a.breaker("vector_store"), SharedCircuitBreaker)

        async with a.tenant("acme"):  # replica a holds the tenant's only slot ...
            with pytest.raises(QuotaExceeded) as info:
                async with b.tenant("acme"):  # ... so replica b is refused
                    pass
            assert info.value.tenant == "acme"
        async with b.tenant("acme"):  # released on exit (in the background): b gets it within its wait
            pass

        async def down(vec: list[float], k: int) -> list[str]:
            raise ConnectionRefusedError("vector store down")

        search_a = a.guard("vector_store")(down)
        for _ in range(6):
            with pytest.raises((ConnectionRefusedError, ragguard.BreakerOpen)):
                await search_a([0.0], 3)
        shared_b = b.breaker("vector_store")
        await a.breaker("vector_store").refresh()  # a sends its outcomes now ...
        await shared_b.refresh()  # ... and b reads the shared state now instead of within its staleness bound
        assert shared_b.state is BreakerState.OPEN
    finally:
        await a.aclose()
        await b.aclose()


async def test_redis_must_be_an_async_client() -> None:
    with pytest.raises(ragguard.ConfigError, match="redis"):
        Guard(backend=RedisBackend("redis://127.0.0.1:6379"))
