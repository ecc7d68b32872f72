"""RagguardMiddleware(max_concurrent_requests=): the service's capacity shared by tenants at the
HTTP door, on a real uvicorn server called with httpx (the gRPC door's twin:
tests/grpc/test_grpc_server_bulkhead.py)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from http_helpers import Gate, eventually, rag_app, running, wait_for

import ragguard
from ragguard import ConfigError, Policy, TenantQuota
from ragguard.asgi import RagguardMiddleware

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

CAPACITY = 6
FLOOD = {"x-tenant-id": "flood"}
CALM = {"x-tenant-id": "calm"}


def flood_guard() -> ragguard.Guard:
    return ragguard.Guard(Policy(tenants={
        "flood": TenantQuota(max_concurrency=2, max_wait_s=2.0),
        "calm": TenantQuota(max_concurrency=4, max_wait_s=0.5),
    }))


def counting_app() -> tuple[FastAPI, dict[str, int]]:
    """An endpoint that holds each request 20 ms and records the most it served at once."""
    app = FastAPI()
    seen = {"now": 0, "most": 0}

    @app.get("/work")
    async def work() -> dict[str, Any]:
        seen["now"] += 1
        seen["most"] = max(seen["most"], seen["now"])
        try:
            await asyncio.sleep(0.02)
        finally:
            seen["now"] -= 1
        return {"tenant": ragguard.current_tenant()}

    return app, seen


CALM_CALLS = 20


async def flood_and_calm(url: str, *, workers: int = 16, within_s: float = 20.0) -> Counter[Any]:
    """``workers`` callers of tenant ``flood`` each send again as soon as answered, for as long as
    tenant ``calm`` sends its CALM_CALLS requests, one every 40 ms (fewer only past ``within_s``,
    a bound on a stalled run); each request holds the service 20 ms. Counts the answers."""
    counts: Counter[Any] = Counter()
    loop = asyncio.get_running_loop()
    start = loop.time()
    done = asyncio.Event()
    limits = httpx.Limits(max_connections=workers + 2)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=10) as client:

        async def flooder() -> None:
            while not done.is_set() and loop.time() - start < within_s:
                reply = await client.get("/work", headers=FLOOD)
                counts["flood", reply.status_code] += 1

        async def calm_caller() -> None:
            try:
                for sent in range(1, CALM_CALLS + 1):
                    if loop.time() - start >= within_s:
                        break
                    reply = await client.get("/work", headers=CALM)
                    counts["calm", reply.status_code] += 1
                    await asyncio.sleep(max(0.0, sent * 0.04 - (loop.time() - start)))
            finally:
                done.set()

        await asyncio.gather(calm_caller(), *(flooder() for _ in range(workers)))
    return counts


async def test_the_servers_own_bound_costs_the_calm_tenant_its_requests() -> None:
    """What main offered: uvicorn's tenant-blind ``limit_concurrency`` answers the calm tenant
    503 while the flood's requests (and connections) hold the service."""
    app, _ = counting_app()
    door = RagguardMiddleware(app, guard=flood_guard())
    with running(door, limit_concurrency=CAPACITY) as url:
        counts = await flood_and_calm(url)
    assert counts["calm", 503] > 0, counts
    calm = sum(n for (who, _), n in counts.items() if who == "calm")
    assert counts["calm", 200] / calm < 0.99, counts


async def test_the_calm_tenant_keeps_its_requests_and_the_service_its_bound() -> None:
    app, seen = counting_app()
    door = RagguardMiddleware(app, guard=flood_guard(), max_concurrent_requests=CAPACITY)
    with running(door) as url:
        counts = await flood_and_calm(url)
    calm = counts["calm", 200] + sum(n for (who, code), n in counts.items() if who == "calm" and code != 200)
    assert calm == CALM_CALLS, counts
    assert counts["calm", 200] / calm >= 0.99, counts
    assert counts["flood", 429] > 0 and counts["flood", 200] > 0, counts
    assert seen["most"] <= CAPACITY  # never more at once than the bound, waiting ones included
    assert door.bulkhead is not None
    assert await eventually(lambda: door.bulkhead is not None and door.bulkhead.held == 0)


