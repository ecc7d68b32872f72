"""Issue 11, scenarios 2, 3 and 5: RedisQuotas across a crowd, a blip of Redis and cancellation,
against a real redis-server (and a fault proxy for the blips and slow replies).

2. One replica never runs more than max_concurrency, across a burst that fills the client pool and
   across the switches to and from the local fallback.
3. Zero leases stay in Redis once calls end, whatever happened to the link in between.
5. A rate token taken by an admission whose caller was cancelled before the reply came back is
   refunded, as the in-memory quotas refund it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from distributed_helpers import PATIENT, PATIENT_S, leases_in, make_client, until

from ragguard import FakeClock, Guard, Policy, QuotaExceeded, TenantQuota, events
from ragguard.redis import RedisBackend, RedisQuotas, SharedStateDegraded
from ragguard.redis._keys import quota_keys
from ragguard.redis._link import SharedStateUnavailable

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


class InFlight:
    """Counts the requests running at once."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    async def run(self, guard_or_quotas: Any, tenant: str, hold_s: float) -> None:
        if isinstance(guard_or_quotas, Guard):
            async with guard_or_quotas.tenant(tenant):
                await self._hold(hold_s)
        else:
            lease = await guard_or_quotas.acquire(tenant)
            try:
                await self._hold(hold_s)
            finally:
                guard_or_quotas.release(lease)

    async def _hold(self, hold_s: float) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await asyncio.sleep(hold_s)
        finally:
            self.now -= 1


async def test_a_burst_that_fills_the_pool_never_over_admits(redis_server: Any, seen: list[Any]) -> None:
    # patient sockets and link (PATIENT_S): on a loaded machine the burst's 32 new connections and
    # its commands wait for a CPU, which is not an outage; the switch has tests of its own (below)
    client = make_client(redis_server.host, redis_server.port, max_connections=64,
                         socket_timeout=PATIENT_S, socket_connect_timeout=PATIENT_S)
    g = Guard(Policy(tenants={"acme": TenantQuota(max_concurrency=4)}),
              backend=RedisBackend(client, **PATIENT))
    flight = InFlight()
    try:
        results = await asyncio.gather(*(flight.run(g, "acme", 0.05) for _ in range(100)),
                                       return_exceptions=True)
        assert flight.peak <= 4
        assert sum(r is None for r in results) >= 4
        assert all(r is None or isinstance(r, QuotaExceeded) for r in results)
        assert g.quotas.shared and not [e for e in seen if isinstance(e, SharedStateDegraded)]
    finally:
        await g.aclose()
        await client.aclose()


async def admitted(q: RedisQuotas, tenant: str = "acme") -> Any:
    try:
        return await q.acquire(tenant)
    except QuotaExceeded:
        return None


async def test_an_admission_redis_answers_after_the_switch_waits_for_a_free_slot_of_the_fallback(
    redis_server: Any, fault_proxy: Any, seen: list[Any]
) -> None:
    # Redis admits a request, its reply comes back late: the link has switched to the fallback
    # meanwhile (two other commands timed out), and the fallback has admitted a request of the
    # tenant in the one slot. The late admission must not run as well (it ran: 2 for a limit of 1).
    proxy = fault_proxy(redis_server)
    client = make_client(proxy.host, proxy.port, socket_timeout=5.0)
    quota = TenantQuota(max_concurrency=1)
    q = RedisQuotas(lambda t: quota, client, redis_timeout_s=1.0, probe_every_s=60.0)
    at_switch: list[Any] = []

    def admit_at_the_switch(event: Any) -> None:
        if isinstance(event, SharedStateDegraded):
            at_switch.append(q.admit_now("acme"))  # a request arriving then: the fallback admits it

    unsubscribe = events.bus.subscribe(admit_at_the_switch)
    try:
        # three connections open and the script loaded: one round trip per command from now on
        for lease in await asyncio.gather(*(q.acquire(f"warm{i}") for i in range(3))):
            q.release(lease)
        await q._flush_all()
        proxy.set_latency(to_client_s=2.0)
        lost = [asyncio.create_task(admitted(q, "other")) for _ in range(2)]  # time out at ~1 s
        await asyncio.sleep(0.5)
        proxy.set_latency(to_client_s=0.75)
        late = asyncio.create_task(admitted(q, "acme"))  # admitted by Redis, answered at ~1.25 s
        await asyncio.gather(*lost)
        assert not q.shared and len(at_switch) == 1 and at_switch[0] is not None
        assert await late is None  # refused: the fallback's one slot is taken
        assert q.in_flight("acme") == 1
        q.release(at_switch[0])
    finally:
        unsubscribe()
        await q.aclose()
        await client.aclose()


