"""GuardTransport against real ragguard services (FastAPI + RagguardMiddleware on uvicorn)."""

from __future__ import annotations

import asyncio
import email.utils
import gzip
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from http_helpers import ERRORS, running
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

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
from ragguard.httpx import GuardTransport, RemoteDeadlineExceeded, RemoteQuotaExceeded, RemoteUnavailable
from ragguard.httpx._errors import ERROR_BODY_BYTES, retry_after_of
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


JSON = "application/json"
TOLD = {"deadline_set_by": "client", "deadline_s": 0.25}
ENDLESS = 50_000  # 1 KiB chunks a streamed 504 body would send (50 MiB), were it all read
JUNK_504: list[tuple[str, bytes | None, dict[str, str], tuple[str | None, float | None]]] = [
    # content-type, body (None: streamed, ENDLESS KiB), other headers -> (set_by, deadline_s)
    (JSON, json.dumps(TOLD).encode(), {}, ("client", 0.25)),
    (JSON + "; charset=utf-8", b'{"deadline_set_by": "tenant", "deadline_s": 3}', {}, ("tenant", 3.0)),
    (JSON, b'{"deadline_set_by": "the moon", "deadline_s": 1.5}', {}, (None, 1.5)),  # an unknown word
    (JSON, b'{"deadline_set_by": "CLIENT", "deadline_s": "0.25"}', {}, (None, None)),  # exact; a number
    (JSON, b'{"deadline_set_by": "handler", "deadline_s": NaN}', {}, ("handler", None)),
    (JSON, b'{"deadline_set_by": "handler", "deadline_s": Infinity}', {}, ("handler", None)),
    (JSON, b'{"deadline_set_by": "client", "deadline_s": 1e400}', {}, ("client", None)),  # a float's infinity
    (JSON, b'{"deadline_set_by": "client", "deadline_s": 1e300}', {}, ("client", None)),  # past ten years
    (JSON, b'{"deadline_set_by": "client", "deadline_s": -1}', {}, ("client", None)),
    (JSON, b'{"deadline_set_by": "client", "deadline_s": true}', {}, ("client", None)),
    (JSON, b'{"deadline_set_by": ["client"], "deadline_s": {"s": 1}}', {}, (None, None)),
    (JSON, b'{"deadline_s": ' + b"1" * 5000 + b"}", {}, (None, None)),  # past the int digits limit
    (JSON, b'["client", 1.0]', {}, (None, None)),  # JSON, not an object
    (JSON, b"[" * 8000, {}, (None, None)),  # nested past the parser's recursion limit
    (JSON, b"not json", {}, (None, None)),
    (JSON, b"\xff\xfe{", {}, (None, None)),  # not UTF-8
    (JSON, b"", {}, (None, None)),
    ("text/plain", json.dumps(TOLD).encode(), {}, (None, None)),  # only a JSON body is read
    ("text/html", b"<html><body><h1>504 Gateway Time-out</h1></body></html>", {}, (None, None)),
    (JSON, gzip.compress(json.dumps(TOLD).encode()), {"content-encoding": "gzip"}, ("client", 0.25)),
    (JSON, gzip.compress(b" " * 10_000_000), {"content-encoding": "gzip"}, (None, None)),  # a bomb, cut
    (JSON, b"not gzip", {"content-encoding": "gzip"}, (None, None)),  # undecodable
    (JSON, json.dumps(TOLD | {"pad": "x" * 1_000_000}).encode(), {}, (None, None)),  # 1 MB, cut
    (JSON, None, {}, (None, None)),  # a streamed body that never ends, cut
]


async def endless_body(head: bytes, sent: list[int]) -> AsyncIterator[bytes]:
    """``head``, then ENDLESS KiB (were it all read), each counted in ``sent`` as it goes."""
    yield head
    for _ in range(ENDLESS):
        sent.append(1)
        yield b"x" * 1024
        await asyncio.sleep(0)


def junk_504_server() -> Starlette:
    """``/junk/{i}`` answers 504 with ``JUNK_504[i]``; ``/sent`` the KiB its streamed bodies sent."""
    sent: list[int] = []

    async def junk(request: Request) -> Response:
        media, body, headers, _ = JUNK_504[int(request.path_params["i"])]
        if body is not None:
            return Response(body, status_code=504, headers={"content-type": media, **headers})

        head = b'{"deadline_set_by": "client", "deadline_s": 0.25, "pad": "'
        return StreamingResponse(endless_body(head, sent), status_code=504, media_type=media)

    async def sent_kib(request: Request) -> Response:
        return Response(str(len(sent)))

    async def stall(request: Request) -> Response:
        async def stalled() -> AsyncIterator[bytes]:
            yield json.dumps(TOLD).encode()[:10]
            await asyncio.sleep(5)

        return StreamingResponse(stalled(), status_code=504, media_type=JSON)

    routes = [Route("/junk/{i}", junk), Route("/sent", sent_kib), Route("/stall", stall)]
    return Starlette(routes=routes)


