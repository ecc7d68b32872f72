"""A guarded generation stream as the body of a real SSE response (uvicorn on loopback, httpx): cut
by its budgets with a ragguard-error event that names the budget and the items sent, served by a
fallback before its first item, paced per tenant, and settled when the client goes away."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from http_helpers import eventually, running

import ragguard
from ragguard import FakeClock, GenerationPolicy, Policy, StagePolicy, TenantQuota
from ragguard.asgi import SSE_ENDING_EVENT, SSE_ERROR_EVENT, RagguardMiddleware, primed
from ragguard.rag import token_accounts

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def generation_app(g: ragguard.Guard) -> Any:
    """An answer endpoint streaming a guarded model's words as SSE events."""
    app = FastAPI()

    def extractive(question: str, mode: str) -> list[str]:
        return ["from", "the", "passages"]

    @g.guard("generation", fallback=extractive)
    async def model(question: str, mode: str) -> AsyncIterator[str]:
        if mode == "slow_start":
            await asyncio.sleep(30)
        for i in range(40 if mode == "long" else 6):
            if mode == "stall" and i == 3:
                await asyncio.sleep(30)
            yield f"w{i:02d}"

    @app.get("/answer")
    async def answer(q: str, mode: str = "ok") -> StreamingResponse:
        items = await primed(model(q, mode))  # a failure before the first item answers a status

        async def events() -> AsyncIterator[str]:
            async with aclosing(items):
                async for word in items:
                    yield f"data: {word}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return RagguardMiddleware(app, guard=g)


def budgets(**tenants: TenantQuota) -> Policy:
    generation = GenerationPolicy(first_item_s=0.3, idle_s=0.3, total_s=10.0, estimate_tokens=40)
    return Policy(stages={"generation": StagePolicy(generation=generation)}, tenants=tenants)


async def sse_events(reply: httpx.Response) -> list[tuple[str, str]]:
    """(event, data) pairs of an SSE body, in order."""
    events, kind = [], "message"
    async for line in reply.aiter_lines():
        if line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: "):
            events.append((kind, line[len("data: ") :]))
            kind = "message"
    return events


async def test_a_stalled_answer_is_cut_with_an_event_naming_the_budget_and_the_items_sent() -> None:
    g = ragguard.Guard(budgets())
    with running(generation_app(g)) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            async with client.stream("GET", "/answer", params={"q": "why", "mode": "stall"}) as reply:
                assert reply.status_code == 200
                events = await sse_events(reply)
    assert events[:3] == [("message", "w00"), ("message", "w01"), ("message", "w02")]
    ending = json.loads(events[3][1])  # how the answer ended, before the error that ended it
    assert events[3][0] == SSE_ENDING_EVENT
    assert ending == {"ending": "incomplete", "stage": "generation", "items": 3, "error": "StreamTimeout"}
    kind, data = events[4]
    error = json.loads(data)
    assert kind == SSE_ERROR_EVENT and len(events) == 5  # no fallback after the first item
    assert (error["status"], error["error"]) == (504, "StreamTimeout")
    assert (error["budget"], error["items"]) == ("idle", 3)


async def test_an_answer_whose_first_item_never_comes_is_served_by_the_fallback() -> None:
    g = ragguard.Guard(budgets())
    with running(generation_app(g)) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            async with client.stream("GET", "/answer", params={"q": "why", "mode": "slow_start"}) as reply:
                events = await sse_events(reply)
    assert [data for _, data in events][:3] == ["from", "the", "passages"]
    assert events[3] == (SSE_ENDING_EVENT, '{"ending": "completed", "stage": "generation", "items": 3}')
    assert events[4] == ("message", "[DONE]")  # the ending is told before what the app sends next


async def test_a_greedy_tenant_is_paced_and_another_is_not() -> None:
    clock = FakeClock()  # the server's pacing waits move it; nothing else in the app takes its time
    g = ragguard.Guard(budgets(greedy=TenantQuota(tokens_per_s=20, token_burst=4)), clock=clock)
    with running(generation_app(g)) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            long = {"q": "why", "mode": "long"}
            reply = await client.get("/answer", params=long, headers={"x-tenant-id": "polite"})
            assert reply.text.count("data: w") == 40
            assert clock() == 0.0  # nobody paced the polite tenant

            reply = await client.get("/answer", params=long, headers={"x-tenant-id": "greedy"})
            assert reply.text.count("data: w") == 40
    assert clock() == pytest.approx((40 - 4) / 20)  # 40 one-token words at 20 tokens/s after a burst of 4


