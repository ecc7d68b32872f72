"""The Prometheus exporter: events in, a real registry scraped as text out."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from ragguard import ConfigError, events
from ragguard.events import StageCompleted
from ragguard.metrics import PrometheusExporter, otel_span
from ragguard.monitors import MonitoredBlockingConnectionPool, StallDetector

pytestmark = pytest.mark.anyio


def samples(exporter: PrometheusExporter) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = exporter.scrape().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(exporter: PrometheusExporter, name: str, **labels: str) -> float:
    return samples(exporter)[(name, frozenset(labels.items()))]


async def _deliver() -> None:
    # the stall detector's beat runs one iteration after its timer or probe arrives, and the bus
    # delivers one iteration after that
    for _ in range(3):
        await asyncio.sleep(0)


async def test_every_guard_event_becomes_a_metric() -> None:
    bus = events.EventBus()
    exporter = PrometheusExporter(bus=bus).start()
    bus.emit(StageCompleted("embed", "acme", "success", 0.3))
    bus.emit(StageCompleted("embed", "acme", "fallback", 0.9, fallback="cache"))
    bus.emit(events.CallOutcome("embedding", "slow_success", 1.5))
    bus.emit(events.CallRejected("embedding", "open", 3.0))
    bus.emit(events.BreakerTransition("embedding", "closed", "open", 10.0, "slow-call rate"))
    bus.emit(events.FallbackServed("embed", "cache", "acme", "EmbeddingUnavailable"))
    bus.emit(events.QuotaRejected("acme", "rate", 0.5))
    bus.emit(events.RetryScheduled("search", 2, 0.1, "ConnectionError", "acme"))
    bus.emit(events.RetryBudgetExhausted("search", "acme"))
    await _deliver()

    assert (
        value(
            exporter, "ragguard_stage_duration_seconds_count", stage="embed", tenant="acme", outcome="success"
        )
        == 1
    )
    assert value(exporter, "ragguard_stage_duration_seconds_bucket", stage="embed", tenant="acme",
                 outcome="fallback", le="0.8") == 0  # fmt: skip
    assert value(exporter, "ragguard_stage_duration_seconds_bucket", stage="embed", tenant="acme",
                 outcome="fallback", le="1.0") == 1  # fmt: skip
    assert (
        value(exporter, "ragguard_call_duration_seconds_sum", breaker="embedding", outcome="slow_success")
        == 1.5
    )
    assert value(exporter, "ragguard_calls_rejected_total", breaker="embedding", state="open") == 1
    assert value(exporter, "ragguard_breaker_state", breaker="embedding", state="open") == 1
    assert value(exporter, "ragguard_breaker_state", breaker="embedding", state="closed") == 0
    assert value(exporter, "ragguard_breaker_transitions_total", breaker="embedding", from_state="closed",
                 to_state="open") == 1  # fmt: skip
    assert (
        value(exporter, "ragguard_fallbacks_served_total", stage="embed", fallback="cache", tenant="acme")
        == 1
    )
    assert value(exporter, "ragguard_quota_rejections_total", tenant="acme", reason="rate") == 1
    assert value(exporter, "ragguard_retries_total", stage="search", tenant="acme") == 1
    assert value(exporter, "ragguard_retry_budget_exhausted_total", stage="search", tenant="acme") == 1
    exporter.close()
    bus.emit(events.QuotaRejected("acme", "rate", 0.5))
    await _deliver()
    assert value(exporter, "ragguard_quota_rejections_total", tenant="acme", reason="rate") == 1


async def test_subclassed_events_are_recognised() -> None:
    breakers = pytest.importorskip("ragguard.breakers._breaker")
    bus = events.EventBus()
    exporter = PrometheusExporter(bus=bus).start()
    bus.emit(breakers.BreakerCallOutcome("rerank", "failure", 0.2, "MemoryError", None))
    await _deliver()
    assert value(exporter, "ragguard_call_duration_seconds_count", breaker="rerank", outcome="failure") == 1


async def test_tenant_labels_are_capped() -> None:
    bus = events.EventBus()
    exporter = PrometheusExporter(bus=bus, max_tenants=3).start()
    for i in range(50):
        bus.emit(events.QuotaRejected(f"tenant-{i}", "concurrency", 0.1))
    await _deliver()
    tenants = {dict(labels)["tenant"]: v for (name, labels), v in samples(exporter).items()
               if name == "ragguard_quota_rejections_total"}  # fmt: skip
    assert tenants == {"tenant-0": 1, "tenant-1": 1, "tenant-2": 1, "other": 47}


def _label_values(exporter: PrometheusExporter, metric: str, label: str) -> set[str]:
    return {dict(labels)[label] for (name, labels), _ in samples(exporter).items() if name == metric}


async def test_stage_and_breaker_labels_are_capped_like_tenants() -> None:
    # issue 13 item 11: 2,000 generated breaker names made a 1.1 MB scrape
    bus = events.EventBus()
    exporter = PrometheusExporter(bus=bus, pools=False).start()  # default caps: 100 each

    async def generate(first: int, n: int) -> None:
        for i in range(first, first + n):
            name = f"generated-{i:04d}"
            bus.emit(events.BreakerTransition(name, "closed", "open", float(i), "tripped"))
            bus.emit(events.CallOutcome(name, "failure", 0.01, "OSError"))
            bus.emit(events.CallRejected(name, "open", 1.0))
            bus.emit(StageCompleted(name, "acme", "success", 0.01))
            bus.emit(events.FallbackServed(name, "cache", "acme", "OSError"))
            bus.emit(events.RetryScheduled(name, 1, 0.1, "OSError"))
        await _deliver()

    await generate(0, 2_000)
    for metric, label in [
        ("ragguard_breaker_transitions_total", "breaker"),
        ("ragguard_call_duration_seconds_count", "breaker"),
        ("ragguard_calls_rejected_total", "breaker"),
        ("ragguard_stage_duration_seconds_count", "stage"),
        ("ragguard_fallbacks_served_total", "stage"),
        ("ragguard_retries_total", "stage"),
    ]:
        seen = _label_values(exporter, metric, label)
        assert len(seen) == 101 and "other" in seen and "generated-0000" in seen, metric
    states = _label_values(exporter, "ragguard_breaker_state", "breaker")
    assert len(states) == 100 and "other" not in states  # one gauge cannot hold many breakers' states
    assert value(exporter, "ragguard_breaker_transitions_total", breaker="other", from_state="closed",
                 to_state="open") == 1_900  # fmt: skip
    size = len(exporter.scrape())
    await generate(2_000, 2_000)  # 2,000 more names: the scrape stays the same size
    assert len(exporter.scrape()) < size * 1.01


async def test_caps_are_options() -> None:
    bus = events.EventBus()
    exporter = PrometheusExporter(bus=bus, pools=False, max_stages=2, max_breakers=1).start()
    for name in ("a", "b", "c"):
        bus.emit(events.CallRejected(name, "open", 1.0))
        bus.emit(events.RetryScheduled(name, 1, 0.1, "OSError"))
    await _deliver()
    assert _label_values(exporter, "ragguard_calls_rejected_total", "breaker") == {"a", "other"}
    assert _label_values(exporter, "ragguard_retries_total", "stage") == {"a", "b", "other"}
    for bad in ({"max_stages": 0}, {"max_breakers": True}):
        with pytest.raises(ConfigError):
            PrometheusExporter(pools=False, **bad)


async def test_loop_stalls_and_pool_gauges_from_real_components(redis_server: Any) -> None:
    bus = events.EventBus()
    exporter = PrometheusExporter(bus=bus).start()
    pool = MonitoredBlockingConnectionPool(
        host=redis_server.host, port=redis_server.port, max_connections=4, pool_name="vectors", bus=bus
    )
    client = aioredis.Redis(connection_pool=pool)
    await asyncio.gather(*(client.ping() for _ in range(3)))
    held = await pool.get_connection()
    # A loop that waits for a CPU stalls too: on a loaded machine the detector may see such a stall
    # besides the 100 ms block, and its watchdog may look late into the block (the 5 ms threshold
    # still catches it). Every stall it saw is counted, once: the exporter's count is the detector's.
    async with StallDetector(bus=bus) as detector:
        await asyncio.sleep(0.05)
        time.sleep(0.1)
        for _ in range(200):  # the probe, then the beat reporting the stall: a few iterations
            if detector.stalls:
                break
            await asyncio.sleep(0.01)
    await _deliver()  # stopped: every stall counted is emitted, delivered now
    assert detector.stalls >= 1
    assert value(exporter, "ragguard_loop_stalls_total") == detector.stalls
    assert value(exporter, "ragguard_loop_stall_duration_seconds_count") == detector.stalls
    assert value(exporter, "ragguard_loop_stall_duration_seconds_sum") > 0.005 * detector.stalls
    assert value(exporter, "ragguard_redis_pool_connections", pool="vectors", state="in_use") == 1
    assert value(exporter, "ragguard_redis_pool_connections", pool="vectors", state="idle") == 2
    assert value(exporter, "ragguard_redis_pool_max_connections", pool="vectors") == 4
    assert value(exporter, "ragguard_redis_pool_waiting", pool="vectors") == 0
    assert value(exporter, "ragguard_redis_pool_acquire_wait_seconds_count", pool="vectors") == 4
    assert value(exporter, "ragguard_redis_pool_acquire_timeouts_total", pool="vectors") == 0
    await pool.release(held)
    await client.aclose()


async def test_dedicated_registry_by_default_or_the_callers() -> None:
    mine = CollectorRegistry()
    a = PrometheusExporter(registry=mine, pools=False)
    b = PrometheusExporter(pools=False)
    assert a.registry is mine and b.registry is not mine
    with pytest.raises(ConfigError):
        PrometheusExporter(max_tenants=0)
    with pytest.raises(ConfigError):
        PrometheusExporter(latency_buckets_s=(1.0, 0.5))


async def test_otel_span_feeds_stage_metrics() -> None:
    bus = events.EventBus()
    exporter = PrometheusExporter(bus=bus, pools=False).start()
    with pytest.raises(ValueError), otel_span("rerank", "acme", bus=bus):
        raise ValueError("boom")
    with otel_span("rerank", "acme", breaker_state="closed", bus=bus):
        await asyncio.sleep(0.01)
    await _deliver()
    assert (
        value(
            exporter, "ragguard_stage_duration_seconds_count", stage="rerank", tenant="acme", outcome="error"
        )
        == 1
    )
    assert value(exporter, "ragguard_stage_duration_seconds_sum", stage="rerank", tenant="acme",
                 outcome="success") >= 0.01  # fmt: skip


# --- breaker state from creation ---------------------------------------------------------------


def test_a_breakers_state_series_exist_from_its_creation() -> None:
    from ragguard import CircuitBreaker, FakeClock

    breaker = CircuitBreaker("visible-from-birth", clock=FakeClock())  # before the exporter, too
    exporter = PrometheusExporter(registry=CollectorRegistry()).start()
    try:
        assert value(exporter, "ragguard_breaker_state", breaker="visible-from-birth", state="closed") == 1
        assert value(exporter, "ragguard_breaker_state", breaker="visible-from-birth", state="open") == 0
        breaker.force_open()  # read at scrape time: no event delivery needed
        forced = value(exporter, "ragguard_breaker_state", breaker="visible-from-birth", state="forced_open")
        assert forced == 1
        assert value(exporter, "ragguard_breaker_state", breaker="visible-from-birth", state="closed") == 0
    finally:
        exporter.close()


def test_a_guards_stage_breakers_are_visible_once_built() -> None:
    from ragguard import FakeClock, Guard

    guard = Guard(clock=FakeClock())
    exporter = PrometheusExporter(registry=CollectorRegistry())
    guard.stage("visible-stage")
    assert value(exporter, "ragguard_breaker_state", breaker="visible-stage", state="closed") == 1
    assert guard.status()["stages"]["visible-stage"]["breaker"]["state"] == "closed"


def test_an_exporter_on_another_bus_does_not_report_breakers_it_never_hears_from() -> None:
    from ragguard import CircuitBreaker, FakeClock

    breaker = CircuitBreaker("heard-elsewhere", clock=FakeClock())
    exporter = PrometheusExporter(registry=CollectorRegistry(), bus=events.EventBus())
    scraped = samples(exporter)
    names = {dict(labels).get("breaker") for (name, labels) in scraped if name == "ragguard_breaker_state"}
    assert "heard-elsewhere" not in names
    assert breaker.state.value == "closed"


def test_a_shared_breaker_speaks_for_the_breaker_it_wraps() -> None:
    from ragguard import CircuitBreaker, FakeClock
    from ragguard.breakers._live import live_breakers
    from ragguard.redis import SharedCircuitBreaker

    local = CircuitBreaker("shared-one", clock=FakeClock())
    client = aioredis.Redis(host="127.0.0.1", port=1)  # never contacted here
    shared = SharedCircuitBreaker(local, client)
    alive = live_breakers()
    assert shared in alive and local not in alive


async def test_generation_streams_become_metrics() -> None:
    bus = events.EventBus()
    exporter = PrometheusExporter(bus=bus).start()
    bus.emit(events.StreamCut("generation", "acme", "idle", 3))
    bus.emit(events.StreamCut("generation", "acme", "idle", 7))
    bus.emit(events.StreamSettled("generation", "greedy", 40, 120, 256, 1.5, "ok"))
    bus.emit(events.StreamSettled("generation", "greedy", 10, 30, 256, 0.5, "cancelled"))
    await _deliver()
    assert value(exporter, "ragguard_streams_cut_total", stage="generation", budget="idle") == 2
    assert value(exporter, "ragguard_stream_tokens_total", stage="generation", tenant="greedy") == 150
    assert value(exporter, "ragguard_stream_paced_seconds_total", stage="generation", tenant="greedy") == 2.0


async def test_configured_tenants_keep_their_labels_after_100_junk_ids(isolated_registry: None) -> None:
    # issue 21 item 8: the first 100 ids seen took every tenant label, the policy's tenants included
    import ragguard

    ragguard.configure(ragguard.Policy(tenants={"acme": ragguard.TenantQuota(max_concurrency=2)}))
    exporter = PrometheusExporter(pools=False).start()  # the default registry's policy names acme

    @ragguard.guard("lookup")
    async def lookup() -> str:
        return "ok"

    try:
        for i in range(100):
            async with ragguard.tenant(f"junk{i}"):
                await lookup()
        async with ragguard.tenant("acme"):
            await lookup()
        async with ragguard.tenant("junk100"):
            await lookup()
        await _deliver()
        tenants = _label_values(exporter, "ragguard_stage_duration_seconds_count", "tenant")
    finally:
        exporter.close()
    assert "acme" in tenants, "a tenant the policy names keeps its own series"
    assert "junk100" not in tenants and "other" in tenants
    assert len(tenants) == 102  # 100 junk ids, other, acme
    assert value(exporter, "ragguard_tenant_in_flight", tenant="acme") == 0