async def test_a_504_body_that_is_junk_tells_nothing_and_is_read_only_so_far() -> None:
    """A server that is not ragguard, or is hostile, may answer 504 with any body: the error says
    None for what it cannot read, never raises otherwise, and at most ERROR_BODY_BYTES of the body
    are read (a huge, compressed or endless one included)."""
    with running(junk_504_server()) as url:
        async with client(url) as http:
            for i, (*_, said) in enumerate(JUNK_504):
                with pytest.raises(RemoteDeadlineExceeded) as info:
                    await http.get(f"/junk/{i}")
                error = info.value
                assert (error.set_by, error.deadline_s) == said, (i, error.response.content[:80])
                assert error.response.status_code == 504 and error.response.is_closed
                raw = error.response.num_bytes_downloaded
                assert raw <= ERROR_BODY_BYTES, (i, raw)
                assert classify(error).kind is Kind.TIMEOUT and is_timeout(error)
            sent = int((await http.get("/sent")).text)
    assert sent < ENDLESS  # the client hung up: the server stopped sending


def endless_error_server() -> Starlette:
    """``/{status}/endless`` and ``/{status}/bomb`` answer ``status`` with a wait stated and a body
    that never ends or inflates to 10 MB; ``/sent`` the KiB the endless ones sent."""
    sent: list[int] = []
    wait = {"retry-after-ms": "250"}

    async def endless(request: Request) -> Response:
        status = int(request.path_params["status"])
        body = endless_body(b'{"error": {"message": "', sent)
        return StreamingResponse(body, status_code=status, media_type=JSON, headers=wait)

    async def bomb(request: Request) -> Response:
        body = gzip.compress(b" " * 10_000_000)
        headers = {"content-type": JSON, "content-encoding": "gzip", **wait}
        return Response(body, status_code=int(request.path_params["status"]), headers=headers)

    async def sent_kib(request: Request) -> Response:
        return Response(str(len(sent)))

    routes = [Route("/{status:int}/endless", endless), Route("/{status:int}/bomb", bomb),
              Route("/sent", sent_kib)]
    return Starlette(routes=routes)


@pytest.mark.parametrize(("status", "error"), [(429, RemoteQuotaExceeded), (503, RemoteUnavailable)])
async def test_a_429_or_503_body_is_read_only_so_far(status: int, error: type[Exception]) -> None:
    """A dependency's 429 or 503 with an endless or inflating body: the error is raised, its wait
    read from the headers, and no more than ERROR_BODY_BYTES of the body is read."""
    with running(endless_error_server()) as url:
        async with client(url) as http:
            for kind in ("endless", "bomb"):
                with pytest.raises(error) as info:
                    await http.get(f"/{status}/{kind}")
                raised = info.value
                assert isinstance(raised, httpx.HTTPStatusError) and raised.retry_after_s == 0.25
                assert raised.response.status_code == status and raised.response.is_closed
                assert raised.response.num_bytes_downloaded <= ERROR_BODY_BYTES, kind
                assert len(raised.response.content) <= ERROR_BODY_BYTES, kind
            sent = int((await http.get("/sent")).text)
    assert sent < ENDLESS  # the client hung up: the server stopped sending


async def test_a_504_body_that_breaks_off_still_raises_the_504() -> None:
    """The caller's own read timeout cutting a 504's body is not what the caller sees: the 504 is."""
    with running(junk_504_server()) as url:
        async with httpx.AsyncClient(base_url=url, transport=GuardTransport(), timeout=0.3) as http:
            with pytest.raises(RemoteDeadlineExceeded) as info:
                await http.get("/stall")
    assert (info.value.set_by, info.value.deadline_s) == (None, None)
    assert info.value.response.is_closed


async def test_raise_statuses_false_hands_a_504_back_whole() -> None:
    with running(junk_504_server()) as url:
        async with client(url, raise_statuses=False) as http:
            big = len(JUNK_504) - 2  # the 1 MB body
            reply = await http.get(f"/junk/{big}")
    assert reply.status_code == 504 and reply.json()["deadline_set_by"] == "client"
    assert len(reply.content) > 1_000_000


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
