"""SnappyCodec: python-snappy compatibility, hostile input, buffer kinds, pooled leases."""

from __future__ import annotations

import cramjam
import pytest
import snappy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragguard import ConfigError, CorruptPayload, InvalidInput
from ragguard.buffers import BufferPool, SnappyCodec

pytestmark = pytest.mark.timeout(60)

PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

compressible = st.lists(st.sampled_from([b"hit", b" score", b"\x00", b"{}", b"chunk"]), max_size=400).map(
    b"".join
)
payloads = st.one_of(st.binary(max_size=5000), compressible)


def as_kind(data: bytes, kind: str) -> object:
    return {"bytes": data, "bytearray": bytearray(data), "memoryview": memoryview(data)}[kind]


@PROPS
@given(payloads)
def test_roundtrip_and_python_snappy_compatibility(data: bytes) -> None:
    codec = SnappyCodec(pool=BufferPool())
    block = codec.compress(data)
    assert block == snappy.compress(data)
    assert codec.decompress(block) == data
    assert snappy.decompress(block) == data


@PROPS
@given(payloads, st.sampled_from(["bytearray", "memoryview"]))
def test_bytes_bytearray_memoryview_give_identical_results(data: bytes, kind: str) -> None:
    codec = SnappyCodec()
    block = codec.compress(data)
    assert codec.compress(as_kind(data, kind)) == block
    assert codec.decompress(as_kind(block, kind)) == codec.decompress(block)


@PROPS
@given(st.binary(min_size=1, max_size=300))
def test_garbage_never_crashes_and_never_decodes_to_empty(junk: bytes) -> None:
    codec = SnappyCodec(max_message_bytes=1 << 20)
    try:
        out = codec.decompress(junk)
    except CorruptPayload:
        return
    assert out or junk == b"\x00"
    assert snappy.compress(out) is not None  # decoded output is a real message
    assert len(out) <= 22 * len(junk)


@PROPS
@given(payloads.filter(lambda d: len(d) > 0), st.data())
def test_truncated_block_raises_corrupt_payload(data: bytes, draw: st.DataObject) -> None:
    codec = SnappyCodec()
    block = codec.compress(data)
    cut = draw.draw(st.integers(min_value=0, max_value=len(block) - 1))
    with pytest.raises(CorruptPayload):
        codec.decompress(block[:cut])


def test_framed_stream_fed_to_raw_decoder_raises_corrupt_payload() -> None:
    framed = snappy.StreamCompressor().compress(b"framed payload " * 100)
    with pytest.raises(CorruptPayload):
        SnappyCodec().decompress(framed)


def test_huge_declared_length_is_refused_before_allocating() -> None:
    pool = BufferPool()
    codec = SnappyCodec(pool=pool)
    four_gib_claim = b"\xff\xff\xff\xff\x0f" + b"\x00" * 4
    with pytest.raises(CorruptPayload, match="max_message_bytes"):
        codec.decompress(four_gib_claim)
    assert pool.stats().misses == 0  # no buffer was taken at all


def test_declared_length_beyond_possible_expansion_is_refused_before_allocating() -> None:
    pool = BufferPool()
    codec = SnappyCodec(pool=pool, max_message_bytes=1 << 30)
    claim = b"\x80\x80\x40" + b"\x00" * 5  # declares 1 MiB from 8 bytes
    with pytest.raises(CorruptPayload, match="more than it can encode"):
        codec.decompress(claim)
    assert pool.stats().misses == 0


def test_message_at_the_limit_passes_and_one_byte_more_is_refused() -> None:
    codec = SnappyCodec(max_message_bytes=10_000)
    assert codec.decompress(snappy.compress(b"a" * 10_000)) == b"a" * 10_000
    with pytest.raises(CorruptPayload):
        codec.decompress(snappy.compress(b"a" * 10_001))


def test_empty_message_and_empty_block() -> None:
    codec = SnappyCodec()
    assert codec.compress(b"") == b"\x00"
    assert codec.decompress(b"\x00") == b""
    with pytest.raises(CorruptPayload):
        codec.decompress(b"")
    with pytest.raises(CorruptPayload):
        codec.decompress(b"\x00junk")


def test_leases_return_to_the_pool_also_on_corrupt_input() -> None:
    pool = BufferPool()
    codec = SnappyCodec(pool=pool)
    block = codec.compress(b"x" * 3000)
    with codec.decompressed(block) as message:
        assert bytes(message) == b"x" * 3000
    with pytest.raises(CorruptPayload):
        codec.decompress(block[:-2] + b"\xff\xff")
    with codec.compressed(b"y" * 3000) as out:
        assert snappy.decompress(bytes(out)) == b"y" * 3000
    assert pool.stats().in_use == 0
    assert pool.stats().hits >= 1


