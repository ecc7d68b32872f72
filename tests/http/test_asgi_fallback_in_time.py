"""A hung stage with a cheap fallback answers 200 before a 500 ms door deadline (it was a 504: the
fallback answered just after the deadline). FastAPI behind RagguardMiddleware on a real uvicorn
server, called with httpx; the Guard runs on the real clock, as in production."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from http_helpers import running

import ragguard
from ragguard import Policy, StagePolicy, TenantQuota
from ragguard.asgi import RagguardMiddleware

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

PASSAGES = ["p1", "p2", "p3"]


def _app(guard: ragguard.Guard, stage: str) -> FastAPI:
    app = FastAPI()

    def keep_order(query: str, passages: list[str]) -> list[str]:
        return passages

    @guard.guard(stage, fallback=keep_order)
    async def rerank(query: str, passages: list[str]) -> list[str]:
        await asyncio.sleep(30)  # the reranker hangs
        return passages[::-1]

    @app.get("/ask")
    async def ask(q: str) -> dict[str, Any]:
        started = time.monotonic()
        ranked = await rerank(q, PASSAGES)
        return {"ranked": ranked, "degraded": list(ragguard.degraded()), "took_s": time.monotonic() - started}

    app.add_middleware(RagguardMiddleware, guard=guard)
    return app


# "rerank": the standard stage (its share of the deadline, then the reserve within it);
# "reranker": a stage of no preset, so the reserve alone keeps the fallback's time
@pytest.mark.parametrize("stage", ["rerank", "reranker"])
async def test_a_hung_stage_with_a_cheap_fallback_answers_200_before_the_door_deadline(stage: str) -> None:
    guard = ragguard.Guard()
    with running(_app(guard, stage)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            answered = await client.get("/ask", params={"q": "x"}, headers={"x-request-timeout-ms": "500"})
    assert answered.status_code == 200, answered.text
    body = answered.json()
    assert body["ranked"] == PASSAGES and body["degraded"] == ["keep_order"]
    assert body["took_s"] < 0.5


async def test_the_tenants_own_budget_at_the_door_is_kept_the_same_way() -> None:
    guard = ragguard.Guard(Policy(tenants={"acme": TenantQuota(timeout_s=0.5)},
                                  stages={"reranker": StagePolicy()}))  # fmt: skip
    with running(_app(guard, "reranker")) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            answered = await client.get("/ask", params={"q": "x"}, headers={"x-tenant-id": "acme"})
    assert answered.status_code == 200, answered.text
    assert answered.json()["degraded"] == ["keep_order"] and answered.json()["took_s"] < 0.5


async def test_with_the_reserve_off_the_same_request_is_a_504() -> None:
    guard = ragguard.Guard(Policy(stages={"reranker": StagePolicy(reserve=0)}))
    with running(_app(guard, "reranker")) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            answered = await client.get("/ask", params={"q": "x"}, headers={"x-request-timeout-ms": "500"})
    assert answered.status_code == 504  # what every such request was before the reserve
