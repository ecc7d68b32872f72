"""Messages of the demo's gRPC services: JSON objects, vectors as base64 float32 (little-endian).

Generic handlers with these serializers need no generated code, so nothing is compiled at install;
a server-streaming method is an async generator of such objects.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

from ragguard import InvalidInput
from ragguard.grpc import TENANT_KEY

__all__ = [
    "CHANNEL_OPTIONS",
    "CONTROL",
    "EMBEDDING",
    "GENERATOR",
    "RETRIEVAL",
    "VECTOR_STORE",
    "decode",
    "decode_vectors",
    "encode",
    "encode_vectors",
    "method",
    "stream",
    "tenant_of",
]

EMBEDDING = "ragguard.demo.Embedding"
VECTOR_STORE = "ragguard.demo.VectorStore"
RETRIEVAL = "ragguard.demo.Retrieval"
GENERATOR = "ragguard.demo.Generator"
CONTROL = "ragguard.demo.Control"

# Reconnect quickly after a stopped server comes back; the defaults back off up to 120 s.
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.enable_retries", 0),
]


def method(service: str, name: str) -> str:
    return f"/{service}/{name}"


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def decode(data: bytes) -> dict[str, Any]:
    try:
        message = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"malformed demo message: {exc}") from exc
    if not isinstance(message, dict):
        raise InvalidInput("malformed demo message: expected a JSON object")
    return message


def encode_vectors(vectors: npt.NDArray[np.float32]) -> dict[str, Any]:
    arr = np.ascontiguousarray(vectors, dtype="<f4")
    return {"shape": list(arr.shape), "data": base64.b64encode(arr.tobytes()).decode()}


def decode_vectors(obj: Any) -> npt.NDArray[np.float32]:
    try:
        shape = tuple(int(n) for n in obj["shape"])
        raw = base64.b64decode(obj["data"], validate=True)
        return np.frombuffer(raw, dtype="<f4").reshape(shape).astype(np.float32)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput(f"malformed vector payload: {exc}") from exc


def unary(channel: grpc.aio.Channel, service: str, name: str) -> grpc.aio.UnaryUnaryMultiCallable:
    """A unary-unary stub taking and returning dicts."""
    return channel.unary_unary(method(service, name), request_serializer=encode, response_deserializer=decode)


def tenant_of(context: grpc.aio.ServicerContext) -> str:
    """The caller's tenant: its ``x-tenant-id`` metadata (``"default"`` without one)."""
    for key, value in context.invocation_metadata() or ():
        if key == TENANT_KEY and isinstance(value, str):
            return value
    return "default"


def stream(channel: grpc.aio.Channel, service: str, name: str) -> grpc.aio.UnaryStreamMultiCallable:
    """A unary-stream stub taking a dict and streaming dicts."""
    return channel.unary_stream(
        method(service, name), request_serializer=encode, response_deserializer=decode
    )


Handler = Callable[[dict[str, Any], grpc.aio.ServicerContext], Awaitable[dict[str, Any]]]
StreamHandler = Callable[[dict[str, Any], grpc.aio.ServicerContext], AsyncIterator[dict[str, Any]]]


def handler(
    service: str, methods: Mapping[str, Handler], streams: Mapping[str, StreamHandler] | None = None
) -> grpc.GenericRpcHandler:
    """A generic handler for ``service``: ``methods`` are ``async (dict, context) -> dict``,
    ``streams`` async generators ``(dict, context) -> dicts`` (server streaming).

    Requests are decoded inside the handler, so a malformed one ends as INVALID_ARGUMENT, as does
    an :class:`~ragguard.InvalidInput` raised by the method (a stream's, before or between its
    messages).
    """
    table = {
        name: grpc.unary_unary_rpc_method_handler(_decoding(fn), response_serializer=encode)
        for name, fn in methods.items()
    }
    for name, gen in (streams or {}).items():
        table[name] = grpc.unary_stream_rpc_method_handler(_decoding_stream(gen), response_serializer=encode)
    return grpc.method_handlers_generic_handler(service, table)


def _decoding(fn: Handler) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[dict[str, Any]]]:
    async def run(raw: bytes, context: grpc.aio.ServicerContext) -> dict[str, Any]:
        try:
            request = decode(raw)
            return await fn(request, context)
        except InvalidInput as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # unreachable: abort raises

    return run


def _decoding_stream(
    gen: StreamHandler,
) -> Callable[[bytes, grpc.aio.ServicerContext], AsyncIterator[dict[str, Any]]]:
    # An async generator itself, so that server interceptors see a streaming handler.
    async def run(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[dict[str, Any]]:
        try:
            async for message in gen(decode(raw), context):
                yield message
        except InvalidInput as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # unreachable: abort raises

    return run
