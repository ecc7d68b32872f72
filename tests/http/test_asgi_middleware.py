"""RagguardMiddleware in front of a FastAPI app on a real uvicorn server, called with httpx."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from http_helpers import ERRORS, Gate, rag_app, running, wait_for

import ragguard
from ragguard import ConfigError, FakeClock, Policy, TenantQuota
from ragguard.asgi import RagguardMiddleware, StatusEndpoint
from ragguard.asgi._status import http_status_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

STYLES = ["add_middleware", "wrapped"]


def guard_with(**tenants: TenantQuota) -> ragguard.Guard:
    return ragguard.Guard(Policy(tenants=tenants), clock=FakeClock())


@pytest.fixture(params=STYLES)
def style(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    yield g
    g.release.set()


def serve(guard: ragguard.Guard, gate: Gate, style: str, **options: Any) -> Any:
    """The RAG app behind the middleware: added the FastAPI way, or wrapped around the whole app
    (outside Starlette's error middleware, which answers 500 before re-raising)."""
    app = rag_app(guard, gate)
    if style == "add_middleware":
        app.add_middleware(RagguardMiddleware, guard=guard, **options)
        return running(app)
    return running(RagguardMiddleware(app, guard=guard, **options))


# --- tenant and deadline reach the endpoint -------------------------------------------------


async def test_tenant_and_deadline_reach_the_endpoint(style: str, gate: Gate) -> None:
    guard = guard_with(globex=TenantQuota(timeout_s=0.5))
    with serve(guard, gate, style) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            acme = await client.get(
                "/whoami", headers={"x-tenant-id": "acme", "x-request-timeout-ms": "2500"}
            )
            plain = await client.get("/whoami")
            shortened = await client.get(
                "/whoami", headers={"x-tenant-id": "globex", "x-request-timeout-ms": "9000"}
            )
    assert acme.json()["tenant"] == "acme" and 2.0 < acme.json()["remaining"] <= 2.5
    assert plain.json() == {"tenant": "default", "remaining": None}
    assert 0.3 < shortened.json()["remaining"] <= 0.5  # the tenant's own budget is shorter


@pytest.mark.parametrize(
    ("headers", "field"),
    [
        ({"x-tenant-id": "has space"}, "tenant id"),
        ({"x-tenant-id": "x" * 65}, "tenant id"),
        ({"x-tenant-id": "é".encode()}, "tenant id"),
        ({"x-request-timeout-ms": "-5"}, "x-request-timeout-ms"),
        ({"x-request-timeout-ms": "soon"}, "x-request-timeout-ms"),
        ([("x-request-timeout-ms", "100"), ("x-request-timeout-ms", "9000")], "sent 2 times"),
    ],
)
async def test_bad_tenant_or_timeout_is_400_and_the_endpoint_does_not_run(
    headers: Any, field: str, gate: Gate
) -> None:
    guard = guard_with()
    with serve(guard, gate, "wrapped") as url, httpx.Client(base_url=url) as client:
        reply = client.get("/hold", headers=headers)
    assert reply.status_code == 400
    assert field in reply.json()["detail"] and reply.json()["error"] in ("InvalidInput",)
    assert not gate.entered.is_set()


# --- errors to statuses ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "status", "retry_after", "retry_after_ms"),
    [
        ("quota", 429, "3", "2500"),
        ("quota_deadline", 504, None, None),
        ("breaker", 503, "2", "1251"),
        ("breaker_half_open", 503, "1", "0"),
        ("breaker_forced", 503, None, None),
        ("no_deployment", 503, "8", "7500"),
        ("deadline", 504, None, None),
        ("stage_timeout", 504, None, None),
        ("invalid", 400, None, None),
    ],
)
async def test_errors_leaving_the_app_become_statuses(
    style: str, gate: Gate, name: str, status: int, retry_after: str | None, retry_after_ms: str | None
) -> None:
    with serve(guard_with(), gate, style) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            reply = await client.get(f"/raise/{name}", headers={"x-tenant-id": "acme"})
    assert reply.status_code == status
    assert reply.headers.get("retry-after") == retry_after
    assert reply.headers.get("retry-after-ms") == retry_after_ms
    body = reply.json()
    assert body["detail"] == str(ERRORS[name]())
    assert body["error"] == type(ERRORS[name]()).__name__
    assert ("retry_after_s" in body) == (retry_after is not None)


async def test_other_errors_stay_the_apps_500(style: str, gate: Gate) -> None:
    with serve(guard_with(), gate, style) as url, httpx.Client(base_url=url) as client:
        reply = client.get("/raise/runtime")
    assert reply.status_code == 500
    assert "retry-after" not in reply.headers


async def test_quota_refusal_is_429_with_retry_after_and_ratelimit_field(gate: Gate) -> None:
    guard = guard_with(acme=TenantQuota(rate_per_s=2.0, burst=1))
    with serve(guard, gate, "add_middleware") as url:
        async with httpx.AsyncClient(base_url=url, headers={"x-tenant-id": "acme"}) as client:
            first = await client.get("/whoami")
            refused = await client.get("/whoami")
            other = await client.get("/whoami", headers={"x-tenant-id": "globex"})
    assert first.status_code == 200 and other.status_code == 200
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"  # 0.5 s, rounded up to whole seconds
    assert refused.headers["retry-after-ms"] == "500"
    assert refused.headers["ratelimit"] == '"rate";r=0;t=1'
    assert refused.json()["retry_after_s"] == pytest.approx(0.5)


