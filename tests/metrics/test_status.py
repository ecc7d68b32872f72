"""Guard.status() and the status endpoints: breakers, adaptive limits, throttles, hedges, quotas per
configured tenant (and the others added up), each Redis link; counts of what only events tell."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from metrics_helpers import serving
from prometheus_client.parser import text_string_to_metric_families

import ragguard
from ragguard import (
    AdaptivePolicy,
    Guard,
    HedgePolicy,
    Policy,
    QuotaExceeded,
    StagePolicy,
    TenantQuota,
    ThrottlePolicy,
)
from ragguard.asgi import StatusEndpoint
from ragguard.metrics import PrometheusExporter
from ragguard.redis import RedisBackend
from ragguard_tools import status

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _isolated(isolated_registry: None) -> None:
    pass


def _policy() -> Policy:
    return Policy(
        stages={
            "retrieve": StagePolicy(adaptive=AdaptivePolicy(min_limit=2, max_limit=8, initial_limit=4)),
            "search": StagePolicy(hedge=HedgePolicy(), throttle=ThrottlePolicy(), idempotent=True),
        },
        default_quota=TenantQuota(max_concurrency=5),
        tenants={
            "acme": TenantQuota(max_concurrency=1, max_wait_s=5.0, rate_per_s=100.0),
            "globex": TenantQuota(max_concurrency=3),
        },
    )


async def test_status_reports_limits_hedges_throttles_and_each_tenants_slots() -> None:
    g = Guard(_policy())

    @g.guard("retrieve")
    async def retrieve() -> str:
        return "ok"

    @g.guard("search")
    async def search() -> str:
        return "hit"

    release = asyncio.Event()

    async def hold(tenant: str) -> None:
        async with g.tenant(tenant):
            await retrieve()
            await release.wait()

    assert await search() == "hit"
    tasks = [asyncio.create_task(hold(t)) for t in ("acme", "acme", "rotating1", "rotating2")]
    for _ in range(20):
        await asyncio.sleep(0)
    now = g.status()
    assert now["quotas"]["backend"] == "local" and now["quotas"]["shared"] is None
    assert now["quotas"]["tenants"] == {
        "acme": {"in_flight": 1, "waiting": 1, "max_concurrency": 1, "rate_per_s": 100.0},
        "globex": {"in_flight": 0, "waiting": 0, "max_concurrency": 3, "rate_per_s": None},
    }
    assert now["quotas"]["others"] == {"in_flight": 2, "waiting": 0}
    limit = now["stages"]["retrieve"]["limit"]
    assert (limit["min_limit"], limit["max_limit"]) == (2, 8) and 2 <= limit["limit"] <= 8
    assert set(now["stages"]["search"]) >= {"breaker", "hedge", "throttle"}
    assert now["stages"]["search"]["hedge"]["fired"] == 0
    assert now["links"] == []
    assert json.loads(json.dumps(now)) == now  # JSON-ready
    release.set()
    await asyncio.gather(*tasks)
    after = g.status()["quotas"]
    # every slot came back: a leaked one would show as an in_flight that stays above 0
    assert after["tenants"]["acme"]["in_flight"] == 0 and after["others"]["in_flight"] == 0
    assert after["tenants"]["acme"]["waiting"] == 0


async def test_status_endpoint_counts_fallbacks_sheds_and_refusals() -> None:
    g = Guard(_policy())

    async def cached(texts: list[str]) -> list[float]:
        return [1.0]

    @g.guard("embedding", fallback=cached)
    async def embed(texts: list[str]) -> list[float]:
        raise ConnectionRefusedError("down")

    endpoint = StatusEndpoint(g)
    with serving(endpoint) as base:
        url = f"{base}/status"
        async with httpx.AsyncClient() as client:
            first = (await client.get(url)).json()
            for _ in range(3):
                assert await embed(["x"]) == [1.0]
            async with g.tenant("acme"):
                with pytest.raises(QuotaExceeded):
                    async with g.tenant("acme"):
                        pass
            await asyncio.sleep(0.01)
            second = (await client.get(url)).json()
    assert first["counts"]["fallbacks"] == {}
    assert second["counts"]["fallbacks"] == {"embedding": 3}
    assert second["counts"]["quota_rejected"] == {"acme": 1}
    assert second["counts"]["since_s"] >= 0
    assert second["quotas"]["tenants"]["acme"]["in_flight"] == 0
    endpoint.counts.close()  # type: ignore[union-attr]


async def test_serve_answers_status_and_metrics_for_a_service_without_asgi() -> None:
    g = Guard(_policy())

    @g.guard("retrieve")
    async def retrieve() -> str:
        return "ok"

    await retrieve()
    exporter = PrometheusExporter(guards=g).start()
    server = status.serve(0, g, exporter=exporter)
    try:
        async with httpx.AsyncClient() as client:
            got = await client.get(server.url)
            scraped = await client.get(server.url.replace("/status", "/metrics"))
            missing = await client.get(server.url.replace("/status", "/nothing"))
    finally:
        server.close()
        exporter.close()
    assert got.status_code == 200 and got.headers["content-type"] == "application/json"
    assert 2 <= got.json()["stages"]["retrieve"]["limit"]["limit"] <= 8
    assert "counts" in got.json()
    families = {f.name for f in text_string_to_metric_families(scraped.text)}
    assert "ragguard_adaptive_limit" in families and missing.status_code == 404


def test_serve_refuses_a_bad_port() -> None:
    with pytest.raises(ragguard.ConfigError, match="port"):
        status.serve(70000, Guard())


async def test_serve_answers_a_source_of_its_own_read_on_the_loop() -> None:
    loop = asyncio.get_running_loop()
    asked_on: list[Any] = []

    def source() -> dict[str, Any]:
        asked_on.append(asyncio.get_running_loop())
        return {"ok": True, "open": [], "stages": {}, "note": "warming up"}

    server = status.serve(0, source=source)
    try:
        async with httpx.AsyncClient() as client:
            got = await client.get(server.url)
    finally:
        server.close()
    assert got.json() == {"ok": True, "open": [], "stages": {}, "note": "warming up"}
    assert asked_on == [loop]
    with pytest.raises(ragguard.ConfigError, match="not both"):
        status.serve(0, Guard(), source=source)


async def test_shared_quotas_and_breakers_report_their_links(redis_server: Any) -> None:
    client = aioredis.Redis(host=redis_server.host, port=redis_server.port, socket_timeout=0.5)
    g = Guard(_policy(), backend=RedisBackend(client, prefix="links",
                                              quotas={"redis_timeout_s": 0.2, "probe_every_s": 30.0}))

    @g.guard("embedding")
    async def embed(texts: list[str]) -> list[float]:
        return [0.0]

    exporter = PrometheusExporter(guards=g)
    try:
        async with g.tenant("acme"):
            assert g.status()["quotas"]["tenants"]["acme"]["in_flight"] == 1
            await embed(["x"])
        now = g.status()
        assert now["quotas"]["backend"] == "redis" and now["quotas"]["shared"] is True
        assert {"component": "quotas", "shared": True} in now["links"]
        for _ in range(200):  # the shared breaker joins Redis with its first sync, in the background
            if {"component": "breaker:embedding", "shared": True} in g.status()["links"]:
                break
            await asyncio.sleep(0.01)
        assert {"component": "breaker:embedding", "shared": True} in g.status()["links"]
        assert _gauge(exporter, "ragguard_shared_state_degraded", component="quotas") == 0
        redis_server.stop()
        for _ in range(10):  # admissions fail over to local state once the link gives up on Redis
            async with g.tenant("acme"):
                pass
            if not g.status()["quotas"]["shared"]:
                break
        assert {"component": "quotas", "shared": False} in g.status()["links"]
        assert _gauge(exporter, "ragguard_shared_state_degraded", component="quotas") == 1
    finally:
        await g.aclose()
        await client.aclose()


def _gauge(exporter: PrometheusExporter, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(exporter.scrape().decode()):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    raise AssertionError(f"no {name}{labels}")


async def test_a_stream_stage_is_listed_with_its_breaker() -> None:
    g = Guard(Policy())

    @g.guard("generation")
    async def generate(prompt: str) -> AsyncIterator[str]:
        yield "x"

    assert [w async for w in generate("p")] == ["x"]
    assert g.status()["stages"]["generation"]["breaker"]["state"] == "closed"


async def test_the_exporters_asgi_app_serves_a_scrape_without_created_series() -> None:
    g = Guard(_policy())

    @g.guard("retrieve")
    async def retrieve() -> str:
        return "ok"

    exporter = PrometheusExporter(guards=g).start()
    try:
        await retrieve()
        await asyncio.sleep(0.01)
        with serving(exporter.asgi()) as base:
            async with httpx.AsyncClient() as client:
                got = await client.get(f"{base}/metrics")
    finally:
        exporter.close()
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/plain")
    names = {s.name for f in text_string_to_metric_families(got.text) for s in f.samples}
    assert "ragguard_stage_duration_seconds_count" in names and "ragguard_adaptive_limit" in names
    assert not any(n.endswith("_created") for n in names)
    kept = PrometheusExporter(guards=g, created=True, bus=ragguard.events.EventBus())
    kept.handle(ragguard.events.QuotaRejected("acme", "rate", 0.1))
    assert "ragguard_quota_rejections_created" in kept.scrape().decode()


async def test_the_exporter_added_as_a_route_answers_200_on_metrics_itself() -> None:
    """A scraper that does not follow redirects: ``/metrics`` must answer, not send it elsewhere.
    As a route the exporter's app answers there; as a Starlette mount it answers ``/metrics/``
    only (a mount matches the paths below it), and ``/metrics`` is redirected."""
    from fastapi import FastAPI

    exporter = PrometheusExporter(bus=ragguard.events.EventBus())
    exporter.handle(ragguard.events.QuotaRejected("acme", "rate", 0.1))
    routed, mounted = FastAPI(), FastAPI()
    routed.add_route("/metrics", exporter.asgi())
    mounted.mount("/metrics", exporter.asgi())
    with serving(routed) as routed_url, serving(mounted) as mounted_url:
        async with httpx.AsyncClient(follow_redirects=False) as client:
            got = await client.get(f"{routed_url}/metrics")
            below = await client.get(f"{mounted_url}/metrics/")
            redirected = await client.get(f"{mounted_url}/metrics")
    assert got.status_code == 200
    assert 'ragguard_quota_rejections_total{reason="rate",tenant="acme"} 1.0' in got.text
    assert below.status_code == 200 and redirected.status_code == 307  # why the docs say add_route


async def test_a_dropped_status_endpoint_stops_counting_and_leaves_the_bus_idle() -> None:
    # its counts listen from its first request on; once the endpoint is gone, nobody reads them,
    # and every guarded call in the process must not go on building events for them
    import gc

    from ragguard import events

    assert not events.bus.active
    endpoint = StatusEndpoint(Guard(Policy()))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=endpoint), base_url="http://t") as c:
        assert (await c.get("/status")).status_code == 200
    assert events.bus.active  # counting while the endpoint lives
    del endpoint, c
    gc.collect()
    assert not events.bus.active
