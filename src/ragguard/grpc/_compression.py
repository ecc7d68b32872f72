"""Snappy on the wire, at the message level, negotiated per call.

gRPC Python compresses only with gzip or deflate, so Snappy travels inside the messages: each
message the server sends to a client that asked for it starts with one marker byte, ``0x00``
(the rest is the plain serialized message) or ``0x01`` (the rest is a snappy block of it).
Messages under ``min_bytes``, or that snappy would not shrink, go plain, so one stream can mix
both. The wrapping sits around any serializer pair, protobuf or not.

Negotiation, per call, by request metadata:

- ``ragguard-accept-encoding: snappy`` (sent by :func:`snappy_channel`): the server marks, and
  may compress, every response message of this call.
- ``ragguard-encoding: snappy`` (sent by ``snappy_channel(..., compress_requests=True)``): the
  client marked its request messages.

A client that sends neither gets exactly the bytes a server without ragguard would send.
The server decides per call by giving that call its own method handler whose response
serializer marks or not, so the choice holds for all four RPC kinds and both streaming styles
(async generator and ``context.write()``), with no state shared between calls.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from contextlib import aclosing
from typing import Any

import grpc
from grpc import aio

from .._errors import ConfigError, CorruptPayload
from ..buffers import SnappyCodec
from ..buffers._codec import byte_view
from . import _server
from ._handlers import Behavior, first_value, rebuild

__all__ = [
    "ACCEPT_ENCODING_KEY",
    "ENCODING_KEY",
    "SnappyServerInterceptor",
    "SnappyWire",
    "snappy_channel",
]

log = logging.getLogger("ragguard.grpc")
_GUARD_MODULE = _server.__name__  # the behaviors a GuardServerInterceptor wraps are defined there

ACCEPT_ENCODING_KEY = "ragguard-accept-encoding"
ENCODING_KEY = "ragguard-encoding"
SNAPPY = "snappy"
PLAIN_MARK = 0x00
SNAPPY_MARK = 0x01
_PLAIN_PREFIX = bytes([PLAIN_MARK])

Serializer = Callable[[Any], bytes]
Deserializer = Callable[[bytes], Any]


def _identity(message: Any) -> Any:
    return message


class SnappyWire:
    """Marks and compresses serialized messages; wraps a serializer or deserializer.

    ``codec``: the :class:`~ragguard.buffers.SnappyCodec` (its ``max_message_bytes`` bounds a
    decompressed message). ``min_bytes``: messages shorter than this go plain (default 256).
    ``borrow``: when True, a wrapped deserializer hands its inner deserializer a memoryview of
    a pooled buffer that is valid only during that call (saves one copy for parsers that copy
    what they keep, such as protobuf's ``FromString``); default False hands it bytes.
    Raises :class:`~ragguard.ConfigError` for bad options.
    """

    __slots__ = ("_deserializers", "_serializers", "borrow", "codec", "min_bytes")

    def __init__(
        self, *, codec: SnappyCodec | None = None, min_bytes: int = 256, borrow: bool = False
    ) -> None:
        if not isinstance(min_bytes, int) or min_bytes < 0:
            raise ConfigError(f"SnappyWire.min_bytes must be an int >= 0, got {min_bytes!r}")
        if codec is not None and not isinstance(codec, SnappyCodec):
            raise ConfigError(f"SnappyWire.codec must be a SnappyCodec, got {type(codec).__name__}")
        self.codec = codec if codec is not None else SnappyCodec()
        self.min_bytes = min_bytes
        self.borrow = bool(borrow)
        self._serializers: dict[Any, Serializer] = {}
        self._deserializers: dict[Any, Deserializer] = {}

    def encode(self, payload: Any) -> bytes:
        """One marked message: the marker byte, then ``payload`` plain or as a snappy block."""
        view = byte_view(payload)
        size = len(view)
        if size >= self.min_bytes and size:
            codec = self.codec
            with codec.pool.lease(1 + codec.max_compressed_length(size)) as out:
                n = codec.compress_into(view, out[1:])
                if n < size:
                    out[0] = SNAPPY_MARK
                    return bytes(out[: n + 1])
        return _PLAIN_PREFIX + view

    def decode(self, message: bytes) -> bytes:
        """The payload of one marked message; raises :class:`~ragguard.CorruptPayload`."""
        view = byte_view(message)
        if not view:
            raise CorruptPayload("marked message is empty: the marker byte is missing")
        mark = view[0]
        if mark == PLAIN_MARK:
            return bytes(view[1:])
        if mark == SNAPPY_MARK:
            return self.codec.decompress(view[1:])
        raise CorruptPayload(f"unknown message marker 0x{mark:02x} (expected 0x00 plain or 0x01 snappy)")

    def serializer(self, inner: Serializer | None) -> Serializer:
        """``inner`` (None: messages are bytes already) followed by :meth:`encode`."""
        wrapped = self._serializers.get(inner)
        if wrapped is None:
            serialize = inner or _identity
            encode = self.encode

            def wrapped(message: Any) -> bytes:
                return encode(serialize(message))

            if len(self._serializers) < 1024:
                self._serializers[inner] = wrapped
        return wrapped

    def deserializer(self, inner: Deserializer | None) -> Deserializer:
        """:meth:`decode` followed by ``inner`` (None: hand over the payload bytes)."""
        wrapped = self._deserializers.get(inner)
        if wrapped is None:
            wrapped = self._borrowing(inner) if self.borrow and inner is not None else self._copying(inner)
            if len(self._deserializers) < 1024:
                self._deserializers[inner] = wrapped
        return wrapped

    def _copying(self, inner: Deserializer | None) -> Deserializer:
        decode = self.decode
        if inner is None:
            return decode

        def wrapped(message: bytes) -> Any:
            return inner(decode(message))

        return wrapped

    def _borrowing(self, inner: Deserializer) -> Deserializer:
        codec = self.codec

        def wrapped(message: bytes) -> Any:
            view = byte_view(message)
            if view and view[0] == SNAPPY_MARK:
                with codec.decompressed(view[1:]) as payload:
                    return inner(payload)  # type: ignore[arg-type]
            if view and view[0] == PLAIN_MARK:
                return inner(view[1:])  # type: ignore[arg-type]
            return inner(self.decode(message))

        return wrapped

    def __repr__(self) -> str:
        return f"SnappyWire(min_bytes={self.min_bytes}, borrow={self.borrow}, codec={self.codec!r})"


def _lists_snappy(value: str | bytes | None) -> bool:
    if value is None:
        return False
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    return any(part.strip().lower() == SNAPPY for part in value.split(","))


class _Refused:
    """A message that did not deserialize, carried past grpc.aio's own deserialization step
    (which turns a raising deserializer into a silent None on clients and UNKNOWN on servers)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _not_raising(deserialize: Deserializer) -> Deserializer:
    def wrapped(message: bytes) -> Any:
        try:
            return deserialize(message)
        except Exception as exc:
            return _Refused(exc)

    return wrapped


async def _invalid_argument(context: aio.ServicerContext[Any, Any], error: Exception) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))


