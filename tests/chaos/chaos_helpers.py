"""Helpers for the chaos tests: a real grpc.aio echo server and a fast-reconnecting channel."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc

ECHO_METHOD = "/ragguard.test.Echo/Echo"


def _identity(b: bytes) -> bytes:
    return b


@contextlib.asynccontextmanager
async def grpc_echo_server() -> AsyncIterator[int]:
    """A real grpc.aio server on 127.0.0.1 whose one unary method echoes its bytes; yields the port."""

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler(
        "ragguard.test.Echo",
        {"Echo": grpc.unary_unary_rpc_method_handler(
            echo, request_deserializer=_identity, response_serializer=_identity)},
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(grace=None)


def grpc_channel(target: str) -> grpc.aio.Channel:
    """A channel that reconnects within ~100 ms (the default backoff starts at 1 s)."""
    return grpc.aio.insecure_channel(
        target,
        options=[
            ("grpc.initial_reconnect_backoff_ms", 50),
            ("grpc.min_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 100),
            ("grpc.enable_retries", 0),
        ],
    )


def echo_stub(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable:
    return channel.unary_unary(ECHO_METHOD, request_serializer=_identity, response_deserializer=_identity)
