"""GuardServerInterceptor against a real grpc.aio server and a plain client on loopback."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from grpc import aio
from grpc_helpers import Behaviors, call_kind, collect_until_error, method, requests_of, serving

import ragguard
from ragguard import ConfigError, FakeClock, Policy, TenantQuota
from ragguard.grpc import GuardServerInterceptor

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

KINDS = ["Unary", "StreamGen", "StreamWrite", "ClientStream", "BidiGen", "BidiWrite"]


def guard_with(**tenants: TenantQuota) -> ragguard.Guard:
    return ragguard.Guard(Policy(tenants=tenants), clock=FakeClock())


def seen(message: bytes) -> dict[str, object]:
    return json.loads(message[message.index(b"{") :])


@pytest.mark.parametrize("kind", KINDS)
async def test_tenant_and_deadline_reach_the_handler_for_every_kind(kind: str) -> None:
    interceptor = GuardServerInterceptor(guard=guard_with())
    async with serving(Behaviors(), [interceptor]) as target, aio.insecure_channel(target) as ch:
        got = await call_kind(ch, kind, b"hi", metadata=(("x-tenant-id", "acme"),), timeout=5)
        view = seen(got[0])
        assert view["tenant"] == "acme"
        assert isinstance(view["remaining"], float) and 3.0 < view["remaining"] <= 5.1

        got = await call_kind(ch, kind, b"hi")
        view = seen(got[0])
        assert view["tenant"] == "default"
        assert view["remaining"] is None  # no client deadline: no ragguard deadline either


async def test_grpc_aio_reports_no_deadline_as_none() -> None:
    seen_remaining: list[object] = []

    async def handler(request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        seen_remaining.append(context.time_remaining())
        return b""

    server = aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("t.S", {"M": grpc.unary_unary_rpc_method_handler(handler)}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            await ch.unary_unary("/t.S/M")(b"")
            await ch.unary_unary("/t.S/M")(b"", timeout=3)
    finally:
        await server.stop(None)
    assert seen_remaining[0] is None
    assert isinstance(seen_remaining[1], float) and 0 < seen_remaining[1] <= 3.1  # gRPC clock rounding


async def test_custom_tenant_key() -> None:
    interceptor = GuardServerInterceptor(guard=guard_with(), tenant_key="tenant")
    async with serving(Behaviors(), [interceptor]) as target, aio.insecure_channel(target) as ch:
        reply = await method(ch, "Unary")(b"", metadata=(("tenant", "globex"), ("x-tenant-id", "acme")))
    assert seen(reply)["tenant"] == "globex"


@pytest.mark.parametrize("bad", ["has space", "-leading-dash", "x" * 65, "semi;colon"])
async def test_malformed_tenant_is_invalid_argument_and_handler_does_not_run(bad: str) -> None:
    behaviors = Behaviors()
    interceptor = GuardServerInterceptor(guard=guard_with())
    async with serving(behaviors, [interceptor]) as target, aio.insecure_channel(target) as ch:
        with pytest.raises(aio.AioRpcError) as info:
            await method(ch, "Unary")(b"", metadata=(("x-tenant-id", bad),))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tenant id" in (info.value.details() or "")
    assert behaviors.calls == 0


@pytest.mark.parametrize(
    ("request_bytes", "code"),
    [
        (b"quota", grpc.StatusCode.RESOURCE_EXHAUSTED),
        (b"breaker", grpc.StatusCode.UNAVAILABLE),
        (b"no_deployment", grpc.StatusCode.UNAVAILABLE),
        (b"deadline", grpc.StatusCode.DEADLINE_EXCEEDED),
        (b"invalid", grpc.StatusCode.INVALID_ARGUMENT),
        (b"runtime", grpc.StatusCode.UNKNOWN),
        (b"abort", grpc.StatusCode.PERMISSION_DENIED),
    ],
)
@pytest.mark.parametrize("kind", ["Unary", "ClientStream"])
async def test_handler_errors_map_to_statuses(kind: str, request_bytes: bytes, code: grpc.StatusCode) -> None:
    interceptor = GuardServerInterceptor(guard=guard_with())
    async with serving(Behaviors(), [interceptor]) as target, aio.insecure_channel(target) as ch:
        with pytest.raises(aio.AioRpcError) as info:
            await call_kind(ch, kind, request_bytes)
    err = info.value
    assert err.code() == code
    trailing = dict(err.trailing_metadata() or ())
    if request_bytes == b"quota":
        assert trailing["retry-after"] == "2.500"
    elif request_bytes == b"breaker":
        assert trailing["retry-after"] == "1.250"
    elif request_bytes == b"no_deployment":  # every deployment of a model group out
        assert trailing["retry-after"] == "7.500"
    else:
        assert "retry-after" not in trailing
    if request_bytes == b"abort":
        assert err.details() == "handler says no"


@pytest.mark.parametrize("kind", ["StreamGen", "StreamWrite"])
@pytest.mark.parametrize(
    ("request_bytes", "code"),
    [
        (b"breaker", grpc.StatusCode.UNAVAILABLE),
        (b"quota", grpc.StatusCode.RESOURCE_EXHAUSTED),
        (b"abort", grpc.StatusCode.PERMISSION_DENIED),
    ],
)
async def test_error_after_two_streamed_messages(
    kind: str, request_bytes: bytes, code: grpc.StatusCode
) -> None:
    interceptor = GuardServerInterceptor(guard=guard_with())
    async with serving(Behaviors(), [interceptor]) as target, aio.insecure_channel(target) as ch:
        call = method(ch, kind)(request_bytes, metadata=(("x-tenant-id", "acme"),))
        got, exc = await collect_until_error(call)
        assert [seen(m)["extra"] for m in got] == ["0", "1"]
        assert isinstance(exc, aio.AioRpcError)
        assert exc.code() == code
        assert await call.code() == code


@pytest.mark.parametrize("kind", ["BidiGen", "BidiWrite"])
async def test_bidi_error_after_two_messages(kind: str) -> None:
    interceptor = GuardServerInterceptor(guard=guard_with())
    async with serving(Behaviors(), [interceptor]) as target, aio.insecure_channel(target) as ch:
        call = method(ch, kind)(requests_of(b"one", b"two", b"breaker", b"never"))
        got, exc = await collect_until_error(call)
    assert [m.split(b"!")[0] for m in got] == [b"one", b"two"]
    assert isinstance(exc, aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE


async def test_over_concurrency_quota_is_resource_exhausted_with_retry_after() -> None:
    behaviors = Behaviors()
    interceptor = GuardServerInterceptor(guard=guard_with(acme=TenantQuota(max_concurrency=1)))
    md = (("x-tenant-id", "acme"),)
    async with serving(behaviors, [interceptor]) as target, aio.insecure_channel(target) as ch:
        unary = method(ch, "Unary")
        first = asyncio.ensure_future(unary(b"hold", metadata=md))
        await asyncio.wait_for(behaviors.entered.wait(), 5)
        with pytest.raises(aio.AioRpcError) as info:
            await unary(b"second", metadata=md)
        other = await unary(b"other tenant", metadata=(("x-tenant-id", "globex"),))
        behaviors.release.set()
        await first
        after = await unary(b"after release", metadata=md)  # the slot came back
    err = info.value
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    retry_after = dict(err.trailing_metadata() or ())["retry-after"]
    assert float(retry_after) >= 0.0
    assert seen(other)["tenant"] == "globex"
    assert seen(after)["tenant"] == "acme"
    assert behaviors.calls == 3


async def test_over_rate_quota_reports_the_rate_wait() -> None:
    clock = FakeClock()
    guard = ragguard.Guard(Policy(tenants={"acme": TenantQuota(rate_per_s=2.0, burst=1)}), clock=clock)
    interceptor = GuardServerInterceptor(guard=guard)
    md = (("x-tenant-id", "acme"),)
    async with serving(Behaviors(), [interceptor]) as target, aio.insecure_channel(target) as ch:
        unary = method(ch, "Unary")
        await unary(b"", metadata=md)
        with pytest.raises(aio.AioRpcError) as info:
            await unary(b"", metadata=md)
        clock.advance(0.5)
        await unary(b"", metadata=md)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert float(dict(info.value.trailing_metadata())["retry-after"]) == pytest.approx(0.5, abs=1e-3)


async def test_streaming_error_and_client_cancel_release_the_quota_slot() -> None:
    behaviors = Behaviors()
    interceptor = GuardServerInterceptor(guard=guard_with(acme=TenantQuota(max_concurrency=1)))
    md = (("x-tenant-id", "acme"),)
    async with serving(behaviors, [interceptor]) as target, aio.insecure_channel(target) as ch:
        _, exc = await collect_until_error(method(ch, "StreamGen")(b"breaker", metadata=md))
        assert isinstance(exc, aio.AioRpcError)
        assert exc.code() == grpc.StatusCode.UNAVAILABLE

        call = method(ch, "StreamGen")(b"hold", metadata=md)
        await call.read()
        await asyncio.wait_for(behaviors.entered.wait(), 5)
        call.cancel()
        for _ in range(100):  # the server notices the cancellation asynchronously
            try:
                reply = await method(ch, "Unary")(b"ok", metadata=md)
                break
            except aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                await asyncio.sleep(0.02)
        else:
            pytest.fail("the cancelled stream never released its quota slot")
    assert seen(reply)["tenant"] == "acme"


async def test_default_registry_is_used_without_a_guard() -> None:
    async with serving(Behaviors(), [GuardServerInterceptor()]) as target, aio.insecure_channel(target) as ch:
        reply = await method(ch, "Unary")(b"", metadata=(("x-tenant-id", "initech"),))
    assert seen(reply)["tenant"] == "initech"


def test_sync_handlers_pass_through() -> None:
    interceptor = GuardServerInterceptor()

    def sync_behavior(request: bytes, context: object) -> bytes:
        return request

    assert interceptor._wrap(sync_behavior, None) is sync_behavior


@pytest.mark.parametrize("key", ["X-Tenant", "tenant-bin", "", "a b", 5])
def test_bad_tenant_key_raises_config_error(key: object) -> None:
    with pytest.raises(ConfigError):
        GuardServerInterceptor(tenant_key=key)  # type: ignore[arg-type]