async def _opened(decode: Deserializer | None, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
    """A unary request, decoded now (``decode`` None: a streamed request, decoded as it is read);
    a request that does not decode fails the call with INVALID_ARGUMENT."""
    if decode is None:
        return request
    try:
        return decode(request)
    except Exception as exc:
        await _invalid_argument(context, exc)


def _answering_corrupt_requests(behavior: Behavior, decode: Deserializer | None) -> Behavior:
    """``behavior``, whose unary request arrives as the marked bytes and is decoded (``decode``)
    only when the behavior runs: inside the tenant admission of a GuardServerInterceptor listed
    before this interceptor, so a refused call is never decompressed. A request that does not
    decode fails the call with INVALID_ARGUMENT; a streamed one raises CorruptPayload in the
    handler as it is read."""
    if inspect.isasyncgenfunction(behavior):

        async def checked_stream(request: Any, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            request = await _opened(decode, request, context)
            try:
                async with aclosing(behavior(request, context)) as responses:
                    async for response in responses:
                        yield response
            except CorruptPayload as exc:
                await _invalid_argument(context, exc)

        return checked_stream

    async def checked(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        request = await _opened(decode, request, context)
        try:
            return await behavior(request, context)
        except CorruptPayload as exc:
            await _invalid_argument(context, exc)

    return checked


class SnappyServerInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """Serve marked (and, above ``wire.min_bytes``, snappy-compressed) responses to the calls
    whose metadata asks for them; accept marked requests from calls that say they send them.

    Other calls get their method handler untouched. A marked request message that does not
    decode fails the call with INVALID_ARGUMENT (async handlers; a sync handler's call fails in
    gRPC's deserialization step with UNKNOWN), and the server goes on serving.

    A unary request is decompressed only when its handler runs, not in gRPC's deserialization
    step: listed after :class:`~ragguard.grpc.GuardServerInterceptor`
    (``interceptors=[GuardServerInterceptor(), SnappyServerInterceptor()]``), that is after the
    call's tenant was admitted, so a call its quota refuses is never decompressed and at most the
    admitted calls hold decompressed requests (each at most the codec's ``max_message_bytes``).
    A streamed request's messages are decompressed as the handler reads them. Listed the other
    way round, requests are decompressed before admission, and a warning says so once.
    """

    def __init__(self, *, wire: SnappyWire | None = None) -> None:
        if wire is not None and not isinstance(wire, SnappyWire):
            raise ConfigError(f"wire must be a SnappyWire, got {type(wire).__name__}")
        self.wire = wire if wire is not None else SnappyWire()
        self._warned = False

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        metadata = handler_call_details.invocation_metadata
        accepts = _lists_snappy(first_value(metadata, ACCEPT_ENCODING_KEY))
        marked = _lists_snappy(first_value(metadata, ENCODING_KEY))
        if not accepts and not marked:
            return handler
        wire = self.wire
        serializer = wire.serializer(handler.response_serializer) if accepts else handler.response_serializer
        if not marked:
            return rebuild(handler, response_serializer=serializer)
        deserializer: Deserializer | None = wire.deserializer(handler.request_deserializer)
        behavior = _behavior_of(handler)
        if not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
            return rebuild(handler, request_deserializer=deserializer, response_serializer=serializer)
        if getattr(behavior, "__module__", None) == _GUARD_MODULE and not self._warned:
            self._warned = True
            log.warning(
                "SnappyServerInterceptor is listed before GuardServerInterceptor: requests are "
                "decompressed before their tenant is admitted; list GuardServerInterceptor first"
            )
        decode = None if handler.request_streaming else deserializer
        if decode is not None:
            deserializer = None  # the marked bytes: decoded by the behavior, once admitted

        def wrap(behavior: Behavior, request_streaming: bool, response_streaming: bool) -> Behavior:
            return _answering_corrupt_requests(behavior, decode)

        return rebuild(handler, wrap=wrap, request_deserializer=deserializer, response_serializer=serializer)


def _behavior_of(handler: grpc.RpcMethodHandler) -> Any:
    if handler.request_streaming:
        return handler.stream_stream if handler.response_streaming else handler.stream_unary
    return handler.unary_stream if handler.response_streaming else handler.unary_unary


class _MetadataAdding:
    """A multi-callable that adds fixed metadata pairs to every call it starts, and whose calls
    raise for a response message that did not deserialize."""

    __slots__ = ("_extra", "_inner")

    def __init__(self, inner: Any, extra: tuple[tuple[str, str], ...]) -> None:
        self._inner = inner
        self._extra = extra

    def __call__(self, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        merged = aio.Metadata(*(metadata or ()), *self._extra)
        return _CheckedCall(self._inner(*args, metadata=merged, **kwargs))


class _CheckedCall:
    """A grpc.aio call whose responses are checked: a message the deserializer refused (over the
    codec's size limit, corrupt, or refused by the inner deserializer) raises its error, after
    cancelling the call, instead of arriving as grpc.aio's silent None. Everything else is the
    call's own."""

    __slots__ = ("_call",)

    def __init__(self, call: Any) -> None:
        self._call = call

    def _checked(self, response: Any) -> Any:
        if type(response) is _Refused:
            self._call.cancel()
            raise response.error
        return response

    def __await__(self) -> Generator[Any, None, Any]:
        response = yield from self._call.__await__()
        return self._checked(response)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._responses()

    async def _responses(self) -> AsyncIterator[Any]:
        async for response in self._call:
            yield self._checked(response)

    async def read(self) -> Any:
        return self._checked(await self._call.read())

    def __getattr__(self, name: str) -> Any:  # write(), done_writing(), code(), cancel()...
        return getattr(self._call, name)


class _SnappyChannel:
    """A grpc.aio channel whose multi-callables negotiate Snappy responses; see snappy_channel."""

    def __init__(self, channel: aio.Channel, wire: SnappyWire, compress_requests: bool) -> None:
        self._channel = channel
        self._wire = wire
        self._compress_requests = compress_requests
        extra = [(ACCEPT_ENCODING_KEY, SNAPPY)]
        if compress_requests:
            extra.append((ENCODING_KEY, SNAPPY))
        self._extra = tuple(extra)

    def _method(
        self, kind: str, method: str, request_serializer: Any, response_deserializer: Any, **kw: Any
    ) -> Any:
        if self._compress_requests:
            request_serializer = self._wire.serializer(request_serializer)
        inner = getattr(self._channel, kind)(
            method,
            request_serializer=request_serializer,
            response_deserializer=_not_raising(self._wire.deserializer(response_deserializer)),
            **kw,
        )
        return _MetadataAdding(inner, self._extra)

    def unary_unary(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **kw: Any
    ) -> Any:
        return self._method("unary_unary", method, request_serializer, response_deserializer, **kw)

    def unary_stream(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **kw: Any
    ) -> Any:
        return self._method("unary_stream", method, request_serializer, response_deserializer, **kw)

    def stream_unary(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **kw: Any
    ) -> Any:
        return self._method("stream_unary", method, request_serializer, response_deserializer, **kw)

    def stream_stream(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **kw: Any
    ) -> Any:
        return self._method("stream_stream", method, request_serializer, response_deserializer, **kw)

    def __getattr__(self, name: str) -> Any:  # close(), channel_ready(), get_state()...
        return getattr(self._channel, name)

    async def __aenter__(self) -> _SnappyChannel:
        await self._channel.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._channel.__aexit__(*exc)


def snappy_channel(
    channel: aio.Channel, *, wire: SnappyWire | None = None, compress_requests: bool = False
) -> Any:
    """Wrap a grpc.aio channel so its calls ask for Snappy responses and decode them.

    Works with generated stubs (``EmbedStub(snappy_channel(channel))``) and with
    ``channel.unary_unary(...)``-style calls. Use it only against servers running
    :class:`SnappyServerInterceptor`: a server that ignores the request would send unmarked
    messages. ``compress_requests=True`` also marks and compresses request messages.
    Raises :class:`~ragguard.ConfigError` for a bad ``wire``.
    """
    if wire is not None and not isinstance(wire, SnappyWire):
        raise ConfigError(f"wire must be a SnappyWire, got {type(wire).__name__}")
    return _SnappyChannel(channel, wire if wire is not None else SnappyWire(), bool(compress_requests))
