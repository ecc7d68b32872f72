"""Message-level Snappy: the wire format, and negotiation with plain and snappy clients."""

from __future__ import annotations

import random

import pytest
import snappy
from grpc import aio
from grpc_helpers import Behaviors, call_kind, method, serving
from hypothesis import given, settings
from hypothesis import strategies as st

from ragguard import ConfigError, CorruptPayload
from ragguard.buffers import BufferPool, SnappyCodec
from ragguard.grpc import (
    GuardServerInterceptor,
    SnappyServerInterceptor,
    SnappyWire,
    client_interceptors,
    snappy_channel,
)
from ragguard.grpc._compression import ACCEPT_ENCODING_KEY

KINDS = ["Unary", "StreamGen", "StreamWrite", "ClientStream", "BidiGen", "BidiWrite"]
BIG = b"x" * 4000


# --- the wire format, as a unit -------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000) | st.binary(max_size=20).map(lambda b: b * 200))
def test_encode_decode_roundtrip(payload: bytes) -> None:
    wire = SnappyWire(min_bytes=64)
    message = wire.encode(payload)
    assert message[0] in (0, 1)
    assert wire.decode(message) == payload
    assert wire.decode(bytearray(message)) == wire.decode(memoryview(message)) == payload
    if message[0] == 1:
        assert len(message) < len(payload) + 1
        assert snappy.decompress(message[1:]) == payload


def test_small_and_incompressible_messages_go_plain() -> None:
    wire = SnappyWire(min_bytes=256)
    assert wire.encode(b"tiny") == b"\x00tiny"
    noisy = random.Random(3).randbytes(512)
    assert wire.encode(noisy)[0] == 0
    assert wire.encode(BIG)[0] == 1
    assert wire.encode(b"") == b"\x00"


@pytest.mark.parametrize("bad", [b"", b"\x02abc", b"\x01\xff\xff\xff\xff\x0f", b"\x01garbage"])
def test_bad_marked_messages_raise_corrupt_payload(bad: bytes) -> None:
    with pytest.raises(CorruptPayload):
        SnappyWire().decode(bad)


def test_wrapped_serializer_pair_and_borrowing_deserializer() -> None:
    pool = BufferPool()
    wire = SnappyWire(codec=SnappyCodec(pool=pool), borrow=True)
    ser = wire.serializer(lambda text: text.encode())
    borrowed: list[memoryview] = []

    def parse(view: memoryview) -> str:
        borrowed.append(view)
        return bytes(view).decode()

    de = wire.deserializer(parse)
    text = "chunk " * 500
    assert de(ser(text)) == text
    assert de(ser("small")) == "small"
    assert pool.stats().in_use == 0
    with pytest.raises(ValueError):
        bytes(borrowed[0])  # the pooled view died with the call
    assert wire.serializer(None)(b"abc") == b"\x00abc"
    assert wire.deserializer(None)(b"\x00abc") == b"abc"


def test_bad_options_raise_config_error() -> None:
    with pytest.raises(ConfigError):
        SnappyWire(min_bytes=-1)
    with pytest.raises(ConfigError):
        SnappyWire(codec="snappy")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        SnappyServerInterceptor(wire=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        snappy_channel(object(), wire=object())  # type: ignore[arg-type]


# --- negotiation over a real server ---------------------------------------------------------


def interceptors() -> list[aio.ServerInterceptor]:
    return [GuardServerInterceptor(), SnappyServerInterceptor()]


@pytest.mark.anyio
@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", KINDS)
async def test_plain_and_snappy_clients_against_one_server(kind: str) -> None:
    behaviors = Behaviors()
    async with (
        serving(behaviors, interceptors()) as target,
        serving(Behaviors()) as bare_target,
        aio.insecure_channel(target) as plain,
        aio.insecure_channel(bare_target) as bare,
        aio.insecure_channel(target, interceptors=client_interceptors()) as raw,
    ):
        fast = snappy_channel(aio.insecure_channel(target, interceptors=client_interceptors()))
        try:
            from_plain = await call_kind(plain, kind, b"hi")
            from_bare = await call_kind(bare, kind, b"hi")
            from_snappy = await call_kind(fast, kind, b"hi")
            marked = await call_kind(raw, kind, b"hi", metadata=((ACCEPT_ENCODING_KEY, "snappy"),))
        finally:
            await fast.close()
    assert from_plain == from_bare  # exactly what a server without ragguard sends
    assert from_snappy == from_plain
    assert [m[0] for m in marked] == [1 if len(p) >= 256 else 0 for p in from_plain]
    assert [SnappyWire().decode(m) for m in marked] == from_plain


@pytest.mark.anyio
@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["StreamGen", "StreamWrite"])
async def test_one_stream_mixes_plain_and_compressed_messages(kind: str) -> None:
    async with serving(Behaviors(), interceptors()) as target, aio.insecure_channel(target) as raw:
        md = ((ACCEPT_ENCODING_KEY, "gzip, snappy"),)
        messages = [m async for m in method(raw, kind)(b"hi", metadata=md)]
    assert [m[0] for m in messages] == [0, 0, 1, 0]
    assert len(messages[2]) < 400  # 4000 repeated bytes, compressed
    assert SnappyWire().decode(messages[2]) == BIG


@pytest.mark.anyio
@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["ClientStream", "BidiGen"])
async def test_compressed_requests(kind: str) -> None:
    async with serving(Behaviors(), interceptors()) as target:
        ch = snappy_channel(aio.insecure_channel(target), compress_requests=True)
        try:
            replies = await call_kind(ch, kind, BIG)
        finally:
            await ch.close()
    assert BIG in replies[0]


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_snappy_channel_with_write_style_client_stream() -> None:
    async with serving(Behaviors(), interceptors()) as target:
        ch = snappy_channel(aio.insecure_channel(target))
        try:
            call = method(ch, "BidiWrite")(metadata=(("x-tenant-id", "acme"),))
            await call.write(BIG)
            reply = await call.read()
            await call.done_writing()
        finally:
            await ch.close()
    assert reply.startswith(BIG + b"!")
    assert b'"acme"' in reply
