"""A real grpc.aio server on 127.0.0.1 with bytes-in/bytes-out generic handlers (no protoc)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import grpc
from grpc import aio

import ragguard
from ragguard import BreakerOpen, DeadlineExceeded, InvalidInput, NoDeploymentAvailable, QuotaExceeded

SERVICE = "ragguard.test.Svc"

ERRORS: dict[bytes, Callable[[], Exception]] = {
    b"quota": lambda: QuotaExceeded("acme", 2.5, "rate"),
    b"breaker": lambda: BreakerOpen("vector_store", 1.25),
    b"no_deployment": lambda: NoDeploymentAvailable("chat", 7.5, out={"a": "open", "b": "limits"}),
    b"deadline": lambda: DeadlineExceeded("embed", 0.5),
    b"invalid": lambda: InvalidInput("bad query"),
    b"runtime": lambda: RuntimeError("plain bug"),
}


def snapshot(extra: bytes = b"") -> bytes:
    """What the handler saw of the ragguard context, as JSON bytes."""
    return json.dumps(
        {"tenant": ragguard.current_tenant(), "remaining": ragguard.remaining(), "extra": extra.decode()}
    ).encode()


async def _maybe_fail(request: bytes, context: aio.ServicerContext[Any, Any]) -> None:
    if request.startswith(b"abort"):
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "handler says no")
    if request.startswith(b"sleep:"):
        await asyncio.sleep(float(request[6:]))
    factory = ERRORS.get(request)
    if factory is not None:
        raise factory()


class Behaviors:
    """Handlers of all four kinds; streaming ones in both styles. Request bytes steer them."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0

    async def _hold(self) -> None:
        """Say the call is in, and hold it until released (at most 10 s)."""
        self.entered.set()
        await asyncio.wait_for(self.release.wait(), 10)

    async def unary(self, request: bytes, context: aio.ServicerContext[Any, Any]) -> bytes:
        self.calls += 1
        if request == b"hold":
            await self._hold()
        await _maybe_fail(request, context)
        if request.startswith(b"big:"):
            return b"x" * int(request[4:])
        return snapshot(request)

    async def stream_gen(
        self, request: bytes, context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        self.calls += 1
        for i in range(2):
            yield snapshot(b"%d" % i)
        if request == b"hold":
            await self._hold()
        await _maybe_fail(request, context)
        yield b"x" * 4000  # big enough to compress
        yield b"tail"

    async def stream_write(self, request: bytes, context: aio.ServicerContext[Any, Any]) -> None:
        self.calls += 1
        for i in range(2):
            await context.write(snapshot(b"%d" % i))
        await _maybe_fail(request, context)
        await context.write(b"x" * 4000)
        await context.write(b"tail")

    async def client_stream(
        self, requests: AsyncIterator[bytes], context: aio.ServicerContext[Any, Any]
    ) -> bytes:
        self.calls += 1
        got = [r async for r in requests]
        if got and got[-1] == b"hold":
            await self._hold()
        await _maybe_fail(got[-1] if got else b"", context)
        return b"|".join(got) + b"#" + snapshot()

    async def bidi_gen(
        self, requests: AsyncIterator[bytes], context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        self.calls += 1
        n = 0
        async for request in requests:
            n += 1
            if request == b"hold":
                await self._hold()
            await _maybe_fail(request, context)
            yield request + b"!" + snapshot()

    async def bidi_write(
        self, requests: AsyncIterator[bytes], context: aio.ServicerContext[Any, Any]
    ) -> None:
        self.calls += 1
        async for request in requests:
            await _maybe_fail(request, context)
            await context.write(request + b"!" + snapshot())

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Unary": grpc.unary_unary_rpc_method_handler(self.unary),
                "StreamGen": grpc.unary_stream_rpc_method_handler(self.stream_gen),
                "StreamWrite": grpc.unary_stream_rpc_method_handler(self.stream_write),
                "ClientStream": grpc.stream_unary_rpc_method_handler(self.client_stream),
                "BidiGen": grpc.stream_stream_rpc_method_handler(self.bidi_gen),
                "BidiWrite": grpc.stream_stream_rpc_method_handler(self.bidi_write),
            },
        )


@asynccontextmanager
async def serving(
    behaviors: Behaviors, interceptors: Sequence[aio.ServerInterceptor] = (), **options: Any
) -> AsyncIterator[str]:
    """Run a server for ``behaviors`` on a free loopback port (``options``: grpc.aio.server's, e.g.
    ``maximum_concurrent_rpcs``); yields its target."""
    async with _serving(behaviors.handler(), interceptors, **options) as target:
        yield target


@asynccontextmanager
async def serving_methods(
    service: str, methods: dict[str, Any], interceptors: Sequence[aio.ServerInterceptor] = ()
) -> AsyncIterator[str]:
    """Run a server of ``service`` whose ``methods`` (name -> ``grpc.*_rpc_method_handler(...)``)
    are given, on a free loopback port; yields its target."""
    async with _serving(grpc.method_handlers_generic_handler(service, methods), interceptors) as target:
        yield target


@asynccontextmanager
async def _serving(
    handler: Any, interceptors: Sequence[aio.ServerInterceptor], **options: Any
) -> AsyncIterator[str]:
    server = aio.server(interceptors=list(interceptors), **options)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def method(channel: Any, name: str) -> Any:
    kind = {
        "Unary": "unary_unary",
        "StreamGen": "unary_stream",
        "StreamWrite": "unary_stream",
        "ClientStream": "stream_unary",
        "BidiGen": "stream_stream",
        "BidiWrite": "stream_stream",
    }[name]
    return getattr(channel, kind)(f"/{SERVICE}/{name}")


async def requests_of(*items: bytes) -> AsyncIterator[bytes]:
    for item in items:
        yield item


async def call_kind(channel: Any, name: str, request: bytes, **kw: Any) -> list[bytes]:
    """Call method ``name`` with ``request`` and return every response message, in order."""
    stub = method(channel, name)
    if name == "Unary":
        return [await stub(request, **kw)]
    if name == "ClientStream":
        return [await stub(requests_of(b"a", request), **kw)]
    if name.startswith("Bidi"):
        return [r async for r in stub(requests_of(request), **kw)]
    return [r async for r in stub(request, **kw)]


async def collect_until_error(call: Any) -> tuple[list[bytes], BaseException | None]:
    got: list[bytes] = []
    try:
        async for message in call:
            got.append(message)
    except Exception as exc:
        return got, exc
    return got, None
