"""A stage timeout inside a handler is DEADLINE_EXCEEDED from the gRPC front door, against a real
grpc.aio server and client on loopback."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from grpc import aio

import ragguard
from ragguard import FakeClock, Policy, StagePolicy
from ragguard.grpc import GuardServerInterceptor

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_a_stage_timeout_is_deadline_exceeded() -> None:
    clock = FakeClock()
    guard = ragguard.Guard(Policy(stages={"rerank_v2": StagePolicy(timeout_s=0.5)}), clock=clock)

    @guard.guard("rerank_v2")
    async def rerank(query: bytes) -> bytes:
        # the model hangs past the stage's 0.5 s (the attempt timer runs on the Guard's clock),
        # not past the request's 10 s: that would end the whole handler first
        await clock.sleep(5)
        return query

    async def handler(request: bytes, context: aio.ServicerContext[Any, Any]) -> bytes:
        return await rerank(request)

    server = aio.server(interceptors=[GuardServerInterceptor(guard=guard)])
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("t.S", {"M": grpc.unary_unary_rpc_method_handler(handler)}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(aio.AioRpcError) as info:
                await channel.unary_unary("/t.S/M")(b"q", timeout=10)
    finally:
        await server.stop(None)
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "rerank_v2" in (info.value.details() or "")
