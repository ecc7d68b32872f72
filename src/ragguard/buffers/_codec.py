"""Snappy (python-snappy's raw block format) compressing straight into pooled buffers.

The engine is cramjam's ``snappy.compress_raw_into`` / ``decompress_raw_into``, the same one
python-snappy 0.7 uses, so :meth:`SnappyCodec.compress` output equals ``snappy.compress``.

Decompression never trusts the input: the block's declared length (a varint at its start) is
checked before any buffer is taken. It must not exceed ``max_message_bytes`` nor what the block
could possibly expand to: a snappy element of 3 bytes yields at most 64 bytes, so no valid block
expands beyond ``22 * len(block)``. A few bytes claiming 4 GiB are refused without allocating.
Garbage, truncated blocks and framed streams raise :class:`~ragguard.CorruptPayload`; the one
block that decodes to empty output is ``b"\\x00"``, the encoding of empty input.

Small messages take no pooled buffer: a block or message under :data:`SMALL_BYTES` gets a buffer
of its own (an :class:`~ragguard.buffers.OwnedLease`), and the bytes-returning calls hand cramjam's
output straight over. For a 130-byte token chunk the pool's bookkeeping (a free list, the zeroing
of what an earlier payload left) cost three times the compression itself; allocating a few hundred
bytes costs less (benchmarks/codec.py measures both).

A small block's length check is read in Python from its header, a varint of one or two bytes (two
index operations, cheaper than a call into cramjam), and is only checked against
``max_message_bytes``: a buffer under SMALL_BYTES is harmless to allocate, and cramjam refuses a
block that decodes to any other length than it declares ("header mismatch"; tests/buffers pins
it), so neither the expansion bound nor the decoded length is checked again.
"""

from __future__ import annotations

from typing import Any

import cramjam

from .. import _validate as v
from .._errors import ConfigError, CorruptPayload, InvalidInput
from ._pool import BufferPool, Lease, OwnedLease, _give_back, default_pool, zero

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "MAX_EXPANSION", "SMALL_BYTES", "SnappyCodec", "byte_view"]

SMALL_BYTES = 1024
"""Blocks and messages below this many bytes (a pool's smallest buffer) take no pooled buffer."""

_SMALL_MAX = SMALL_BYTES - 1  # the longest small message

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # gRPC's default maximum receive size
MAX_EXPANSION = 22  # ceil(64 / 3): the best ratio any snappy element reaches

_snappy: Any = cramjam.snappy
_compress_raw = _snappy.compress_raw
_compress_raw_into = _snappy.compress_raw_into
_decompress_raw = _snappy.decompress_raw
_decompress_raw_into = _snappy.decompress_raw_into
_decompress_raw_len = _snappy.decompress_raw_len
_DecompressionError: type[Exception] = cramjam.DecompressionError
_ENCODER_SLACK = 16  # bytes past a block's end the encoder may have scribbled on
_SLACK_ZEROS = bytearray(_ENCODER_SLACK)  # a bytearray source: no temporary copy on assignment
_EMPTY_BLOCK = b"\x00"
_new_lease = object.__new__


def byte_view(data: object) -> memoryview:
    """``data`` (any C-contiguous buffer: bytes, bytearray, memoryview, numpy array) as flat bytes.

    Raises :class:`~ragguard.InvalidInput` for non-buffers (str included) and strided views.
    """
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidInput(f"expected a bytes-like object, got {type(data).__name__}") from None
    if view.format == "B" and view.ndim == 1:
        return view
    if not view.c_contiguous:
        raise InvalidInput("expected a C-contiguous buffer, got a strided view")
    return view.cast("B")