def test_into_variants_write_into_caller_buffers() -> None:
    codec = SnappyCodec()
    data = b"embedding " * 500
    out = bytearray(codec.max_compressed_length(len(data)))
    n = codec.compress_into(data, out)
    assert bytes(out[:n]) == snappy.compress(data)
    dst = bytearray(len(data) + 10)
    assert codec.decompress_into(memoryview(out)[:n], dst) == len(data)
    assert bytes(dst[: len(data)]) == data
    with pytest.raises(InvalidInput):
        codec.compress_into(data, bytearray(10))
    with pytest.raises(InvalidInput):
        codec.decompress_into(bytes(out[:n]), bytearray(5))
    with pytest.raises(InvalidInput):
        codec.compress_into(data, bytes(len(data) * 2))  # read-only output


def test_numpy_float32_embeddings_roundtrip() -> None:
    np = pytest.importorskip("numpy")
    emb = np.random.default_rng(7).standard_normal((32, 768)).astype(np.float32)
    codec = SnappyCodec()
    block = codec.compress(emb)
    assert block == snappy.compress(emb.tobytes())
    back = np.frombuffer(codec.decompress(block), dtype=np.float32).reshape(32, 768)
    assert np.array_equal(back, emb)
    with pytest.raises(InvalidInput):
        codec.compress(emb[:, ::2])  # strided view


@pytest.mark.parametrize("bad", ["text", 12, None])
def test_non_buffers_raise_invalid_input(bad: object) -> None:
    with pytest.raises(InvalidInput):
        SnappyCodec().compress(bad)


def test_bad_options_raise_config_error() -> None:
    with pytest.raises(ConfigError):
        SnappyCodec(max_message_bytes=0)
    with pytest.raises(ConfigError):
        SnappyCodec(pool="not a pool")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad", [True, False, 1.5, 10**400, "4096"], ids=["True", "False", "1.5", "10**400", "str"]
)
def test_a_size_is_an_int_and_never_a_bool(bad: object) -> None:
    # issue 13 item 10: SnappyCodec(max_message_bytes=True) was accepted as a one-byte limit
    with pytest.raises(ConfigError) as info:
        SnappyCodec(max_message_bytes=bad)  # type: ignore[arg-type]
    assert info.value.field == "max_message_bytes" and len(str(info.value)) < 120
    with pytest.raises(ConfigError, match="max_bytes"):
        BufferPool(max_bytes=bad)  # type: ignore[arg-type]


def test_leased_codec_makes_no_payload_sized_allocation_in_steady_state() -> None:
    import tracemalloc

    data = b"retrieval augmented generation tenant quota breaker " * 600  # ~31 KB
    codec = SnappyCodec(pool=BufferPool())

    def step() -> None:
        with codec.compressed(data) as block, codec.decompressed(block) as message:
            assert len(message) == len(data)

    for _ in range(20):
        step()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        for _ in range(200):
            step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - base < len(data) // 8


def test_encoder_scribbles_at_most_the_codec_slack_past_the_block() -> None:
    """SnappyCodec zeroes only _ENCODER_SLACK bytes past a compressed block; this checks that
    cramjam's encoder really writes no further (with two sentinels, so no write can hide)."""
    import random

    import cramjam

    from ragguard.buffers._codec import _ENCODER_SLACK

    rng = random.Random(5)
    worst = 0
    for _ in range(300):
        n = rng.choice([rng.randrange(64), rng.randrange(4000), rng.randrange(60_000, 70_000)])
        alphabet = rng.choice([b"ab", b"abcdefgh ", bytes(range(256))])
        data = bytes(rng.choice(alphabet) for _ in range(n))
        bound = cramjam.snappy.compress_raw_max_len(data)
        for fill in (0xAA, 0x55):
            out = bytearray([fill]) * (bound + 64)
            end = cramjam.snappy.compress_raw_into(data, out)
            touched = [i for i in range(end, len(out)) if out[i] != fill]
            if touched:
                worst = max(worst, touched[-1] + 1 - end)
            assert not touched or touched[-1] < bound
    assert worst <= _ENCODER_SLACK


def test_compressed_buffer_holds_nothing_past_the_block() -> None:
    pool = BufferPool()
    codec = SnappyCodec(pool=pool)
    noise = bytes(random_bytes(20_000))  # incompressible: a long block
    with codec.compressed(noise):
        pass
    for data in (b"tenant quota breaker " * 300, b"abcdefghijklmnopq" * 7 + b"x", b"short"):
        with codec.compressed(data) as block:
            underlying = block.obj
            assert isinstance(underlying, bytearray)
            assert underlying[len(block) :] == bytes(len(underlying) - len(block))
            assert bytes(block) == snappy.compress(data)
    with codec.decompressed(codec.compress(b"y" * 100)) as message:
        underlying = message.obj
        assert underlying[100:] == bytes(len(underlying) - 100)


def random_bytes(n: int) -> bytes:
    import random

    return random.Random(3).randbytes(n)


