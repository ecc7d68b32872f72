"""Messages of the demo's gRPC services: JSON objects, vectors as base64 float32 (little-endian).

Generic handlers with these serializers need no generated code, so nothing is compiled at install.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

from ragguard import InvalidInput

__all__ = [
    "CHANNEL_OPTIONS",
    "CONTROL",
    "EMBEDDING",
    "RETRIEVAL",
    "VECTOR_STORE",
    "decode",
    "decode_vectors",
    "encode",
    "encode_vectors",
    "method",
]

EMBEDDING = "ragguard.demo.Embedding"
VECTOR_STORE = "ragguard.demo.VectorStore"
RETRIEVAL = "ragguard.demo.Retrieval"
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


Handler = Callable[[dict[str, Any], grpc.aio.ServicerContext], Awaitable[dict[str, Any]]]


def handler(service: str, methods: dict[str, Handler]) -> grpc.GenericRpcHandler:
    """A generic handler for ``service`` whose ``methods`` are ``async (dict, context) -> dict``.

    Requests are decoded inside the handler, so a malformed one ends as INVALID_ARGUMENT, as does
    an :class:`~ragguard.InvalidInput` raised by the method.
    """
    return grpc.method_handlers_generic_handler(
        service,
        {
            name: grpc.unary_unary_rpc_method_handler(_decoding(fn), response_serializer=encode)
            for name, fn in methods.items()
        },
    )


def _decoding(fn: Handler) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[dict[str, Any]]]:
    async def run(raw: bytes, context: grpc.aio.ServicerContext) -> dict[str, Any]:
        try:
            request = decode(raw)
            return await fn(request, context)
        except InvalidInput as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # unreachable: abort raises

    return run