@asynccontextmanager
async def one_holding_one_waiting(capacity: int) -> AsyncIterator[Any]:
    """A door of ``capacity`` in front of the RAG app: tenant flood (quota: 1 call) holds one
    request inside the app and has a second waiting in its quota. Yields the client, the guard,
    the bulkhead, the gate holding the first and the waiting request's task; the first request
    is let go and answered 200 at the end, and every seat and slot is given back after."""
    gate = Gate()
    guard = ragguard.Guard(Policy(tenants={"flood": TenantQuota(max_concurrency=1, max_wait_s=10.0)}))
    door = RagguardMiddleware(rag_app(guard, gate), guard=guard, max_concurrent_requests=capacity)
    bulkhead = door.bulkhead
    assert bulkhead is not None
    with running(door) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            holding = asyncio.ensure_future(client.get("/hold", headers=FLOOD))
            assert await asyncio.to_thread(wait_for, gate.entered)
            waiting = asyncio.ensure_future(client.get("/whoami", headers=FLOOD))
            assert await eventually(lambda: bulkhead.waiting("flood") == 1)
            yield client, guard, bulkhead, waiting
            gate.release.set()
            assert (await holding).status_code == 200
    assert await eventually(lambda: bulkhead.held == 0)
    assert guard.quotas.in_flight("flood") == 0 and guard.quotas.waiting("flood") == 0


async def test_a_waiting_request_of_the_heaviest_tenant_is_shed_for_a_lighter_arrival() -> None:
    async with one_holding_one_waiting(2) as (client, _, bulkhead, waiting):
        calm = await client.get("/whoami", headers=CALM)
        assert calm.status_code == 200 and calm.json()["tenant"] == "calm"
        shed = await waiting
        assert shed.status_code == 429
        assert int(shed.headers["retry-after"]) >= 1
        assert "server" in shed.text
    assert bulkhead.shed == 1


async def test_a_client_that_leaves_while_waiting_gives_back_its_seat() -> None:
    async with one_holding_one_waiting(4) as (_, guard, bulkhead, waiting):
        waiting.cancel()  # the client goes away
        assert await eventually(lambda: bulkhead.holding("flood") == 1 and guard.quotas.waiting("flood") == 0)
    assert bulkhead.shed == 0


async def test_a_streamed_response_holds_its_seat_until_its_last_chunk_or_its_client_leaves() -> None:
    """A streaming response runs inside the app's call: its seat is held while its chunks are
    sent, refuses an arrival the server has no room for, and is given back when the stream ends
    and when its client leaves mid-stream."""
    gate = Gate()
    app = FastAPI()

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"first "
            await gate.wait()
            yield b"last"

        return StreamingResponse(chunks(), media_type="text/plain")

    @app.get("/whoami")
    async def whoami() -> dict[str, Any]:
        return {"tenant": ragguard.current_tenant()}

    door = RagguardMiddleware(app, guard=flood_guard(), max_concurrent_requests=1)
    bulkhead = door.bulkhead
    assert bulkhead is not None
    with running(door) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            async with client.stream("GET", "/stream", headers=FLOOD) as reply:
                chunks = reply.aiter_bytes()
                assert await chunks.__anext__() == b"first "
                assert await asyncio.to_thread(wait_for, gate.entered)
                assert bulkhead.holding("flood") == 1
                refused = await client.get("/whoami", headers=CALM)  # no room: the stream holds it
                assert refused.status_code == 429 and "server" in refused.text
                gate.release.set()
                assert b"".join([part async for part in chunks]) == b"last"
            assert await eventually(lambda: bulkhead.held == 0)
            assert (await client.get("/whoami", headers=CALM)).status_code == 200

            gate = Gate()  # the same, the client leaving mid-stream
            async with client.stream("GET", "/stream", headers=FLOOD) as reply:
                # kept: a dropped iterator's finalizer closes the response, the client leaving early
                chunks = reply.aiter_bytes()
                assert await chunks.__anext__() == b"first "
                assert await asyncio.to_thread(wait_for, gate.entered)
                assert bulkhead.holding("flood") == 1
            assert await eventually(lambda: bulkhead.held == 0)
    assert await asyncio.to_thread(wait_for, gate.cancelled)  # the app's stream was cancelled


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_concurrent_requests": 0}, "max_concurrent_requests"),
        ({"max_concurrent_requests": 1.5}, "max_concurrent_requests"),
        ({"max_concurrent_requests": 4, "headroom": 4}, "headroom"),
        ({"headroom": 1}, "headroom"),
    ],
)
def test_bad_options_are_config_errors_naming_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        RagguardMiddleware(FastAPI(), **options)
    assert info.value.field == field
