"""guard_qdrant through the real qdrant-client, REST and gRPC, against the Qdrant wire servers: a
store failing (retries, then the breaker, then the fallback), a 429 / RESOURCE_EXHAUSTED with its
Retry-After, a store that hangs (the stage's timeout, the deadline as qdrant's ``timeout``), and a
client leaving the front door while a search waits."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from _door import Sleeps, eventually
from fastapi import FastAPI
from qdrant_client import AsyncQdrantClient

import ragguard
from ragguard import Guard, Policy, StagePolicy
from ragguard.asgi import RagguardMiddleware
from ragguard.breakers import BreakerState
from ragguard.integrations.qdrant import guard_qdrant
from wire import Fault, QdrantGrpcWire, QdrantWire, serving

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["rest", "grpc"])
def store(request: Any, qdrant_wire: QdrantWire, qdrant_grpc_wire: QdrantGrpcWire, closing: list[Any]) -> Any:
    """``(wire, make)``: the wire server of the protocol, and ``make(guard, **options)`` a guarded
    AsyncQdrantClient talking to it."""
    if request.param == "rest":
        wire: Any = qdrant_wire

        def client() -> AsyncQdrantClient:
            return AsyncQdrantClient(url=qdrant_wire.url, check_compatibility=False)
    else:
        wire = qdrant_grpc_wire

        def client() -> AsyncQdrantClient:
            return AsyncQdrantClient(
                host="127.0.0.1", grpc_port=qdrant_grpc_wire.port, prefer_grpc=True, check_compatibility=False
            )

    def make(guard: Guard, **options: Any) -> Any:
        raw = client()
        closing.append(raw)
        return guard_qdrant(raw, guard=guard, **options)

    return request.param, wire, make


def _down(protocol: str) -> Fault:
    return Fault(status=503) if protocol == "rest" else Fault(grpc_code="UNAVAILABLE")


def _limited(protocol: str, seconds: int) -> Fault:
    if protocol == "rest":
        return Fault(status=429, headers={"retry-after": str(seconds)})
    return Fault(grpc_code="RESOURCE_EXHAUSTED", trailers=(("retry-after", str(seconds)),))


async def test_a_failing_store_is_retried_then_its_breaker_opens_and_the_fallback_serves(
    store: Any, sleeps: Sleeps
) -> None:
    protocol, wire, make = store
    g = Guard(sleep=sleeps)  # the standard vector_store stage: 2 attempts, its typed breaker (5 calls)

    def keyword_search(collection_name: str, **kwargs: Any) -> list[str]:
        return ["keyword hit"]

    client = make(g, fallback=keyword_search)
    bare = make(g)
    wire.faults.always("query", _down(protocol))
    for _ in range(5):
        assert await client.query_points("docs", query=[0.1, 0.2], limit=3) == ["keyword hit"]
    # two attempts a call, each counted by the breaker, until the fifth failed attempt opened it
    assert wire.faults.seen["query"] == 5
    assert g.breaker("vector_store").state is BreakerState.OPEN
    assert "keyword_search" in ragguard.degraded()
    with pytest.raises(ragguard.VectorStoreUnavailable):  # no fallback: the typed breaker's error
        await bare.query_points("docs", query=[0.1, 0.2], limit=3)
    assert wire.faults.seen["query"] == 5  # the open breaker sent nothing


async def test_a_rate_limited_store_is_retried_after_its_retry_after(store: Any, sleeps: Sleeps) -> None:
    protocol, wire, make = store
    g = Guard(sleep=sleeps)
    client = make(g)
    wire.faults.push("query", _limited(protocol, 2))
    got = await client.query_points("docs", query=[0.1, 0.2], limit=3)
    assert got.points[0].score == pytest.approx(0.9)
    assert 2.0 in sleeps.waits and wire.faults.seen["query"] == 2


async def test_the_guards_tenant_header_reaches_the_store_over_rest_and_grpc(store: Any) -> None:
    _, wire, make = store
    g = Guard(tenant_header="X-Tenant-Id")
    client = make(g)
    async with g.tenant("acme"):
        await client.query_points("docs", query=[0.1, 0.2], limit=3)
    await client.query_points("docs", query=[0.1, 0.2], limit=3)
    assert [r["headers"].get("x-tenant-id") for r in wire.requests] == ["acme", "default"]


async def test_a_hanging_store_is_cut_by_the_stage_timeout_and_the_deadline_is_its_timeout(
    store: Any, sleeps: Sleeps
) -> None:
    protocol, wire, make = store
    g = Guard(Policy(stages={"vector_store": StagePolicy(timeout_s=0.3)}), sleep=sleeps)
    client = make(g, fallback=lambda *args, **kwargs: "fallback")
    wire.faults.push("query", Fault(delay_s=3.0), times=2)
    assert await client.query_points("docs", query=[0.1], limit=1) == "fallback"
    assert wire.faults.seen["query"] == 2  # each attempt cut at 0.3 s, then the fallback
    if protocol == "rest":
        assert [r["query"].get("timeout") for r in wire.requests] == ["1", "1"]  # 0.3 s, in whole seconds
    unbounded = Guard(Policy(stages={"vector_store": StagePolicy(timeout_s=None, deadline_share=1)}))
    async with unbounded.deadline(5.0):
        await make(unbounded).query_points("docs", query=[0.1], limit=1)
    if protocol == "rest":
        assert wire.requests[-1]["query"]["timeout"] == "5"
    shared = Guard(Policy(stages={"vector_store": StagePolicy(timeout_s=None)}))  # its standard share, 0.25
    async with shared.deadline(5.0):
        await make(shared).query_points("docs", query=[0.1], limit=1)
    if protocol == "rest":
        assert wire.requests[-1]["query"]["timeout"] == "2"  # 1.25 s of the 5, in whole seconds


async def test_a_client_leaving_the_front_door_cancels_the_waiting_search(store: Any) -> None:
    _, wire, make = store
    g = Guard()
    client = make(g)
    wire.faults.push("query", Fault(delay_s=10.0))
    ended: list[str] = []
    app = FastAPI()
    app.add_middleware(RagguardMiddleware, guard=g)

    @app.get("/search")
    async def search() -> Any:
        try:
            await client.query_points("docs", query=[0.1], limit=1)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise
        ended.append("answered")
        return {}

    with serving(app) as (url, _):
        async with httpx.AsyncClient(base_url=url) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.get("/search", timeout=0.5)  # the client gives up and goes away
        await eventually(lambda: ended == ["cancelled"], within_s=3.0)  # long before the 10 s delay
    assert wire.faults.seen["query"] == 1
