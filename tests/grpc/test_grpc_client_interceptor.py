"""GuardClientInterceptor: context propagation and classified errors, against real servers."""

from __future__ import annotations

import json
import socket

import grpc
import pytest
from grpc import aio
from grpc_helpers import Behaviors, call_kind, collect_until_error, method, serving

import ragguard
from ragguard import FakeClock, Policy, QuotaExceeded
from ragguard.breakers import (
    BreakerState,
    VectorStoreUnavailableBreaker,
    is_connection_error,
    is_timeout,
)
from ragguard.grpc import (
    GuardServerInterceptor,
    RemoteDeadlineExceeded,
    RemoteQuotaExceeded,
    RemoteUnavailable,
    client_interceptors,
)
from ragguard.grpc._errors import RemoteCallError
from ragguard.outcomes import Kind, classify

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

KINDS = ["Unary", "StreamGen", "StreamWrite", "ClientStream", "BidiGen", "BidiWrite"]


def seen(message: bytes) -> dict[str, object]:
    return json.loads(message[message.index(b"{") :])


def client_guard() -> ragguard.Guard:
    return ragguard.Guard(Policy(), clock=FakeClock())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def guarded_channel(target: str) -> aio.Channel:
    return aio.insecure_channel(target, interceptors=client_interceptors())


@pytest.mark.parametrize("kind", KINDS)
async def test_tenant_and_deadline_propagate_on_every_kind(kind: str) -> None:
    server = GuardServerInterceptor(guard=ragguard.Guard(Policy(), clock=FakeClock()))
    async with serving(Behaviors(), [server]) as target, guarded_channel(target) as ch:
        async with client_guard().tenant("acme"):
            with ragguard.deadline(2.0):
                got = await call_kind(ch, kind, b"hi")
        view = seen(got[0])
        assert view["tenant"] == "acme"
        assert isinstance(view["remaining"], float) and 1.0 < view["remaining"] <= 2.05

        got = await call_kind(ch, kind, b"hi")  # outside any tenant or deadline
        assert seen(got[0]) == {"tenant": "default", "remaining": None, "extra": seen(got[0])["extra"]}


async def test_shorter_caller_timeout_and_explicit_tenant_win() -> None:
    async with serving(Behaviors(), [GuardServerInterceptor()]) as target, guarded_channel(target) as ch:
        unary = method(ch, "Unary")
        async with client_guard().tenant("acme"):
            with ragguard.deadline(10.0):
                short = seen(await unary(b"", timeout=0.5))
                explicit = seen(await unary(b"", metadata=(("x-tenant-id", "globex"),)))
            with ragguard.deadline(0.7):
                longer = seen(await unary(b"", timeout=30))
    assert short["tenant"] == "acme" and 0 < short["remaining"] <= 0.55  # type: ignore[operator]
    assert explicit["tenant"] == "globex" and 5 < explicit["remaining"] <= 10.05  # type: ignore[operator]
    assert 0 < longer["remaining"] <= 0.75  # type: ignore[operator]


@pytest.mark.parametrize("kind", KINDS)
async def test_unavailable_becomes_a_connection_error(kind: str) -> None:
    async with guarded_channel(f"127.0.0.1:{free_port()}") as ch:
        with pytest.raises(RemoteUnavailable) as info:
            await call_kind(ch, kind, b"hi", timeout=5)
    err = info.value
    assert isinstance(err, ConnectionError) and isinstance(err, aio.AioRpcError)
    assert is_connection_error(err) and not is_timeout(err)
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert isinstance(err.__cause__, aio.AioRpcError) and not isinstance(err.__cause__, RemoteCallError)
    assert err.details() == err.__cause__.details()


@pytest.mark.parametrize("kind", ["Unary", "StreamGen", "ClientStream", "BidiGen"])
async def test_deadline_exceeded_becomes_a_timeout(kind: str) -> None:
    async with serving(Behaviors()) as target, guarded_channel(target) as ch:
        with pytest.raises(RemoteDeadlineExceeded) as info:
            await call_kind(ch, kind, b"sleep:3", timeout=0.2)  # the server's slowness
    err = info.value
    assert isinstance(err, TimeoutError) and is_timeout(err) and not is_connection_error(err)
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert isinstance(err.__cause__, aio.AioRpcError)


@pytest.mark.parametrize("kind", ["Unary", "StreamWrite", "ClientStream", "BidiWrite"])
async def test_resource_exhausted_becomes_a_rejection_with_retry_after(kind: str) -> None:
    async with serving(Behaviors(), [GuardServerInterceptor()]) as target, guarded_channel(target) as ch:
        async with client_guard().tenant("acme"):
            with pytest.raises(RemoteQuotaExceeded) as info:
                await call_kind(ch, kind, b"quota")
    err = info.value
    # the dependency's rejection, not this service's own quota refusal
    assert not isinstance(err, QuotaExceeded) and not isinstance(err, ragguard.RagguardError)
    assert (err.tenant, err.retry_after_s, err.reason) == ("acme", 2.5, "remote")
    assert classify(err).kind is Kind.REJECTION and classify(err).retry_after_s == 2.5
    assert not is_connection_error(err) and not is_timeout(err)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_other_statuses_pass_unchanged() -> None:
    async with serving(Behaviors(), [GuardServerInterceptor()]) as target, guarded_channel(target) as ch:
        with pytest.raises(aio.AioRpcError) as info:
            await method(ch, "Unary")(b"invalid")
    assert type(info.value) is aio.AioRpcError
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_stream_error_after_two_messages_is_classified() -> None:
    async with serving(Behaviors(), [GuardServerInterceptor()]) as target, guarded_channel(target) as ch:
        call = method(ch, "StreamGen")(b"breaker")
        got, exc = await collect_until_error(call)
        assert len(got) == 2
        assert isinstance(exc, RemoteUnavailable)
        assert await call.code() == grpc.StatusCode.UNAVAILABLE