async def test_concurrency_refusal_while_a_request_holds_the_slot(gate: Gate) -> None:
    guard = guard_with(acme=TenantQuota(max_concurrency=1))
    with serve(guard, gate, "wrapped") as url:
        async with httpx.AsyncClient(base_url=url, headers={"x-tenant-id": "acme"}) as client:
            holder = asyncio.ensure_future(client.get("/hold"))
            assert await asyncio.to_thread(wait_for, gate.entered)
            refused = await client.get("/whoami")
            assert guard.quotas.in_flight("acme") == 1
            gate.release.set()
            assert (await holder).json() == {"tenant": "acme"}
            after = await client.get("/whoami")
    assert refused.status_code == 429 and refused.headers["ratelimit"].startswith('"concurrency";r=0;t=')
    assert int(refused.headers["retry-after"]) >= 1
    assert after.status_code == 200
    assert guard.quotas.in_flight("acme") == 0


async def test_degraded_answer_names_its_fallback(style: str, gate: Gate) -> None:
    guard = guard_with()
    with serve(guard, gate, style) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            fresh = await client.get("/search", params={"q": "llamas"})
            guard.breaker("search").force_open()
            degraded = await client.get("/search", params={"q": "llamas"})
    assert "ragguard-degraded" not in fresh.headers
    assert degraded.status_code == 200
    assert degraded.json() == {"hits": ["keyword hit for llamas"], "degraded": ["<lambda>"]}
    assert degraded.headers["ragguard-degraded"] == "<lambda>"


async def test_exempt_paths_never_count_against_a_quota(gate: Gate) -> None:
    guard = guard_with(default=TenantQuota(max_concurrency=1, rate_per_s=1.0, burst=1))
    with serve(guard, gate, "wrapped") as url:
        async with httpx.AsyncClient(base_url=url) as client:
            holder = asyncio.ensure_future(client.get("/hold"))
            assert await asyncio.to_thread(wait_for, gate.entered)
            health = [await client.get("/health") for _ in range(5)]
            refused = await client.get("/whoami")
            gate.release.set()
            await holder
    assert [h.status_code for h in health] == [200] * 5
    assert health[0].json()["ok"] is True
    assert refused.status_code == 429


async def test_default_registry_is_looked_up_per_request(gate: Gate) -> None:
    app = rag_app(guard_with(), gate)
    app.add_middleware(RagguardMiddleware)
    ragguard.configure(Policy(tenants={"acme": TenantQuota(rate_per_s=1.0, burst=1)}), clock=FakeClock())
    with running(app) as url:
        async with httpx.AsyncClient(base_url=url, headers={"x-tenant-id": "acme"}) as client:
            assert (await client.get("/whoami")).status_code == 200
            assert (await client.get("/whoami")).status_code == 429
            ragguard.configure(Policy(), clock=FakeClock())  # a new default registry: no quota
            assert (await client.get("/whoami")).status_code == 200


async def test_lifespan_passes_through() -> None:
    from contextlib import asynccontextmanager

    from fastapi import FastAPI

    started: list[str] = []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        started.append("up")
        yield
        started.append("down")

    app = FastAPI(lifespan=lifespan)
    with running(RagguardMiddleware(app, guard=guard_with()), lifespan="on") as url:
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/nothing")).status_code == 404
        assert started == ["up"]
    assert started == ["up", "down"]


async def test_request_bodies_reach_the_app(style: str, gate: Gate) -> None:
    text = "chunk " * 200_000  # 1.2 MB: arrives in many receive() messages
    with serve(guard_with(), gate, style) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            reply = await client.post("/echo", json={"text": text}, headers={"x-tenant-id": "acme"})
    assert reply.json() == {"size": len(text), "tenant": "acme"}


async def test_status_endpoint_reports_the_guard() -> None:
    guard = guard_with()
    await guard.guard("embed")(_noop)()
    with running(StatusEndpoint(guard, open_status=503)) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            healthy = await client.get("/")
            guard.breaker("embed").force_open()
            unhealthy = await client.get("/")
    assert healthy.status_code == 200 and healthy.json()["ok"] is True
    assert healthy.json()["stages"]["embed"]["breaker"]["state"] == "closed"
    assert unhealthy.status_code == 503 and unhealthy.json()["open"] == ["embed"]
    body = json.loads(unhealthy.content)
    assert body.pop("counts")["rejected"] == {}  # the endpoint counts refusals too (none here)
    assert body == guard.status()


async def _noop() -> None:
    return None


# --- the mapping as a unit -------------------------------------------------------------------


def test_retry_after_rounds_up_to_whole_seconds_and_ms_is_exact() -> None:
    status = http_status_for(ragguard.QuotaExceeded("acme", 0.3, "concurrency"))
    assert status is not None
    code, headers, body = status
    fields = dict(headers)
    assert code == 429
    assert fields[b"retry-after"] == b"1" and fields[b"retry-after-ms"] == b"300"
    assert fields[b"ratelimit"] == b'"concurrency";r=0;t=1'
    assert body["retry_after_s"] == 0.3
    status = http_status_for(ragguard.QuotaExceeded("acme", 2.0001, "remote"), ratelimit_fields=True)
    assert status is not None
    fields = dict(status[1])
    assert fields[b"retry-after"] == b"3" and b"ratelimit" not in fields  # not our quota policy
    assert http_status_for(RuntimeError("x")) is None


@pytest.mark.parametrize(
    "options",
    [
        {"tenant_header": "X-Tenant"},
        {"tenant_header": "a b"},
        {"timeout_header": ""},
        {"exempt_paths": "/health"},
        {"exempt_paths": ("health",)},
        {"degraded_header": 5},
        {"guard": object()},
    ],
)
def test_bad_options_raise_config_error(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        RagguardMiddleware(_noop_app, **options)


async def _noop_app(scope: Any, receive: Any, send: Any) -> None:
    return None
