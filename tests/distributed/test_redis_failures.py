"""When ragguard's Redis stops or slows down, every component falls back to local state within a
bounded time, logs once, emits SharedStateDegraded, never fails a user's call, and goes back to
shared state (SharedStateRestored) when Redis answers again. Real redis-server, real fault proxy."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from distributed_helpers import make_client, until

from ragguard import BreakerState, CircuitBreaker, QuotaExceeded, TenantQuota
from ragguard.redis import RedisQuotas, SharedCircuitBreaker, SharedStateDegraded, SharedStateRestored
from ragguard.redis._quotas import SharedLease

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(40)]

FALLBACK_WITHIN_S = 1.5  # flush 0.1 s + 2 failed commands (each <= redis_timeout_s 0.25 s) + slack
RESTORE_WITHIN_S = 3.0   # probe_every_s 0.3 s + reconnect + one flush + slack


def of(kind: type, seen: list[Any], component: str) -> list[Any]:
    return [e for e in seen if isinstance(e, kind) and e.component == component]


def shared_breaker(client: Any) -> SharedCircuitBreaker:
    return SharedCircuitBreaker(CircuitBreaker("search", minimum_calls=4, window_size=4), client,
                                probe_every_s=0.3)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "ragguard.distributed" and r.levelno == logging.WARNING]


async def test_breaker_survives_redis_stopping_and_returns(redis_server: Any, seen: list[Any],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "ragguard.distributed")
    client = make_client(redis_server.host, redis_server.port)
    b = await shared_breaker(client).start()
    calls = 0

    async def user_call() -> None:
        nonlocal calls
        b.on_result(b.acquire(), 0.001, None)  # must never raise: the dependency is healthy
        calls += 1

    try:
        assert b.shared
        redis_server.stop()
        took = await until(lambda: not b.shared, 5.0, user_call)
        assert took <= FALLBACK_WITHIN_S
        for _ in range(20):
            await user_call()
        await asyncio.sleep(0.05)  # events are delivered on the next loop iterations
        assert len(of(SharedStateDegraded, seen, "breaker:search")) == 1
        assert len(warnings_of(caplog)) == 1  # logged once, however many calls ran meanwhile
        # the local breaker now decides: a failing dependency still trips this replica
        for _ in range(4):
            if b.state is BreakerState.OPEN:
                break
            b.on_result(b.acquire(), 0.001, ConnectionRefusedError("store down"))
        assert b.state is BreakerState.OPEN and b.wrapped.state is BreakerState.OPEN

        redis_server.start()  # same port, empty
        took = await until(lambda: b.shared, 10.0)
        assert took <= RESTORE_WITHIN_S
        await asyncio.sleep(0.05)
        restored = of(SharedStateRestored, seen, "breaker:search")
        assert len(restored) == 1 and restored[0].degraded_for_s > 0
        assert b.state is BreakerState.CLOSED  # the (empty) shared state rules again
        for _ in range(4):
            b.on_result(b.acquire(), 0.001, ConnectionRefusedError("store down"))
        await b.refresh()
        assert (await client.hget(b.keys[0], "state")) == b"open"
    finally:
        await b.aclose()
        await client.aclose()


async def test_breaker_falls_back_under_latency_from_the_fault_proxy(
    redis_server: Any, fault_proxy: Any, seen: list[Any]
) -> None:
    proxy = fault_proxy(redis_server)
    client = make_client(proxy.host, proxy.port)
    b = await shared_breaker(client).start()
    try:
        assert b.shared
        proxy.set_latency(to_client_s=0.5)  # every reply now outlasts redis_timeout_s
        t0 = time.monotonic()
        took = await until(lambda: not b.shared, 5.0)
        assert took <= FALLBACK_WITHIN_S
        for _ in range(100):  # the happy path keeps running, locally, without waiting
            b.on_result(b.acquire(), 0.001, None)
        assert time.monotonic() - t0 < FALLBACK_WITHIN_S + 0.5
        proxy.heal()
        assert await until(lambda: b.shared, 10.0) <= RESTORE_WITHIN_S
        await asyncio.sleep(0.05)
        assert len(of(SharedStateDegraded, seen, "breaker:search")) == 1
        assert len(of(SharedStateRestored, seen, "breaker:search")) == 1
    finally:
        await b.aclose()
        await client.aclose()


async def _admit(q: RedisQuotas) -> tuple[Any, float]:
    t0 = time.monotonic()
    lease = await q.acquire("acme")  # QuotaExceeded is the only error a user may see
    return lease, time.monotonic() - t0


async def test_quotas_survive_redis_stopping_and_return(redis_server: Any, seen: list[Any]) -> None:
    client = make_client(redis_server.host, redis_server.port)
    q = RedisQuotas(lambda t: TenantQuota(max_concurrency=1), client, probe_every_s=0.3)
    try:
        lease, _ = await _admit(q)
        assert isinstance(lease, SharedLease) and lease.shared
        q.release(lease)
        redis_server.stop()
        slowest = 0.0
        t0 = time.monotonic()
        for _ in range(10):
            lease, took = await _admit(q)  # never raises for the outage
            slowest = max(slowest, took)
            q.release(lease)
        assert not q.shared and time.monotonic() - t0 <= FALLBACK_WITHIN_S
        assert slowest <= 0.25 + 0.1  # no admission waits longer than one Redis timeout
        local = await q.acquire("acme")
        assert isinstance(local, SharedLease) and not local.shared  # admitted by the fallback
        with pytest.raises(QuotaExceeded):  # the local fallback still holds the tenant to its quota
            await q.acquire("acme")
        q.release(local)

        redis_server.start()
        assert await until(lambda: q.shared, 10.0) <= RESTORE_WITHIN_S
        lease, _ = await _admit(q)
        assert isinstance(lease, SharedLease) and lease.shared  # scripts reloaded into the empty server
        q.release(lease)
        await asyncio.sleep(0.05)
        assert len(of(SharedStateDegraded, seen, "quotas")) == 1
        assert len(of(SharedStateRestored, seen, "quotas")) == 1
    finally:
        await q.aclose()
        await client.aclose()


async def test_quotas_fall_back_under_latency_from_the_fault_proxy(
    redis_server: Any, fault_proxy: Any, seen: list[Any]
) -> None:
    proxy = fault_proxy(redis_server)
    client = make_client(proxy.host, proxy.port)
    q = RedisQuotas(lambda t: TenantQuota(max_concurrency=50), client, probe_every_s=0.3)
    try:
        assert (await _admit(q))[0].shared
        proxy.set_latency(to_server_s=0.4)
        results = await asyncio.gather(*(_admit(q) for _ in range(20)))
        assert all(lease is not None for lease, _ in results)
        assert max(took for _, took in results) <= 0.25 + 0.15
        assert not q.shared
        proxy.heal()
        assert await until(lambda: q.shared, 10.0) <= RESTORE_WITHIN_S
        assert (await _admit(q))[0].shared
    finally:
        await q.aclose()
        await client.aclose()


async def test_the_event_log_records_the_switch_and_doctor_reports_it(
    redis_server: Any, tmp_path: Any
) -> None:
    """User report: `ragguard demo --redis` (Redis down) warned five times, but its events.jsonl had
    no SharedStateDegraded (the recorder's default kinds left them out) and doctor said nothing."""
    from ragguard.monitors._record import EventRecorder, load_records
    from ragguard_tools.doctor import diagnose

    path = tmp_path / "events.jsonl"
    client = make_client(redis_server.host, redis_server.port)
    b = await shared_breaker(client).start()
    try:
        with EventRecorder(path=path):  # the default kinds, as `ragguard demo` records
            redis_server.stop()
            assert await until(lambda: not b.shared, 5.0, lambda: _ok(b)) <= FALLBACK_WITHIN_S
            redis_server.start()
            assert await until(lambda: b.shared, 10.0) <= RESTORE_WITHIN_S
            await asyncio.sleep(0.05)
    finally:
        await b.aclose()
        await client.aclose()
    records = load_records(path)
    switches = [(r["type"], r["component"]) for r in records if r["type"].startswith("SharedState")]
    assert switches == [("SharedStateDegraded", "breaker:search"), ("SharedStateRestored", "breaker:search")]
    (f,) = [f for f in diagnose(records).findings if f.kind == "shared_state"]
    down = next(r["degraded_for_s"] for r in records if r["type"] == "SharedStateRestored")
    assert f.summary.startswith(
        f"shared state: Redis unreachable, ran on local state for {down:.1f} s (component breaker:search)"
    ), f.summary
    assert "when the log ends" not in f.summary and f.data["still_degraded"] == []


async def _ok(b: SharedCircuitBreaker) -> None:
    b.on_result(b.acquire(), 0.001, None)