async def test_the_fallback_counts_the_requests_redis_admitted(redis_server: Any, fault_proxy: Any) -> None:
    proxy = fault_proxy(redis_server)
    client = make_client(proxy.host, proxy.port)
    q = RedisQuotas(lambda t: TenantQuota(max_concurrency=4), client, probe_every_s=60.0)
    try:
        running = [await q.acquire("acme") for _ in range(4)]
        assert q.held() == 4  # admitted through Redis
        proxy.stop()  # Redis goes away while the four still run
        during = [await admitted(q) for _ in range(10)]
        assert not q.shared
        assert during == [None] * 10  # the fallback knows the four: nothing more is admitted
        for lease in running[:2]:
            q.release(lease)
        more = [await admitted(q) for _ in range(5)]
        assert sum(lease is not None for lease in more) == 2  # exactly the two slots that freed
    finally:
        await q.aclose()
        await client.aclose()


async def test_redis_counts_the_requests_the_fallback_admitted(redis_server: Any, fault_proxy: Any) -> None:
    proxy = fault_proxy(redis_server)
    client = make_client(proxy.host, proxy.port)
    direct = make_client(redis_server.host, redis_server.port)
    quota = TenantQuota(max_concurrency=4)
    q = RedisQuotas(lambda t: quota, client, probe_every_s=0.2, holder_id="blipped")
    other = RedisQuotas(lambda t: quota, direct, holder_id="other")
    try:
        proxy.stop()
        local = [await admitted(q) for _ in range(3)]
        assert not q.shared and all(lease is not None for lease in local)  # by the fallback
        proxy.restart()
        assert await until(lambda: q.shared, 3.0) < 3.0
        assert q.held() == 3 and q.uncounted() == 0  # q put its three into Redis before it came back
        assert await leases_in(direct, quota_keys("acme")[0]) == 3
        from_other = [await admitted(other) for _ in range(4)]
        assert sum(lease is not None for lease in from_other) == 1  # 3 + 1 = max_concurrency
    finally:
        await q.aclose()
        await other.aclose()
        await client.aclose()
        await direct.aclose()


