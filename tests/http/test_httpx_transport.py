"""GuardTransport against real ragguard services (FastAPI + RagguardMiddleware on uvicorn)."""

from __future__ import annotations

import asyncio
import email.utils
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from http_helpers import ERRORS, running

import ragguard
from ragguard import DeadlineExceeded, FakeClock, Policy, QuotaExceeded, TenantQuota
from ragguard.asgi import RagguardMiddleware
from ragguard.breakers import (
    BreakerState,
    EmbeddingTimeoutBreaker,
    VectorStoreUnavailableBreaker,
    is_connection_error,
    is_timeout,
)
from ragguard.httpx import GuardTransport, RemoteQuotaExceeded, RemoteUnavailable
from ragguard.httpx._errors import retry_after_of
from ragguard.outcomes import Kind, classify

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def guard_with(**tenants: TenantQuota) -> ragguard.Guard:
    return ragguard.Guard(Policy(tenants=tenants), clock=FakeClock())


def downstream(guard: ragguard.Guard, hits: list[str] | None = None) -> Any:
    """A ragguard service: what it saw of the caller, slow answers, slow bodies, errors."""
    app = FastAPI()
    seen = hits if hits is not None else []

    @app.get("/whoami")
    async def whoami() -> dict[str, Any]:
        seen.append("whoami")
        return {"tenant": ragguard.current_tenant(), "remaining": ragguard.remaining()}

    @app.get("/slow")
    async def slow(s: float) -> dict[str, Any]:
        await asyncio.sleep(s)
        return {}

    @app.get("/slowbody")
    async def slowbody() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"first "
            await asyncio.sleep(5)
            yield b"late"

        return StreamingResponse(chunks(), media_type="text/plain")

    @app.get("/raise/{name}")
    async def fail(name: str) -> dict[str, Any]:
        raise ERRORS[name]()

    app.add_middleware(RagguardMiddleware, guard=guard)
    return app


def client(url: str, **options: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, transport=GuardTransport(**options))


async def test_tenant_and_deadline_travel_with_the_request() -> None:
    caller = guard_with()
    with running(downstream(guard_with())) as url:
        async with client(url) as http:
            async with caller.tenant("acme"):
                with ragguard.deadline(1.5):
                    inside = (await http.get("/whoami")).json()
                    explicit = (await http.get("/whoami", headers={"x-tenant-id": "globex"})).json()
            outside = (await http.get("/whoami")).json()
    assert inside["tenant"] == "acme" and 1.0 < inside["remaining"] <= 1.5
    assert explicit["tenant"] == "globex"
    assert outside == {"tenant": "default", "remaining": None}


async def test_the_deadline_cuts_a_slow_answer_as_deadline_exceeded() -> None:
    with running(downstream(guard_with())) as url:
        async with client(url) as http:
            with ragguard.deadline(0.3), pytest.raises(DeadlineExceeded) as info:
                await http.get("/slow", params={"s": 5})
            # the caller's own, shorter timeout stays an httpx timeout: it says the server is slow
            with ragguard.deadline(5.0), pytest.raises(httpx.ReadTimeout):
                await http.get("/slow", params={"s": 5}, timeout=0.2)
    err = info.value
    assert isinstance(err.__context__, (TimeoutError, httpx.TimeoutException))
    assert not is_timeout(err) and not is_connection_error(err)  # breakers do not count it
    assert err.budget_s is not None and 0.2 < err.budget_s <= 0.3


async def test_an_embedding_breaker_does_not_count_calls_the_deadline_cut() -> None:
    breaker = EmbeddingTimeoutBreaker(minimum_calls=2, window_size=2, clock=FakeClock())
    with running(downstream(guard_with())) as url:
        async with client(url) as http:
            for _ in range(3):
                with ragguard.deadline(0.2), pytest.raises(DeadlineExceeded):
                    await breaker.call(http.get, "/slow", params={"s": 5})
            # the callers' budgets were short, the server was not unwell
            assert breaker.state == BreakerState.CLOSED
            for _ in range(2):  # a server slower than the caller's own timeout is unwell
                with ragguard.deadline(5.0), pytest.raises(httpx.ReadTimeout):
                    await breaker.call(http.get, "/slow", params={"s": 5}, timeout=0.2)
    assert breaker.state == BreakerState.OPEN


async def test_the_deadline_cuts_a_slow_response_body() -> None:
    with running(downstream(guard_with())) as url:
        async with client(url) as http:
            with ragguard.deadline(0.4):
                async with http.stream("GET", "/slowbody") as reply:
                    chunks = reply.aiter_bytes()
                    assert await anext(chunks) == b"first "
                    with pytest.raises(DeadlineExceeded, match="response body cut"):
                        await anext(chunks)


async def test_a_spent_deadline_sends_nothing() -> None:
    hits: list[str] = []
    with running(downstream(guard_with(), hits)) as url:
        async with client(url) as http:
            with ragguard.deadline(0.0), pytest.raises(DeadlineExceeded, match="no time left"):
                await http.get("/whoami")
            await http.get("/whoami")
    assert hits == ["whoami"]  # only the second request reached the server


