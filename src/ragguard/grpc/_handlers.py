"""Rebuilding a gRPC method handler with other behaviors or (de)serializers, for one call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

__all__ = ["Behavior", "first_value", "rebuild"]

Behavior = Callable[..., Any]
_KEEP: Any = object()


def rebuild(
    handler: grpc.RpcMethodHandler,
    *,
    wrap: Callable[[Behavior, bool, bool], Behavior] | None = None,
    request_deserializer: Any = _KEEP,
    response_serializer: Any = _KEEP,
) -> grpc.RpcMethodHandler:
    """A copy of ``handler``; ``wrap(behavior, request_streaming, response_streaming)`` replaces
    its behavior, and the (de)serializers are replaced when given (None means identity)."""
    req_stream, resp_stream = handler.request_streaming, handler.response_streaming
    if req_stream and resp_stream:
        behavior, make = handler.stream_stream, grpc.stream_stream_rpc_method_handler
    elif req_stream:
        behavior, make = handler.stream_unary, grpc.stream_unary_rpc_method_handler
    elif resp_stream:
        behavior, make = handler.unary_stream, grpc.unary_stream_rpc_method_handler
    else:
        behavior, make = handler.unary_unary, grpc.unary_unary_rpc_method_handler
    if wrap is not None:
        behavior = wrap(behavior, req_stream, resp_stream)
    return make(
        behavior,
        request_deserializer=(
            handler.request_deserializer if request_deserializer is _KEEP else request_deserializer
        ),
        response_serializer=(
            handler.response_serializer if response_serializer is _KEEP else response_serializer
        ),
    )


def first_value(metadata: Any, key: str) -> str | bytes | None:
    """The first value of ``key`` in gRPC metadata (a sequence of (key, value) pairs), or None."""
    if not metadata:
        return None
    for item in metadata:
        if item[0] == key:
            value: str | bytes = item[1]
            return value
    return None
