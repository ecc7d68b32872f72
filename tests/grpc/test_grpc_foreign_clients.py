"""What foreign clients found (issue 12, gRPC 1-6): a Node @grpc/grpc-js client and stock grpcio
clients against a real grpc.aio server with the ragguard interceptors, on loopback."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_helpers import SERVICE, Behaviors, call_kind, collect_until_error, method, serving
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc
from node_client import install_node_client, node_unary

import ragguard
from ragguard import CorruptPayload, FakeClock, Policy, QuotaExceeded, TenantQuota
from ragguard.buffers import SnappyCodec
from ragguard.grpc import (
    GuardServerInterceptor,
    RemoteQuotaExceeded,
    RemoteUnavailable,
    SnappyServerInterceptor,
    SnappyWire,
    client_interceptors,
    snappy_channel,
)
from ragguard.grpc._status import PUSHBACK_KEY, status_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def guard_with(**tenants: TenantQuota) -> ragguard.Guard:
    return ragguard.Guard(Policy(tenants=tenants), clock=FakeClock())


async def eventually(predicate: Callable[[], bool], within_s: float = 3.0) -> bool:
    """Poll ``predicate`` each 10 ms, at most ``within_s`` seconds (the server notices a cancel
    asynchronously); True as soon as it holds."""
    for _ in range(int(within_s / 0.01)):
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return predicate()


# --- 1. a server stream cancelled while its handler waits at a `yield` ----------------------


class Flood:
    """A server-streaming handler that yields 1 MB messages until flow control blocks it."""

    def __init__(self) -> None:
        self.sent = 0

    async def stream(self, request: bytes, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
        for _ in range(10_000):
            yield b"x" * 1_000_000
            self.sent += 1

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            "t.Flood", {"Stream": grpc.unary_stream_rpc_method_handler(self.stream)}
        )


@asynccontextmanager
async def flood_server(guard: ragguard.Guard, flood: Flood) -> AsyncIterator[str]:
    server = aio.server(interceptors=[GuardServerInterceptor(guard=guard)])
    server.add_generic_rpc_handlers((flood.handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_cancelled_stream_blocked_at_yield_frees_its_slot_at_once_and_logs_no_context_error() -> None:
    guard = guard_with(acme=TenantQuota(max_concurrency=1))
    flood = Flood()
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    gc.disable()  # the old code freed the slot only when the garbage collector ran
    try:
        async with flood_server(guard, flood) as target, aio.insecure_channel(target) as ch:
            call = ch.unary_stream("/t.Flood/Stream")(b"", metadata=(("x-tenant-id", "acme"),))
            assert len(await call.read()) == 1_000_000
            # the client stops reading: the handler is soon parked at a `yield` by flow control
            assert await eventually(lambda: flood.sent >= 1)
            await asyncio.sleep(0.2)
            sent_when_cancelled = flood.sent
            call.cancel()
            assert await eventually(lambda: guard.quotas.in_flight("acme") == 0), (
                "the cancelled stream still holds its slot"
            )
            assert flood.sent < sent_when_cancelled + 3  # the stream stopped, not ran to its end
    finally:
        gc.enable()
    gc.collect()
    for _ in range(20):  # let any finalizer-scheduled aclose() task run and be collected
        await asyncio.sleep(0.01)
    gc.collect()
    await asyncio.sleep(0.05)
    loop.set_exception_handler(previous)
    messages = [str(c.get("exception") or c.get("message")) for c in reported]
    assert not [m for m in messages if "different Context" in m], messages


# --- 2. health checking and reflection do not count against tenant quotas -------------------


@asynccontextmanager
async def health_server(interceptor: GuardServerInterceptor) -> AsyncIterator[str]:
    server = aio.server(interceptors=[interceptor])
    server.add_generic_rpc_handlers((Behaviors().handler(),))
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
    reflection.enable_server_reflection([SERVICE, reflection.SERVICE_NAME], server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_health_watch_and_reflection_streams_hold_no_tenant_slot() -> None:
    guard = guard_with(default=TenantQuota(max_concurrency=2))
    async with (
        health_server(GuardServerInterceptor(guard=guard)) as target,
        aio.insecure_channel(target) as ch,
    ):
        stub = health_pb2_grpc.HealthStub(ch)
        watches = [stub.Watch(health_pb2.HealthCheckRequest(service="")) for _ in range(2)]
        for watch in watches:
            first = await watch.read()
            assert first.status == health_pb2.HealthCheckResponse.SERVING
        queue: asyncio.Queue[reflection_pb2.ServerReflectionRequest | None] = asyncio.Queue()

        async def questions() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
            while (item := await queue.get()) is not None:
                yield item

        info = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(questions())
        await queue.put(reflection_pb2.ServerReflectionRequest(list_services=""))
        listed = await info.read()
        assert SERVICE in [s.name for s in listed.list_services_response.service]

        assert guard.quotas.in_flight("default") == 0
        # two calls without a tenant still fit while the watches and reflection stay open
        got = await asyncio.gather(*(method(ch, "Unary")(b"hi") for _ in range(2)))
        assert all(b'"tenant": "default"' in g for g in got)
        await queue.put(None)
        for watch in watches:
            watch.cancel()


async def test_exempt_services_are_configurable() -> None:
    guard = guard_with(default=TenantQuota(max_concurrency=2))
    interceptor = GuardServerInterceptor(guard=guard, exempt_services=())
    async with health_server(interceptor) as target, aio.insecure_channel(target) as ch:
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""))
        await watch.read()
        assert guard.quotas.in_flight("default") == 1  # counted, as asked
        watch.cancel()
        assert await eventually(lambda: guard.quotas.in_flight("default") == 0)


def test_bad_exempt_services_raise_config_error() -> None:
    with pytest.raises(ragguard.ConfigError, match="exempt_services"):
        GuardServerInterceptor(exempt_services="grpc.health.v1.Health")  # type: ignore[arg-type]
    with pytest.raises(ragguard.ConfigError, match="exempt_services"):
        GuardServerInterceptor(exempt_services=("/grpc.health.v1.Health/",))


# --- 3. pushback that stock gRPC retry policies read ----------------------------------------


class Arrivals(aio.ServerInterceptor):  # type: ignore[misc]
    """Records the monotonic time each call reaches the server (before the guard)."""

    def __init__(self) -> None:
        self.at: list[float] = []

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        self.at.append(time.monotonic())
        return await continuation(details)


def throttled_guard(wait_s: float) -> ragguard.Guard:
    # a frozen clock: after the first call, every call is refused with the same wait
    return guard_with(acme=TenantQuota(rate_per_s=1 / wait_s, burst=1))


@asynccontextmanager
async def throttled_server(arrivals: Arrivals, wait_s: float) -> AsyncIterator[str]:
    guard = throttled_guard(wait_s)
    async with serving(Behaviors(), [arrivals, GuardServerInterceptor(guard=guard)]) as target:
        async with aio.insecure_channel(target) as ch:
            await method(ch, "Unary")(b"first", metadata=(("x-tenant-id", "acme"),))
        arrivals.at.clear()
        yield target


async def test_refusal_sends_retry_after_and_grpc_retry_pushback_ms() -> None:
    async with throttled_server(Arrivals(), 0.363) as target, aio.insecure_channel(target) as ch:
        with pytest.raises(aio.AioRpcError) as info:
            await method(ch, "Unary")(b"", metadata=(("x-tenant-id", "acme"),))
    trailing = dict(info.value.trailing_metadata() or ())
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert trailing["retry-after"] == "0.363"
    assert trailing[PUSHBACK_KEY] == "363"


@pytest.fixture(scope="module")
def node_client() -> Path:
    return install_node_client()


async def test_grpc_js_retry_policy_waits_as_long_as_the_server_says(node_client: Path) -> None:
    wait_s = 0.363
    arrivals = Arrivals()
    retry = {
        "maxAttempts": 5,
        "initialBackoff": "0.01s",
        "maxBackoff": "0.05s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["RESOURCE_EXHAUSTED"],
    }
    async with throttled_server(arrivals, wait_s) as target:
        result = await node_unary(
            node_client,
            target,
            f"/{SERVICE}/Unary",
            b"again",
            metadata={"x-tenant-id": "acme"},
            service_config={"methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": retry}]},
        )
    assert result["code"] == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert result["trailers"]["retry-after"] == "0.363"
    assert len(arrivals.at) == 5  # the policy's attempts, all made
    gaps = [b - a for a, b in zip(arrivals.at, arrivals.at[1:], strict=False)]
    assert min(gaps) >= wait_s - 0.03, gaps  # each retry waited the pushback, not the 10-50 ms backoff


async def test_grpc_js_sees_a_deadline_spent_waiting_for_a_slot_as_deadline_exceeded(
    node_client: Path,
) -> None:
    behaviors = Behaviors()
    guard = guard_with(acme=TenantQuota(max_concurrency=1, max_wait_s=30))
    md = (("x-tenant-id", "acme"),)
    async with serving(behaviors, [GuardServerInterceptor(guard=guard)]) as target:
        async with aio.insecure_channel(target) as ch:
            holder = asyncio.ensure_future(method(ch, "Unary")(b"hold", metadata=md))
            await asyncio.wait_for(behaviors.entered.wait(), 5)
            result = await node_unary(
                node_client, target, f"/{SERVICE}/Unary", b"queued", metadata=dict(md), deadline_ms=300
            )
            behaviors.release.set()
            await holder
    assert result["code"] == grpc.StatusCode.DEADLINE_EXCEEDED.value[0], result


# --- 3b. the client side reads both trailers ------------------------------------------------


async def test_client_errors_carry_retry_after_from_either_trailer() -> None:
    async def refuse(request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
        if request.startswith(b"503"):
            code = grpc.StatusCode.UNAVAILABLE
        trailing = ((PUSHBACK_KEY, "1250"),) if request.endswith(b"pushback") else ()
        await context.abort(code, "no", trailing_metadata=trailing)
        return b""

    server = aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("t.R", {"M": grpc.unary_unary_rpc_method_handler(refuse)}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}", interceptors=client_interceptors()) as ch:
            call = ch.unary_unary("/t.R/M")
            errors = []
            for request in (b"429 pushback", b"503 pushback", b"503", b"429"):
                with pytest.raises(aio.AioRpcError) as info:
                    await call(request)
                errors.append(info.value)
    finally:
        await server.stop(None)
    quota, unavailable, bare_503, bare_429 = errors
    assert isinstance(quota, RemoteQuotaExceeded) and quota.retry_after_s == 1.25
    assert isinstance(unavailable, RemoteUnavailable) and unavailable.retry_after_s == 1.25
    assert bare_503.retry_after_s is None  # type: ignore[attr-defined]
    assert bare_429.retry_after_s == 0.0  # type: ignore[attr-defined]


async def test_breaker_open_pushback_reaches_the_client_as_retry_after_s() -> None:
    guard = guard_with()
    async with serving(Behaviors(), [GuardServerInterceptor(guard=guard)]) as target:
        async with aio.insecure_channel(target, interceptors=client_interceptors()) as ch:
            with pytest.raises(RemoteUnavailable) as info:
                await method(ch, "Unary")(b"breaker")
    assert info.value.retry_after_s == 1.25
    assert dict(info.value.trailing_metadata())[PUSHBACK_KEY] == "1250"


# --- 4. the deadline ends while waiting for a slot: DEADLINE_EXCEEDED -----------------------


def test_a_quota_wait_cut_by_the_deadline_maps_to_deadline_exceeded() -> None:
    status = status_for(QuotaExceeded("acme", 0.4, "deadline"))
    assert status is not None and status[0] == grpc.StatusCode.DEADLINE_EXCEEDED
    status = status_for(QuotaExceeded("acme", 0.4, "concurrency"))
    assert status is not None and status[0] == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_deadline_spent_waiting_for_a_slot_is_always_deadline_exceeded() -> None:
    behaviors = Behaviors()
    guard = guard_with(acme=TenantQuota(max_concurrency=1, max_wait_s=30))
    md = (("x-tenant-id", "acme"),)
    async with serving(behaviors, [GuardServerInterceptor(guard=guard)]) as target:
        async with aio.insecure_channel(target) as ch:
            unary = method(ch, "Unary")
            holder = asyncio.ensure_future(unary(b"hold", metadata=md))
            await asyncio.wait_for(behaviors.entered.wait(), 5)
            codes = []
            for _ in range(6):  # it was a race: 1 run in 6 answered RESOURCE_EXHAUSTED
                with pytest.raises(aio.AioRpcError) as info:
                    await unary(b"queued", metadata=md, timeout=0.15)
                codes.append(info.value.code())
            behaviors.release.set()
            await holder
            assert guard.quotas.in_flight("acme") == 0 and guard.quotas.waiting("acme") == 0
    assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED] * 6


# --- 5. a response the Snappy client refuses is an error, never a silent None --------------


def refusing_channel(target: str) -> Any:
    # this client accepts messages of at most 1000 bytes; the server sends 4000
    wire = SnappyWire(codec=SnappyCodec(max_message_bytes=1000))
    return snappy_channel(aio.insecure_channel(target), wire=wire)


@pytest.mark.parametrize("kind", ["Unary", "ClientStream"])
async def test_refused_unary_response_raises_corrupt_payload(kind: str) -> None:
    async with serving(Behaviors(), [SnappyServerInterceptor()]) as target:
        ch = refusing_channel(target)
        try:
            with pytest.raises(CorruptPayload, match="1000"):
                await call_kind(ch, kind, b"big:4000" if kind == "Unary" else b"x" * 3000)
            assert len((await call_kind(ch, "Unary", b"big:500"))[0]) == 500  # the channel still works
        finally:
            await ch.close()


@pytest.mark.parametrize("kind", ["StreamGen", "StreamWrite"])
async def test_refused_stream_message_raises_after_the_good_ones(kind: str) -> None:
    async with serving(Behaviors(), [SnappyServerInterceptor()]) as target:
        ch = refusing_channel(target)
        try:
            call = method(ch, kind)(b"hi")
            got, exc = await collect_until_error(call)
            assert len(got) == 2 and None not in got
            assert isinstance(exc, CorruptPayload)
            assert call.cancelled() or call.done()

            read_style = method(ch, kind)(b"hi")
            assert (await read_style.read()) is not None
            await read_style.read()
            with pytest.raises(CorruptPayload):
                await read_style.read()
        finally:
            await ch.close()


async def test_refused_bidi_message_raises() -> None:
    async with serving(Behaviors(), [SnappyServerInterceptor()]) as target:
        ch = refusing_channel(target)
        try:
            call = method(ch, "BidiWrite")()
            await call.write(b"y" * 3000)
            with pytest.raises(CorruptPayload):
                await call.read()
        finally:
            await ch.close()


# --- 6. a corrupt compressed request answers INVALID_ARGUMENT, as docs/grpc.md says ---------


@pytest.mark.parametrize("guarded", [False, True])
@pytest.mark.parametrize("kind", ["Unary", "StreamGen", "ClientStream", "BidiGen", "BidiWrite"])
async def test_corrupt_compressed_request_is_invalid_argument(kind: str, guarded: bool) -> None:
    behaviors = Behaviors()
    interceptors: list[aio.ServerInterceptor] = [SnappyServerInterceptor()]
    if guarded:
        interceptors.insert(0, GuardServerInterceptor(guard=guard_with()))
    corrupt = b"\x01\xff\xff\xff\xff\x0f"
    async with serving(behaviors, interceptors) as target, aio.insecure_channel(target) as raw:
        md = (("ragguard-encoding", "snappy"),)
        with pytest.raises(aio.AioRpcError) as info:
            await call_kind(raw, kind, corrupt, metadata=md)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "snappy" in (info.value.details() or "").lower() or "length" in (info.value.details() or "")
        assert b"tenant" in (await call_kind(raw, "Unary", b"\x00still serving", metadata=md))[0]