async def test_a_token_quota_refusal_before_the_first_item_answers_429() -> None:
    g = ragguard.Guard(budgets(acme=TenantQuota(token_quota=50)), clock=FakeClock())
    acme = {"x-tenant-id": "acme"}
    with running(generation_app(g)) as url:
        async with httpx.AsyncClient(base_url=url, headers=acme) as client:
            reply = await client.get("/answer", params={"q": "why", "mode": "long"})  # spends 40 of 50
            assert reply.status_code == 200
            refused = await client.get("/answer", params={"q": "why"})  # cannot reserve 40 more
    assert refused.status_code == 429
    assert refused.json()["error"] == "QuotaExceeded" and "tokens" in refused.json()["detail"]
    assert float(refused.headers["retry-after-ms"]) == pytest.approx(30 * 60_000 / 50)
    assert token_accounts(g).reserved("acme") == 0


async def test_a_client_that_leaves_mid_answer_leaves_nothing_reserved() -> None:
    policy = Policy(
        stages={"generation": StagePolicy(generation=GenerationPolicy(idle_s=30.0, estimate_tokens=40))},
        tenants={"acme": TenantQuota(token_quota=1000, max_concurrency=1)},
    )
    g = ragguard.Guard(policy)
    accounts = token_accounts(g)
    with running(generation_app(g)) as url:
        async with httpx.AsyncClient(base_url=url, headers={"x-tenant-id": "acme"}) as client:
            async with client.stream("GET", "/answer", params={"q": "why", "mode": "stall"}) as reply:
                lines = reply.aiter_lines()
                assert await anext(lines) == "data: w00"
                assert await eventually(lambda: accounts.reserved("acme") == 40)
            assert await eventually(lambda: accounts.open_streams("acme") == 0), "the stream is still open"
            assert accounts.reserved("acme") == 0
            assert accounts.settled("acme") == 3  # what the model had produced when the client left
            assert await eventually(lambda: g.quotas.in_flight("acme") == 0)


async def test_primed_raises_before_the_first_item_and_closes_what_it_read() -> None:
    closed: list[str] = []

    async def stream(fail: bool, n: int) -> AsyncIterator[int]:
        try:
            if fail:
                raise ConnectionRefusedError("no model")
            for i in range(n):
                yield i
        finally:
            closed.append(f"{fail}:{n}")

    with pytest.raises(ConnectionRefusedError):
        await primed(stream(True, 3))
    assert [i async for i in await primed(stream(False, 3))] == [0, 1, 2]
    assert [i async for i in await primed(stream(False, 0))] == []
    early = await primed(stream(False, 5))
    assert await anext(early) == 0
    await early.aclose()
    assert closed == ["True:3", "False:3", "False:0", "False:5"]


def _read_first_app(g: ragguard.Guard, **options: Any) -> Any:
    """An endpoint that reads a guarded stream to its end, then streams what it read as SSE."""
    app = FastAPI()

    @g.guard("generation")
    async def model(question: str) -> AsyncIterator[str]:
        for word in ("a", "b"):
            yield word

    @app.get("/answer")
    async def answer() -> StreamingResponse:
        words = [word async for word in model("why")]

        async def events() -> AsyncIterator[str]:
            for word in words:
                yield f"data: {word}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return RagguardMiddleware(app, guard=g, **options)


async def test_a_stream_read_before_the_response_is_told_with_its_first_chunk_unless_turned_off() -> None:
    g = ragguard.Guard(budgets())
    for options, told in (({}, True), ({"ending_events": False}, False)):
        transport = httpx.ASGITransport(app=_read_first_app(g, **options))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            reply = await client.get("/answer")
        data = '{"ending": "completed", "stage": "generation", "items": 2}'
        ending = f"event: {SSE_ENDING_EVENT}\ndata: {data}\n\n"
        assert reply.text == (ending if told else "") + "data: a\n\ndata: b\n\n"