async def test_429_and_503_become_typed_errors_with_retry_after_s() -> None:
    caller = guard_with()
    server = guard_with(acme=TenantQuota(rate_per_s=2.0, burst=1))
    with running(downstream(server)) as url:
        async with client(url) as http:
            async with caller.tenant("acme"):
                await http.get("/whoami")
                with pytest.raises(RemoteQuotaExceeded) as throttled:
                    await http.get("/whoami")
            with pytest.raises(RemoteUnavailable) as unavailable:
                await http.get("/raise/breaker")
            with pytest.raises(RemoteUnavailable) as forced:
                await http.get("/raise/breaker_forced")
    quota = throttled.value
    # the dependency's rejection, not this service's quota refusal
    assert not isinstance(quota, QuotaExceeded) and isinstance(quota, httpx.HTTPStatusError)
    assert (quota.tenant, quota.reason, quota.retry_after_s) == ("acme", "remote", 0.5)
    assert quota.response.status_code == 429 and quota.response.json()["error"] == "QuotaExceeded"
    assert classify(quota).kind is Kind.REJECTION and classify(quota).retry_after_s == 0.5
    assert not is_connection_error(quota)
    down = unavailable.value
    assert isinstance(down, ConnectionError)
    assert down.retry_after_s == 1.251  # the exact retry-after-ms, not the rounded Retry-After
    assert down.request.url.path == "/raise/breaker"
    # a 503 that says when to come back is a rejection; one that does not, an outage
    assert classify(down).kind is Kind.REJECTION and not is_connection_error(down)
    assert forced.value.retry_after_s is None and is_connection_error(forced.value)


async def test_a_vector_store_breaker_counts_503s_and_not_429s() -> None:
    breaker = VectorStoreUnavailableBreaker(minimum_calls=2, window_size=2, clock=FakeClock())
    with running(downstream(guard_with())) as url:
        async with client(url) as http:
            for path in ("/raise/quota", "/raise/breaker"):  # 429, and 503 with Retry-After
                with pytest.raises((RemoteQuotaExceeded, RemoteUnavailable)):
                    await breaker.call(http.get, path)
            assert breaker.state == BreakerState.CLOSED
            metrics = breaker.metrics()  # the 429 is not counted; the 503 stating a wait, a rejection
            assert (metrics.calls, metrics.rejected_calls, metrics.failed_calls) == (1, 1, 0)
            with pytest.raises(RemoteUnavailable):
                await breaker.call(http.get, "/raise/breaker_forced")  # 503, no wait stated
    assert breaker.state == BreakerState.OPEN  # the window is full: 1 of the 1 calls served failed


async def test_raise_statuses_false_hands_responses_back() -> None:
    with running(downstream(guard_with())) as url:
        async with client(url, raise_statuses=False) as http:
            reply = await http.get("/raise/breaker")
    assert reply.status_code == 503 and reply.headers["retry-after"] == "2"


async def test_two_ragguard_services_chain() -> None:
    down_guard = guard_with(acme=TenantQuota(rate_per_s=4.0, burst=1))
    up = FastAPI()
    with running(downstream(down_guard)) as down_url:

        @up.get("/ask")
        async def ask() -> dict[str, Any]:
            async with client(down_url) as down:
                reply = await down.get("/whoami")  # no ragguard code: transport and middleware do it
            return {"downstream": reply.json(), "remaining": ragguard.remaining()}

        up.add_middleware(RagguardMiddleware, guard=guard_with())
        with running(up) as up_url:
            async with httpx.AsyncClient(base_url=up_url) as http:
                headers = {"x-tenant-id": "acme", "x-request-timeout-ms": "3000"}
                first = (await http.get("/ask", headers=headers)).json()
                refused = await http.get("/ask", headers=headers)
    assert first["downstream"]["tenant"] == "acme"
    assert 0 < first["downstream"]["remaining"] <= first["remaining"] + 0.01 <= 3.01
    # the downstream's 429 reaches the original caller as 503 (the caller is not over *its*
    # quota: a dependency of the service is) with the same wait
    assert refused.status_code == 503
    assert refused.headers["retry-after-ms"] == "250" and refused.headers["retry-after"] == "1"
    assert refused.json()["outcome"] == "rejection" and "127.0.0.1" not in refused.text


def test_retry_after_fields() -> None:
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 7, usegmt=True)
    assert retry_after_of(httpx.Headers({"retry-after": "3"})) == 3.0
    assert retry_after_of(httpx.Headers({"retry-after": "2", "retry-after-ms": "1500"})) == 1.5
    assert retry_after_of(httpx.Headers({"retry-after": "soon"})) is None
    assert retry_after_of(httpx.Headers({"retry-after-ms": "-1", "retry-after": "4"})) == 4.0
    assert retry_after_of(httpx.Headers({})) is None
    from ragguard._http import parse_retry_after

    assert parse_retry_after(date, now=now) == pytest.approx(7.0)
    assert parse_retry_after(email.utils.formatdate(now - 60, usegmt=True), now=now) == 0.0


def test_the_subpackage_wraps_the_real_httpx() -> None:
    import ragguard.httpx as ours

    assert ours is not httpx and issubclass(GuardTransport, httpx.AsyncBaseTransport)
    with pytest.raises(ragguard.ConfigError):
        GuardTransport(object())  # type: ignore[arg-type]
    with pytest.raises(ragguard.ConfigError):
        GuardTransport(tenant_header="X Tenant")