async def test_a_put_back_that_fails_once_is_tried_again(redis_server: Any, fault_proxy: Any) -> None:
    """The probe answered but the first command putting the leases back fails (one timeout on a
    loaded machine, or on a cluster a master not back yet). The replica stays on local state and
    tries again: it is back on shared state only once Redis counts every lease it runs, so another
    replica never admits on its behalf."""
    proxy = fault_proxy(redis_server)
    client = make_client(proxy.host, proxy.port)
    direct = make_client(redis_server.host, redis_server.port)
    quota = TenantQuota(max_concurrency=4)
    q = RedisQuotas(lambda t: quota, client, probe_every_s=0.2, holder_id="blipped")
    other = RedisQuotas(lambda t: quota, direct, holder_id="other")
    call = q._link.call_restoring
    failed: list[str] = []
    counted_when_back: list[int] = []

    async def first_put_back_fails(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append("put back")
            raise SharedStateUnavailable("quotas: AttemptTimeout (injected)")
        return await call(fn, *args, **kwargs)

    q._link.call_restoring = first_put_back_fails  # type: ignore[method-assign]
    q._link.on_restored.append(lambda: counted_when_back.append(q.uncounted()))
    try:
        proxy.stop()
        local = [await admitted(q) for _ in range(3)]
        assert not q.shared and all(lease is not None for lease in local)
        proxy.restart()
        assert await until(lambda: q.shared, 3.0) < 3.0
        assert failed == ["put back"] and counted_when_back == [0]  # back only once all were in
        assert await leases_in(direct, quota_keys("acme")[0]) == 3 and q.held() == 3
        from_other = [await admitted(other) for _ in range(4)]
        assert sum(lease is not None for lease in from_other) == 1  # 3 + 1 = max_concurrency
    finally:
        await q.aclose()
        await other.aclose()
        await client.aclose()
        await direct.aclose()


async def test_no_lease_outlives_its_call_after_a_blip(redis_server: Any, fault_proxy: Any) -> None:
    proxy = fault_proxy(redis_server)
    client = make_client(proxy.host, proxy.port)
    direct = make_client(redis_server.host, redis_server.port)
    q = RedisQuotas(lambda t: TenantQuota(max_concurrency=3), client, probe_every_s=0.2)
    leases_key = quota_keys("acme")[0]
    try:
        running = [await q.acquire("acme") for _ in range(3)]
        assert await leases_in(direct, leases_key) == 3
        proxy.stop()  # a short loss of Redis (its data stays) ...
        await admitted(q)
        await admitted(q)
        assert not q.shared
        for lease in running:  # ... during which the calls end
            q.release(lease)
        proxy.restart()
        assert await until(lambda: q.shared, 3.0) < 3.0
        left: list[int] = []

        async def count() -> None:
            left.append(await leases_in(direct, leases_key))

        assert await until(lambda: left[-1] == 0, 2.0, count) < 2.0  # zero leases once calls end
        again = [await q.acquire("acme") for _ in range(3)]  # nothing in flight: all admitted
        assert q.held() == 3
        for lease in again:
            q.release(lease)
    finally:
        await q.aclose()
        await client.aclose()
        await direct.aclose()


async def test_after_a_burst_every_one_at_a_time_request_is_admitted(redis_server: Any) -> None:
    # Patient timeouts (the subject is leaked leases, not a slow Redis): with the 0.25 s default a
    # loaded machine can time out two admissions of the burst in a row, and a degraded link does
    # not send its releases at close, so leases would stay in Redis without any leak.
    client = make_client(redis_server.host, redis_server.port, max_connections=64,
                         socket_timeout=PATIENT_S, socket_connect_timeout=PATIENT_S)
    g = Guard(Policy(tenants={"acme": TenantQuota(max_concurrency=4)}),
              backend=RedisBackend(client, quotas={"redis_timeout_s": PATIENT_S}))
    flight = InFlight()
    try:
        await asyncio.gather(*(flight.run(g, "acme", 0.01) for _ in range(200)), return_exceptions=True)
        for _ in range(40):
            await flight.run(g, "acme", 0.0)  # raises QuotaExceeded if a lease leaked
        await g.aclose()
        assert await leases_in(client, quota_keys("acme")[0]) == 0
    finally:
        await g.aclose()
        await client.aclose()


@pytest.mark.parametrize("quota", [TenantQuota(rate_per_s=0.25, burst=1),
                                   TenantQuota(rate_per_s=0.25, burst=1, max_concurrency=5)],
                         ids=["rate", "rate+concurrency"])
async def test_a_cancelled_admission_refunds_its_rate_token(
    redis_server: Any, fault_proxy: Any, fake_clock: FakeClock, quota: TenantQuota
) -> None:
    proxy = fault_proxy(redis_server)
    slow = make_client(proxy.host, proxy.port, socket_timeout=2.0)
    direct = make_client(redis_server.host, redis_server.port)
    q = RedisQuotas(lambda t: quota, slow, clock=fake_clock, redis_timeout_s=1.0, holder_id="q")
    other = RedisQuotas(lambda t: quota, direct, clock=fake_clock, holder_id="other")
    try:
        warm = await other.acquire("warm-up")  # the scripts are loaded: no NOSCRIPT round trip
        other.release(warm)
        await slow.ping()  # and q's connection is open: no handshake round trips
        proxy.set_latency(to_client_s=0.3)
        attempt = asyncio.create_task(q.acquire("acme"))
        await asyncio.sleep(0.15)  # the script ran: the tenant's one token is taken ...
        with pytest.raises(QuotaExceeded):
            await other.acquire("acme")
        attempt.cancel()  # ... and the caller goes away before the reply
        with pytest.raises(asyncio.CancelledError):
            await attempt
        proxy.heal()
        got: list[Any] = []

        async def try_other() -> None:
            if not got:
                lease = await admitted(other)
                if lease is not None:
                    got.append(lease)

        took = await until(lambda: bool(got), 3.0, try_other)
        assert took < 1.5, took  # refunded: the clock stands still, and the token is 4 s away
    finally:
        await q.aclose()
        await other.aclose()
        await slow.aclose()
        await direct.aclose()


async def test_leases_lost_in_a_restart_are_counted_again_without_an_outage(redis_server: Any) -> None:
    """Redis restarts (its data lost) while a replica runs calls and sends nothing: its link never
    degrades, and still its calls hold their slots in Redis again within one renewal (lease_s / 3),
    so another replica cannot admit on their behalf for long."""
    quota = TenantQuota(max_concurrency=4)
    a_client = make_client(redis_server.host, redis_server.port)
    q = RedisQuotas(lambda t: quota, a_client, lease_s=1.5, holder_id="a")
    b_client = make_client(redis_server.host, redis_server.port)
    other = RedisQuotas(lambda t: quota, b_client, holder_id="b")
    try:
        running = [await q.acquire("acme") for _ in range(3)]
        redis_server.restart()
        assert q.shared  # nothing was sent meanwhile: no outage seen
        left: list[int] = []

        async def count() -> None:
            left.append(await leases_in(b_client, quota_keys("acme")[0]))

        assert await until(lambda: left[-1] == 3, 2.0, count) < 2.0  # put back by the renewal
        from_other = [await admitted(other) for _ in range(4)]
        assert sum(lease is not None for lease in from_other) == 1  # 3 + 1 = max_concurrency
        for lease in running:
            q.release(lease)
    finally:
        await q.aclose()
        await other.aclose()
        await a_client.aclose()
        await b_client.aclose()


async def test_a_request_waiting_in_the_fallback_when_redis_returns_is_decided_by_redis(
    redis_server: Any, fault_proxy: Any
) -> None:
    """Issue 21 item 6: a request queued in the fallback during the outage and granted after the
    restore used to run as a local lease Redis never counted; now Redis decides it."""
    proxy = fault_proxy(redis_server)
    client = make_client(proxy.host, proxy.port)
    direct = make_client(redis_server.host, redis_server.port)
    quota = TenantQuota(max_concurrency=2, max_wait_s=5.0)
    q = RedisQuotas(lambda t: quota, client, probe_every_s=0.2, holder_id="q")
    other = RedisQuotas(lambda t: TenantQuota(max_concurrency=2), direct, holder_id="other")
    waiter: asyncio.Task[Any] | None = None
    try:
        proxy.stop()
        local = [await q.acquire("acme") for _ in range(2)]  # the fallback's two slots
        assert not q.shared
        waiter = asyncio.create_task(q.acquire("acme"))  # queued in the fallback
        await asyncio.sleep(0.05)
        proxy.restart()
        assert await until(lambda: q.shared, 3.0) < 3.0
        assert await leases_in(direct, quota_keys("acme")[0]) == 2  # the two local leases went in first
        with pytest.raises(QuotaExceeded):
            await other.acquire("acme")  # 2 of 2: nobody admits on their behalf
        q.release(local[0])  # the fallback hands its slot to the waiter, after the restore
        got = await asyncio.wait_for(waiter, 3.0)
        assert got.shared  # Redis admitted it (the old code ran it as a local lease)
        assert await leases_in(direct, quota_keys("acme")[0]) == 2
        with pytest.raises(QuotaExceeded):
            await other.acquire("acme")
        q.release(got)
        q.release(local[1])
    finally:
        if waiter is not None and not waiter.done():
            waiter.cancel()
        await q.aclose()
        await other.aclose()
        await client.aclose()
        await direct.aclose()
