"""A guarded generation stream as a gRPC server-streaming handler (grpc.aio server, stock grpcio
client, loopback): cut by its budgets with DEADLINE_EXCEEDED after the messages sent (trailers name
the budget and the count), served by a fallback before its first message, paced per tenant,
refused by the token quota before it starts, and settled when the client cancels."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc import aio
from grpc_helpers import collect_until_error

import ragguard
from ragguard import FakeClock, GenerationPolicy, Policy, StagePolicy, TenantQuota
from ragguard.grpc import (
    STREAM_BUDGET_KEY,
    STREAM_ENDING_KEY,
    STREAM_ERROR_KEY,
    STREAM_ITEMS_KEY,
    GuardServerInterceptor,
)
from ragguard.rag import token_accounts

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

SERVICE = "ragguard.test.Generator"


class Generator:
    """The servicer: ``Answer`` streams a guarded model's words; the request says how it behaves."""

    def __init__(self, g: ragguard.Guard) -> None:
        self.calls = 0

        def extractive(question: str, mode: str) -> list[str]:
            return ["from", "the", "passages"]

        @g.guard("generation", fallback=extractive)
        async def model(question: str, mode: str) -> AsyncIterator[str]:
            self.calls += 1
            if mode == "slow_start":
                await asyncio.sleep(30)
            for i in range(40 if mode == "long" else 6):
                if mode == "stall" and i == 3:
                    await asyncio.sleep(30)
                yield f"w{i:02d}"

        self.model = model

    async def answer(self, request: bytes, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
        async for word in self.model("why", request.decode()):
            yield word.encode()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE, {"Answer": grpc.unary_stream_rpc_method_handler(self.answer)}
        )


class Served:
    def __init__(self, g: ragguard.Guard) -> None:
        self.guard = g
        self.generator = Generator(g)
        self.server = aio.server(interceptors=[GuardServerInterceptor(guard=g)])
        self.server.add_generic_rpc_handlers((self.generator.handler(),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    async def __aenter__(self) -> Served:
        await self.server.start()
        self.channel = aio.insecure_channel(f"127.0.0.1:{self.port}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        await self.server.stop(None)

    def answer(self, mode: str, tenant: str = "acme") -> Any:
        stub = self.channel.unary_stream(f"/{SERVICE}/Answer")
        return stub(mode.encode(), metadata=(("x-tenant-id", tenant),), timeout=10)


def budgets(**tenants: TenantQuota) -> Policy:
    generation = GenerationPolicy(first_item_s=0.3, idle_s=0.3, total_s=10.0, estimate_tokens=40)
    return Policy(stages={"generation": StagePolicy(generation=generation)}, tenants=tenants)


async def test_a_stalled_answer_ends_deadline_exceeded_after_the_messages_sent() -> None:
    async with Served(ragguard.Guard(budgets())) as served:
        got, error = await collect_until_error(served.answer("stall"))
    assert got == [b"w00", b"w01", b"w02"]
    assert isinstance(error, aio.AioRpcError)
    assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "idle budget" in (error.details() or "") and "after 3 items" in (error.details() or "")
    trailers = dict(error.trailing_metadata() or ())
    assert (trailers[STREAM_BUDGET_KEY], trailers[STREAM_ITEMS_KEY]) == ("idle", "3")
    assert (trailers[STREAM_ENDING_KEY], trailers[STREAM_ERROR_KEY]) == ("incomplete", "StreamTimeout")
    assert served.generator.calls == 1  # committed: no retry after the first message


async def test_an_answer_whose_first_item_never_comes_is_retried_then_served_by_the_fallback() -> None:
    async with Served(ragguard.Guard(budgets())) as served:
        got, error = await collect_until_error(served.answer("slow_start"))
    assert (got, error) == ([b"from", b"the", b"passages"], None)
    assert served.generator.calls == 2  # the standard stage retries once before the first item


async def test_a_greedy_tenant_is_paced_and_another_is_not() -> None:
    clock = FakeClock()  # the server's pacing waits move it
    g = ragguard.Guard(budgets(greedy=TenantQuota(tokens_per_s=20, token_burst=4)), clock=clock)
    async with Served(g) as served:
        got, error = await collect_until_error(served.answer("long", tenant="polite"))
        assert (len(got), error, clock()) == (40, None, 0.0)
        got, error = await collect_until_error(served.answer("long", tenant="greedy"))
        assert (len(got), error) == (40, None)
    assert clock() == pytest.approx((40 - 4) / 20)


async def test_a_token_quota_refusal_ends_the_call_before_any_message() -> None:
    g = ragguard.Guard(budgets(acme=TenantQuota(token_quota=50)), clock=FakeClock())
    async with Served(g) as served:
        got, error = await collect_until_error(served.answer("long"))
        assert (len(got), error) == (40, None)
        got, error = await collect_until_error(served.answer("ok"))
    assert got == [] and isinstance(error, aio.AioRpcError)
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(error.trailing_metadata() or ())["retry-after"] == "36.000"
    assert token_accounts(g).reserved("acme") == 0


async def test_a_client_that_cancels_mid_answer_leaves_nothing_reserved() -> None:
    policy = Policy(
        stages={"generation": StagePolicy(generation=GenerationPolicy(idle_s=30.0, estimate_tokens=40))},
        tenants={"acme": TenantQuota(token_quota=1000, max_concurrency=1)},
    )
    g = ragguard.Guard(policy)
    accounts = token_accounts(g)
    async with Served(g) as served:
        call = served.answer("stall")
        # all three words read: the server has taken each from the model (and counted its token),
        # and the model is in its stall (a cancel after one read raced the server's next items)
        assert [await call.read() for _ in range(3)] == [b"w00", b"w01", b"w02"]
        for _ in range(500):
            if accounts.reserved("acme") == 40 and served.generator.calls == 1:
                break
            await asyncio.sleep(0.01)
        assert accounts.reserved("acme") == 40
        call.cancel()
        for _ in range(500):
            if accounts.open_streams("acme") == 0 and g.quotas.in_flight("acme") == 0:
                break
            await asyncio.sleep(0.01)
    assert (accounts.open_streams("acme"), accounts.reserved("acme")) == (0, 0)
    assert accounts.settled("acme") == 3
    assert g.quotas.in_flight("acme") == 0


async def test_the_ending_is_told_beside_the_handlers_own_trailing_metadata() -> None:
    g = ragguard.Guard(budgets())

    @g.guard("generation")
    async def model(question: str) -> AsyncIterator[str]:
        for word in ("a", "b", "c"):
            yield word

    async def answer(request: bytes, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
        context.set_trailing_metadata((("x-own", "kept"),))
        async for word in model("why"):
            yield word.encode()

    server = aio.server(interceptors=[GuardServerInterceptor(guard=g)])
    handler = grpc.method_handlers_generic_handler(
        SERVICE, {"Answer": grpc.unary_stream_rpc_method_handler(answer)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_stream(f"/{SERVICE}/Answer")(b"q", timeout=10)
            got = [message async for message in call]
            trailers = dict(await call.trailing_metadata() or ())
    finally:
        await server.stop(None)
    assert got == [b"a", b"b", b"c"]
    assert trailers["x-own"] == "kept"
    assert (trailers[STREAM_ENDING_KEY], trailers[STREAM_ITEMS_KEY]) == ("completed", "3")