class SnappyCodec:
    """Snappy raw-block compression into leased buffers; stateless, safe to share.

    ``max_message_bytes``: the largest decompressed message accepted, in bytes (default 4 MiB).
    ``pool``: where buffers come from (default: the process-wide pool).

    Inputs may be bytes, bytearray, memoryview or any C-contiguous buffer; all give identical
    results. Raises :class:`~ragguard.ConfigError` for a bad option.
    """

    __slots__ = ("max_message_bytes", "pool")

    def __init__(
        self, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, pool: BufferPool | None = None
    ) -> None:
        v.size("max_message_bytes", max_message_bytes)
        if pool is not None and not isinstance(pool, BufferPool):
            raise ConfigError(f"SnappyCodec.pool must be a BufferPool, got {type(pool).__name__}")
        self.max_message_bytes = max_message_bytes
        self.pool = pool if pool is not None else default_pool()

    @staticmethod
    def max_compressed_length(size: int) -> int:
        """The largest block that ``size`` input bytes can compress to (snappy's bound)."""
        return 32 + size + size // 6

    def decompressed_length(self, block: object) -> int:
        """The length a block declares, in bytes, once checked against the limits above.

        Raises :class:`~ragguard.CorruptPayload` for an empty or malformed header, a length
        above ``max_message_bytes``, or one the block is too short to produce.
        """
        return self._checked_length(byte_view(block))

    def compress_into(self, data: object, out: object) -> int:
        """Compress ``data`` into the writable buffer ``out``; returns the block length in bytes.

        ``out`` needs :meth:`max_compressed_length` bytes; raises InvalidInput when smaller.
        """
        src, dst = byte_view(data), _writable(out)
        need = self.max_compressed_length(len(src))
        if len(dst) < need:
            raise InvalidInput(f"compress_into: output holds {len(dst)} bytes, needs {need}")
        return int(_snappy.compress_raw_into(src, dst))

    def decompress_into(self, block: object, out: object) -> int:
        """Decompress ``block`` into the writable buffer ``out``; returns the length in bytes.

        ``out`` needs :meth:`decompressed_length` bytes (InvalidInput when smaller); raises
        :class:`~ragguard.CorruptPayload` when the block is not valid.
        """
        src, dst = byte_view(block), _writable(out)
        size = self._checked_length(src)
        if len(dst) < size:
            raise InvalidInput(f"decompress_into: output holds {len(dst)} bytes, needs {size}")
        return self._decode(src, dst[:size], size)

    def compressed(self, data: object) -> Lease:
        """Compress ``data`` into a pooled buffer; the lease's view is exactly the block.

        Release the lease (or use it as a context manager) when the block has been sent.
        """
        src = data if type(data) is bytes else byte_view(data)
        size = len(src)
        bound = 32 + size + size // 6  # max_compressed_length, inlined: this is the hot path
        if bound < SMALL_BYTES:  # a buffer of its own (see the module docstring)
            own = bytearray(bound)
            n = _compress_raw_into(src, own)
            del own[n:]  # cheaper than slicing a view, and the lease holds nothing past the block
            small = _new_lease(OwnedLease)  # OwnedLease.of(own, memoryview(own)), inlined
            small._view = memoryview(own)
            small.size = n
            return small
        pool = self.pool  # pool._take(bound), inlined: an idle buffer of the class, or a new one
        free = pool._free[(bound - 1).bit_length()]
        try:
            buffer = free.pop()
        except IndexError:
            buffer = pool._new_buffer(bound, free)
        else:
            buffer.hits += 1
        dirty = buffer.written  # earlier payloads end here; zero past the block
        # The whole bytearray (>= bound) goes to the encoder: cramjam takes it as it is,
        # while slicing a memoryview first would cost a Python object per call.
        try:
            n = _compress_raw_into(src, buffer.data)
        except BaseException:
            buffer.written = max(dirty, bound)  # the encoder may have written anywhere below bound
            _give_back(buffer)
            raise
        # Past the block the encoder leaves at most the tail of one 16-byte literal copy
        # (snap's fast path; tests/buffers checks the bound), never past ``bound``; earlier
        # payloads end at ``dirty`` (which may lie past ``bound``: a buffer of the class held a
        # longer block). Zero from the block's end to whichever reaches further, not the whole
        # buffer.
        end = n + _ENCODER_SLACK
        if dirty > end or end > bound:
            zero(buffer.view, n, max(dirty, min(end, bound)))
        else:  # the usual case, inlined: same-length slice assignment from a bytearray is a memset
            buffer.data[n:end] = _SLACK_ZEROS
        buffer.written = n
        lease = _new_lease(Lease)  # Lease(buffer, view) without its __init__ frame
        lease._buffer = buffer
        lease._view = buffer.view[:n]
        lease.size = n
        return lease

    def decompressed(self, block: object) -> Lease:
        """Decompress ``block`` into a pooled buffer; the lease's view is exactly the message.

        Raises :class:`~ragguard.CorruptPayload` (before taking any buffer when the declared
        length is refused).
        """
        src = block if type(block) is bytes else byte_view(block)
        try:  # the declared length of a small message: a varint of one or two bytes
            size = src[0]
            if size > 127:
                size += (src[1] << 7) - 128
        except IndexError:
            size = 0
        if not 0 < size < SMALL_BYTES or size > self.max_message_bytes:
            size = self._declared_length(src)  # a longer header, the empty block, or none at all
        if size < SMALL_BYTES:  # a buffer of its own (see the module docstring)
            own = bytearray(size)
            try:
                _decompress_raw_into(src, own)  # exactly ``size`` bytes, or it raises
            except _DecompressionError as exc:
                raise CorruptPayload(f"snappy block does not decode: {exc}") from exc
            small = _new_lease(OwnedLease)  # OwnedLease.of(own, memoryview(own)), inlined
            small._view = memoryview(own)
            small.size = size
            return small
        pool = self.pool  # pool._take(size), inlined
        free = pool._free[(size - 1).bit_length()]
        try:
            buffer = free.pop()
        except IndexError:
            buffer = pool._new_buffer(size, free)
        else:
            buffer.hits += 1
            if buffer.written > size:  # an earlier, longer payload: nothing of it past ours
                zero(buffer.view, size, buffer.written)
        buffer.written = size  # a failed decode too may have written anywhere in the view
        view = buffer.view[:size]  # the decoder cannot write past an exact-length view
        try:
            n = _decompress_raw_into(src, view)
        except BaseException as exc:
            view.release()
            _give_back(buffer)
            if isinstance(exc, _DecompressionError):
                raise CorruptPayload(f"snappy block does not decode: {exc}") from exc
            raise
        if n != size:
            view.release()
            _give_back(buffer)
            raise CorruptPayload(f"snappy block declares {size} bytes but decodes to {n}")
        lease = _new_lease(Lease)  # Lease(buffer, view) without its __init__ frame
        lease._buffer = buffer
        lease._view = view
        lease.size = size
        return lease

    def compress(self, data: object) -> bytes:
        """The snappy block of ``data`` as bytes (identical to ``snappy.compress(data)``)."""
        src = data if type(data) is bytes else byte_view(data)
        if len(src) < SMALL_BYTES:  # cramjam's own output, copied once: no buffer to lease
            return bytes(_compress_raw(src))
        with self.compressed(src) as block:
            return bytes(block)

    def decompress(self, block: object) -> bytes:
        """The message in ``block`` as bytes; raises :class:`~ragguard.CorruptPayload`."""
        src = block if type(block) is bytes else byte_view(block)
        try:  # a varint header of one byte, or of two whose second is below 8: under SMALL_BYTES
            small = src[0] < 128 or src[1] < 8
        except IndexError:
            small = False  # the empty block, or a header cut short
        if not (small and self.max_message_bytes >= _SMALL_MAX) and self._declared_length(src) >= SMALL_BYTES:
            with self.decompressed(src) as message:
                return bytes(message)
        try:  # cramjam's own output, copied once: no buffer to lease
            return bytes(_decompress_raw(src))  # exactly the declared length, or it raises
        except _DecompressionError as exc:
            raise CorruptPayload(f"snappy block does not decode: {exc}") from exc

    def _declared_length(self, src: bytes | memoryview) -> int:
        """_checked_length, with its cheap accept (one call into cramjam) tried first."""
        try:
            size = int(_decompress_raw_len(src))
        except _DecompressionError:
            size = -1
        if 0 < size <= self.max_message_bytes and size <= MAX_EXPANSION * len(src):
            return size
        return self._checked_length(src)  # raises CorruptPayload naming the problem (b"\x00": 0)

    def _checked_length(self, src: bytes | memoryview) -> int:
        if not src:
            raise CorruptPayload("snappy block is empty (the empty message encodes as b'\\x00')")
        try:
            size = int(_decompress_raw_len(src))
        except _DecompressionError as exc:
            raise CorruptPayload(f"snappy block has a malformed length header: {exc}") from exc
        if size > self.max_message_bytes:
            raise CorruptPayload(
                f"snappy block declares {size} bytes, above max_message_bytes={self.max_message_bytes}"
            )
        if size > MAX_EXPANSION * len(src):
            raise CorruptPayload(
                f"snappy block of {len(src)} bytes declares {size} bytes, more than it can encode"
            )
        if size == 0 and src != _EMPTY_BLOCK:
            raise CorruptPayload("snappy block declares 0 bytes but carries data")
        return size

    @staticmethod
    def _decode(src: memoryview, dst: memoryview | bytearray, size: int) -> int:
        try:
            n = int(_snappy.decompress_raw_into(src, dst))
        except _DecompressionError as exc:
            raise CorruptPayload(f"snappy block does not decode: {exc}") from exc
        if n != size:
            raise CorruptPayload(f"snappy block declares {size} bytes but decodes to {n}")
        return n

    def __repr__(self) -> str:
        return f"SnappyCodec(max_message_bytes={self.max_message_bytes})"


def _writable(out: object) -> memoryview:
    view = byte_view(out)
    if view.readonly:
        raise InvalidInput("expected a writable buffer (bytearray, writable memoryview)")
    return view