def test_a_shorter_block_in_a_buffer_that_held_a_longer_one_leaves_nothing_past_it() -> None:
    """Both blocks take a buffer of the same class (32 KiB); the second is far shorter than the
    first, and even than its own bound: every byte past it is zero again."""
    pool = BufferPool()
    codec = SnappyCodec(pool=pool)
    with codec.compressed(random_bytes(20_000)) as long_block:
        assert len(long_block) > 20_000
    data = b"a" * 15_000  # bound 17,532: the same class, a block of a few hundred bytes
    with codec.compressed(data) as block:
        underlying = block.obj
        assert isinstance(underlying, bytearray) and len(underlying) == 32_768
        assert len(block) < 1_000
        assert underlying[len(block) :] == bytes(len(underlying) - len(block))
        assert bytes(block) == snappy.compress(data)
    assert pool.stats().hits == 1


def test_small_messages_take_no_pooled_buffer_and_keep_the_lease_contract() -> None:
    from ragguard.buffers import DoubleRelease
    from ragguard.buffers._pool import OwnedLease

    pool = BufferPool()
    codec = SnappyCodec(pool=pool)
    chunk = b"the next few tokens of a streamed answer, about a hundred and thirty bytes long....."
    lease = codec.compressed(chunk)
    assert isinstance(lease, OwnedLease) and lease.size == len(lease.view)
    assert bytes(lease.view) == snappy.compress(chunk) and not lease.view.readonly
    view = lease.view
    lease.release()
    assert lease.released
    with pytest.raises(ValueError):
        bytes(view)  # released with the lease: a stray use fails instead of reading stale bytes
    with pytest.raises(DoubleRelease):
        lease.release()
    with codec.decompressed(snappy.compress(chunk)) as message:
        assert bytes(message) == chunk and not message.readonly
    assert codec.compress(chunk) == snappy.compress(chunk)
    assert codec.decompress(snappy.compress(chunk)) == chunk
    stats = pool.stats()
    assert (stats.hits, stats.misses, stats.in_use) == (0, 0, 0)  # the pool was never asked
    big = b"tenant quota breaker " * 100  # 2,100 bytes: pooled
    with codec.compressed(big):
        assert pool.stats().in_use == 1


@pytest.mark.parametrize("declared", [b"\x7f", b"\xff\x07", b"\xff\xff\xff\xff\x0f"])
def test_a_small_block_declaring_more_than_it_holds_is_refused(declared: bytes) -> None:
    codec = SnappyCodec()
    for refuse in (codec.decompress, codec.decompressed):
        with pytest.raises(CorruptPayload):
            refuse(declared + b"\x00\x01")


def test_cramjam_refuses_a_block_that_decodes_to_another_length_than_it_declares() -> None:
    """The small-message paths rely on this instead of comparing the decoded length themselves."""
    for block, declared in ((b"\x02\x00\x01", 2), (b"\x81\x01\x00\x01", 129)):
        with pytest.raises(cramjam.DecompressionError, match="header mismatch"):
            cramjam.snappy.decompress_raw_into(block, bytearray(declared))
        with pytest.raises(cramjam.DecompressionError, match="header mismatch"):
            cramjam.snappy.decompress_raw(block)
        codec = SnappyCodec()
        for refuse in (codec.decompress, codec.decompressed):
            with pytest.raises(CorruptPayload, match="header mismatch"):
                refuse(block)


@pytest.mark.parametrize("limit", [1, 100, 1022, 1023, 1024])
def test_a_limit_below_the_small_size_still_refuses_before_decoding(limit: int) -> None:
    codec = SnappyCodec(max_message_bytes=limit)
    for n in sorted({limit - 1, limit, limit + 1, 1000} - {-1}):
        block = snappy.compress(b"t" * n)
        for call in (codec.decompress, lambda b: bytes(codec.decompressed(b).view)):
            if n <= limit:
                assert call(block) == b"t" * n
            else:
                with pytest.raises(CorruptPayload, match="max_message_bytes"):
                    call(block)


@PROPS
@given(st.binary(min_size=0, max_size=4))
def test_short_headers_read_in_python_agree_with_cramjam(header: bytes) -> None:
    block = header + b"\x00\x01"  # any declared length, then a one-byte literal
    codec = SnappyCodec(max_message_bytes=1 << 20)
    outcomes = []
    for call in (codec.decompress, lambda b: bytes(codec.decompressed(b).view)):
        try:
            outcomes.append(call(block))
        except CorruptPayload:
            outcomes.append(None)
    assert outcomes[0] == outcomes[1]
    try:  # the reference decode, for declared lengths it may allocate
        declared = cramjam.snappy.decompress_raw_len(block)
        expected = bytes(cramjam.snappy.decompress_raw(block)) if declared <= 1 << 20 else None
    except cramjam.DecompressionError:
        expected = None
    assert outcomes[0] == expected
