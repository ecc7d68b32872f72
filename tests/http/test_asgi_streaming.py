"""Streaming through RagguardMiddleware on a real uvicorn server: slots held for the whole stream,
released when the client disconnects, and errors after the response started."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from http_helpers import Gate, eventually, rag_app, running, wait_for

import ragguard
from ragguard import FakeClock, Policy, TenantQuota
from ragguard.asgi import SSE_ERROR_EVENT, RagguardMiddleware

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

ACME = {"x-tenant-id": "acme"}


def guard_with(**tenants: TenantQuota) -> ragguard.Guard:
    return ragguard.Guard(Policy(tenants=tenants), clock=FakeClock())


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    yield g
    g.release.set()


@pytest.fixture(params=["add_middleware", "wrapped"])
def style(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def serve(guard: ragguard.Guard, gate: Gate, style: str) -> Any:
    app = rag_app(guard, gate)
    if style == "add_middleware":
        app.add_middleware(RagguardMiddleware, guard=guard)
        return running(app)
    return running(RagguardMiddleware(app, guard=guard))


async def test_a_stream_holds_the_slot_until_its_last_chunk(style: str, gate: Gate) -> None:
    guard = guard_with(acme=TenantQuota(max_concurrency=1))
    with serve(guard, gate, style) as url:
        async with httpx.AsyncClient(base_url=url, headers=ACME) as client:
            async with client.stream("GET", "/stream", params={"hold": "true"}) as reply:
                lines = reply.aiter_lines()
                assert await anext(lines) == "data: token 0 for acme"
                assert await asyncio.to_thread(wait_for, gate.entered)
                assert guard.quotas.in_flight("acme") == 1
                assert (await client.get("/whoami")).status_code == 429  # the stream holds it
                gate.release.set()
                rest = [line async for line in lines if line]
            assert rest == ["data: token 1 for acme", "data: [DONE]"]
            assert await eventually(lambda: guard.quotas.in_flight("acme") == 0)
            assert (await client.get("/whoami")).status_code == 200


async def test_client_disconnect_mid_stream_releases_the_slot(style: str, gate: Gate) -> None:
    guard = guard_with(acme=TenantQuota(max_concurrency=1))
    with serve(guard, gate, style) as url:
        async with httpx.AsyncClient(base_url=url, headers=ACME) as client:
            async with client.stream("GET", "/stream", params={"hold": "true"}) as reply:
                lines = reply.aiter_lines()  # kept: a dropped iterator's finalizer closes the response
                assert await anext(lines) == "data: token 0 for acme"
                assert await asyncio.to_thread(wait_for, gate.entered)
            # leaving the block closes the half-read response's connection
            assert await eventually(lambda: guard.quotas.in_flight("acme") == 0), "slot still held"
            assert gate.cancelled.is_set()  # the generator was cancelled, not left waiting
            assert (await client.get("/whoami")).status_code == 200


def raw_streaming_app(gate: Gate) -> Any:
    """A pure ASGI app that streams and never listens for the disconnect itself."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        headers = [(b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
        await gate.wait()  # e.g. waiting for the next token of a slow generation
        await send({"type": "http.response.body", "body": b"second\n", "more_body": False})

    return app


async def test_disconnect_cancels_an_app_that_does_not_watch_for_it(gate: Gate) -> None:
    guard = guard_with(acme=TenantQuota(max_concurrency=1))
    with running(RagguardMiddleware(raw_streaming_app(gate), guard=guard)) as url:
        async with httpx.AsyncClient(base_url=url, headers=ACME) as client:
            async with client.stream("GET", "/") as reply:
                lines = reply.aiter_lines()  # kept: a dropped iterator's finalizer closes the response
                assert await anext(lines) == "first"
                assert await asyncio.to_thread(wait_for, gate.entered)
                assert guard.quotas.in_flight("acme") == 1
            assert await eventually(lambda: guard.quotas.in_flight("acme") == 0), "slot still held"
            assert gate.cancelled.is_set()


async def test_a_client_that_gives_up_on_a_slow_answer_frees_the_slot(style: str, gate: Gate) -> None:
    guard = guard_with(acme=TenantQuota(max_concurrency=1))
    with serve(guard, gate, style) as url:
        async with httpx.AsyncClient(base_url=url, headers=ACME) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.get("/hold", timeout=httpx.Timeout(5.0, read=0.3))
            assert await eventually(lambda: guard.quotas.in_flight("acme") == 0), "slot still held"
            assert gate.cancelled.is_set()


async def test_sse_error_after_the_response_started_ends_the_stream_cleanly(style: str, gate: Gate) -> None:
    guard = guard_with(acme=TenantQuota(max_concurrency=1))
    with serve(guard, gate, style) as url:
        async with httpx.AsyncClient(base_url=url, headers=ACME) as client:
            reply = await client.get("/stream", params={"fail": "breaker"})
            assert await eventually(lambda: guard.quotas.in_flight("acme") == 0)
    assert reply.status_code == 200  # already sent when the error came
    events = [e for e in reply.text.split("\n\n") if e]
    assert events[:2] == ["data: token 0 for acme", "data: token 1 for acme"]
    name, data = events[2].split("\n")
    assert name == f"event: {SSE_ERROR_EVENT}"
    error = json.loads(data.removeprefix("data: "))
    assert error["status"] == 503 and error["error"] == "VectorStoreUnavailable"
    assert error["retry_after_s"] == pytest.approx(1.2501)
    assert len(events) == 3


@pytest.mark.parametrize("fail", ["deadline", "runtime"])
async def test_chunked_error_after_the_response_started_ends_the_body_cleanly(
    style: str, gate: Gate, fail: str
) -> None:
    with serve(guard_with(), gate, style) as url:
        async with httpx.AsyncClient(base_url=url, headers=ACME) as client:
            # a truncated chunked body would raise httpx.RemoteProtocolError here
            reply = await client.get("/stream", params={"fail": fail, "media": "text/plain"})
            after = await client.get("/whoami")
    assert reply.status_code == 200
    assert reply.text == "data: token 0 for acme\n\ndata: token 1 for acme\n\n"
    assert after.status_code == 200
