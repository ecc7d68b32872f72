"""A hung stage with a cheap fallback answers OK before a 500 ms client deadline (it was
DEADLINE_EXCEEDED: the fallback answered just after the deadline). A real grpc.aio server with
ragguard's interceptor and a real client on loopback; the Guard runs on the real clock."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import grpc
import pytest
from grpc import aio

import ragguard
from ragguard import Policy, StagePolicy
from ragguard.grpc import GuardServerInterceptor

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def _ask(guard: ragguard.Guard, stage: str) -> Any:
    def keep_order(query: str, passages: list[str]) -> list[str]:
        return passages

    @guard.guard(stage, fallback=keep_order)
    async def rerank(query: str, passages: list[str]) -> list[str]:
        await asyncio.sleep(30)  # the reranker hangs
        return passages[::-1]

    async def handler(request: bytes, context: aio.ServicerContext[Any, Any]) -> bytes:
        started = time.monotonic()
        ranked = await rerank("q", request.decode().split())
        took = time.monotonic() - started
        return json.dumps({"ranked": ranked, "degraded": list(ragguard.degraded()), "took_s": took}).encode()

    server = aio.server(interceptors=[GuardServerInterceptor(guard=guard)])
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("t.S", {"M": grpc.unary_unary_rpc_method_handler(handler)}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            return await channel.unary_unary("/t.S/M")(b"p1 p2", timeout=0.5)
    finally:
        await server.stop(None)


@pytest.mark.parametrize("stage", ["rerank_v2", "rerank"])
async def test_a_hung_stage_with_a_cheap_fallback_answers_before_the_clients_deadline(stage: str) -> None:
    answer = json.loads(await _ask(ragguard.Guard(), stage))
    assert answer["ranked"] == ["p1", "p2"] and answer["degraded"] == ["keep_order"]
    assert answer["took_s"] < 0.5


async def test_with_the_reserve_off_the_same_call_is_deadline_exceeded() -> None:
    guard = ragguard.Guard(Policy(stages={"rerank_v2": StagePolicy(reserve=0)}))
    with pytest.raises(aio.AioRpcError) as info:
        await _ask(guard, "rerank_v2")
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