async def test_client_streaming_with_write_and_read_styles() -> None:
    async with serving(Behaviors(), [GuardServerInterceptor()]) as target, guarded_channel(target) as ch:
        call = method(ch, "ClientStream")()
        await call.write(b"a")
        await call.write(b"b")
        await call.done_writing()
        reply = await call
        assert reply.startswith(b"a|b#")
        assert await call.code() == grpc.StatusCode.OK

        bidi = method(ch, "BidiWrite")()
        await bidi.write(b"ping")
        first = await bidi.read()
        await bidi.done_writing()
        assert first.startswith(b"ping!")
        assert await bidi.read() is aio.EOF

        failing = method(ch, "ClientStream")()
        await failing.write(b"breaker")
        await failing.done_writing()
        with pytest.raises(RemoteUnavailable):
            await failing


async def test_a_typed_breaker_opens_on_remote_unavailable_with_no_extra_code() -> None:
    clock = FakeClock()
    breaker = VectorStoreUnavailableBreaker(minimum_calls=2, window_size=2, clock=clock)
    async with guarded_channel(f"127.0.0.1:{free_port()}") as ch:
        search = method(ch, "Unary")
        for _ in range(2):
            with pytest.raises(RemoteUnavailable):
                await breaker.call(search, b"query", timeout=5)
    assert breaker.state == BreakerState.OPEN


async def test_remote_quota_exceeded_maps_to_unavailable_with_the_wait_upstream() -> None:
    # downstream throttles; the upstream service forwards the pushback to its own caller as
    # UNAVAILABLE (its caller is not over *its* quota: a dependency of the service is)
    async with serving(Behaviors(), [GuardServerInterceptor()]) as down, guarded_channel(down) as down_ch:

        async def upstream(request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
            return await method(down_ch, "Unary")(request)  # type: ignore[no-any-return]

        server = aio.server(interceptors=[GuardServerInterceptor()])
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "t.Up", {"Q": grpc.unary_unary_rpc_method_handler(upstream)}
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with aio.insecure_channel(f"127.0.0.1:{port}") as up_ch:
                with pytest.raises(aio.AioRpcError) as info:
                    await up_ch.unary_unary("/t.Up/Q")(b"quota", metadata=(("x-tenant-id", "acme"),))
        finally:
            await server.stop(None)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert dict(info.value.trailing_metadata())["retry-after"] == "2.500"
    assert "127.0.0.1" not in info.value.details()


@pytest.mark.parametrize("key", ["X-Tenant", "tenant-bin", "", None])
def test_bad_tenant_key_raises_config_error(key: object) -> None:
    with pytest.raises(ragguard.ConfigError):
        client_interceptors(tenant_key=key)  # type: ignore[arg-type]


def test_one_interceptor_per_rpc_kind() -> None:
    kinds = (
        aio.UnaryUnaryClientInterceptor,
        aio.UnaryStreamClientInterceptor,
        aio.StreamUnaryClientInterceptor,
        aio.StreamStreamClientInterceptor,
    )
    found = client_interceptors()
    assert [sum(isinstance(i, k) for i in found) for k in kinds] == [1, 1, 1, 1]


@pytest.mark.parametrize("kind", ["Unary", "StreamGen"])
async def test_the_requests_own_deadline_running_out_at_the_server_is_the_deadline(kind: str) -> None:
    """A call whose timeout was the request's propagated deadline ran out of the request's time,
    not of the server's: classified as the deadline (no breaker counts it), whichever of the
    server's DEADLINE_EXCEEDED and ragguard's own timer came first."""
    async with serving(Behaviors()) as target, guarded_channel(target) as ch:
        with ragguard.deadline(0.2), pytest.raises(RemoteDeadlineExceeded) as spent:
            await call_kind(ch, kind, b"sleep:3")
        with ragguard.deadline(5.0), pytest.raises(RemoteDeadlineExceeded) as slow:
            await call_kind(ch, kind, b"sleep:3", timeout=0.2)  # the caller's own, shorter timeout
        with pytest.raises(RemoteDeadlineExceeded) as plain:
            await call_kind(ch, kind, b"sleep:3", timeout=0.2)  # no ragguard deadline at all

        g = ragguard.Guard(Policy.model_validate({"stages": {"store": {"breaker": {"minimum_calls": 1}}}}))

        @g.guard("store")
        async def search() -> object:
            with ragguard.deadline(0.2):  # the request's deadline, as the call sees it
                return await call_kind(ch, kind, b"sleep:3")

        with pytest.raises(RemoteDeadlineExceeded):
            await search()
    assert spent.value.request_deadline and classify(spent.value).kind is Kind.DEADLINE
    assert not slow.value.request_deadline and classify(slow.value).kind is Kind.TIMEOUT
    assert not plain.value.request_deadline and classify(plain.value).kind is Kind.TIMEOUT
    assert g.breaker("store").state is BreakerState.CLOSED, "the request's time ran out, not the store's"
