"""A thread-safe pool of reusable byte buffers, leased as exact-length memoryviews.

Buffers come in size classes: powers of two from ``min_size`` (1024, 2048, 4096, ...). A lease of
``n`` bytes takes an idle buffer of the smallest class that fits ``n`` (a hit) or allocates one (a
miss), and hands out a ``memoryview`` of exactly ``n`` bytes. On release the buffer goes back to
its class's free list unless the pool already holds ``max_buffers`` idle buffers or ``max_bytes``
idle bytes; then it is dropped for the garbage collector.

A reused buffer never shows an earlier payload past the requested length: each buffer remembers
how far it has been written (its high-water mark) and the bytes between the new length and that
mark are zeroed when it is leased again. Bytes inside the requested length may still hold an
earlier payload (the caller is about to overwrite them); pass ``zeroed=True`` to clear them too.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import TracebackType

from .._errors import ConfigError, InvalidInput

__all__ = ["BufferPool", "DoubleRelease", "Lease", "PoolStats", "default_pool"]


class DoubleRelease(RuntimeError):
    """A lease was released twice (its buffer may already belong to another lease)."""


@dataclass(frozen=True, slots=True)
class PoolStats:
    """A snapshot of a pool's counters.

    ``hits``/``misses``: leases served from an idle buffer / by a new allocation.
    ``in_use``: leases not yet released; ``in_use_bytes``: their buffers' capacity in bytes.
    ``buffers_held``/``bytes_held``: idle buffers kept for reuse and their total capacity.
    ``dropped``: released buffers not kept because a limit was reached.
    """

    hits: int
    misses: int
    in_use: int
    in_use_bytes: int
    buffers_held: int
    bytes_held: int
    dropped: int


class _Buffer:
    __slots__ = ("data", "view", "written")

    def __init__(self, capacity: int) -> None:
        self.data = bytearray(capacity)
        self.view = memoryview(self.data)  # leases slice this; never released, never exported
        self.written = 0  # high-water mark: bytes past it are known to be zero


class Lease:
    """One buffer on loan: ``view`` is a writable memoryview of exactly ``size`` bytes.

    Use as a context manager (``with pool.lease(n) as view:``) or call :meth:`release` once.
    The view, and every view derived from it, is valid only until release; the view itself
    is released then, so a stray use of it raises ValueError instead of reading another
    lease's bytes. A second :meth:`release` raises :class:`DoubleRelease`.
    """

    __slots__ = ("_buffer", "_pool", "_touched", "_view", "size")

    def __init__(self, pool: BufferPool, buffer: _Buffer, size: int, touched: int) -> None:
        self._pool = pool
        self._buffer: _Buffer | None = buffer
        self.size = size
        self._touched = touched  # how far the holder may have written (a codec may write past size)
        self._view: memoryview | None = buffer.view[:size]

    @property
    def view(self) -> memoryview:
        """The leased bytes; raises DoubleRelease after release."""
        if self._view is None:
            raise DoubleRelease("this lease was already released")
        return self._view

    @property
    def capacity(self) -> int:
        """The size class of the underlying buffer, in bytes (>= size)."""
        if self._buffer is None:
            raise DoubleRelease("this lease was already released")
        return len(self._buffer.data)

    @property
    def released(self) -> bool:
        return self._buffer is None

    def release(self) -> None:
        """Give the buffer back to the pool; raises DoubleRelease when already released."""
        buffer, view = self._buffer, self._view
        if buffer is None or view is None:
            raise DoubleRelease("this lease was already released")
        self._buffer = self._view = None
        reusable = True
        try:
            view.release()
        except BufferError:
            # Something still exports this view (e.g. a PickleBuffer of it): the
            # buffer could be written through it later, so it must never serve another lease.
            reusable = False
        if self._touched > buffer.written:
            buffer.written = self._touched
        self._pool._give_back(buffer, reusable)

    def __enter__(self) -> memoryview:
        view = self._view
        if view is None:
            raise DoubleRelease("this lease was already released")
        return view

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._buffer is not None:
            self.release()

    def __repr__(self) -> str:
        state = "released" if self._buffer is None else f"capacity={len(self._buffer.data)}"
        return f"<Lease size={self.size} {state}>"


class BufferPool:
    """Reusable byte buffers in power-of-two size classes; safe to share between threads.

    ``min_size``: the smallest class in bytes (a power of two >= 16, default 1024).
    ``max_buffers``: at most this many idle buffers are kept (default 65536; 0 keeps none).
    ``max_bytes``: at most this many idle bytes are kept (default 64 MiB).
    Raises :class:`~ragguard.ConfigError` for values out of range.
    """

    def __init__(
        self,
        *,
        min_size: int = 1024,
        max_buffers: int = 65536,
        max_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        if not isinstance(min_size, int) or min_size < 16 or min_size & (min_size - 1):
            raise ConfigError(f"BufferPool.min_size must be a power of two >= 16, got {min_size!r}")
        if not isinstance(max_buffers, int) or max_buffers < 0:
            raise ConfigError(f"BufferPool.max_buffers must be an int >= 0, got {max_buffers!r}")
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise ConfigError(f"BufferPool.max_bytes must be an int >= 0, got {max_bytes!r}")
        self.min_size = min_size
        self.max_buffers = max_buffers
        self.max_bytes = max_bytes
        self._min_shift = min_size.bit_length() - 1
        self._free: dict[int, list[_Buffer]] = {}
        self._lock = threading.Lock()
        self._hits = self._misses = self._dropped = 0
        self._in_use = self._in_use_bytes = 0
        self._buffers_held = self._bytes_held = 0

    def size_class(self, size: int) -> int:
        """The capacity in bytes of the buffer that serves a lease of ``size`` bytes."""
        if size <= self.min_size:
            return self.min_size
        return 1 << (size - 1).bit_length()

    def lease(self, size: int, *, zeroed: bool = False) -> Lease:
        """Lease ``size`` bytes (an int >= 0); ``zeroed=True`` clears them first.

        Raises :class:`~ragguard.InvalidInput` for a negative or non-int size.
        """
        if type(size) is not int or size < 0:
            raise InvalidInput(f"BufferPool.lease: size must be an int >= 0, got {size!r}")
        return Lease(self, self._take(size, 0 if zeroed else size), size, size)

    def _take(self, size: int, keep: int | None) -> _Buffer:
        """An idle or new buffer of at least ``size`` bytes, zeroed from ``keep`` to its mark
        (``keep=None``: not zeroed; the caller zeroes what it leaves past its length)."""
        capacity = self.min_size if size <= self.min_size else 1 << (size - 1).bit_length()
        buffer = None
        with self._lock:
            free = self._free.get(capacity)
            if free:
                buffer = free.pop()
                self._hits += 1
                self._buffers_held -= 1
                self._bytes_held -= capacity
            else:
                self._misses += 1
            self._in_use += 1
            self._in_use_bytes += capacity
        if buffer is None:
            return _Buffer(capacity)
        if keep is not None:
            if buffer.written > keep:
                zero(buffer.view, keep, buffer.written)
            buffer.written = keep
        return buffer

    def stats(self) -> PoolStats:
        """A consistent snapshot of the counters."""
        with self._lock:
            return PoolStats(
                hits=self._hits,
                misses=self._misses,
                in_use=self._in_use,
                in_use_bytes=self._in_use_bytes,
                buffers_held=self._buffers_held,
                bytes_held=self._bytes_held,
                dropped=self._dropped,
            )

    def clear(self) -> None:
        """Drop every idle buffer (leases in use are unaffected)."""
        with self._lock:
            self._free.clear()
            self._buffers_held = self._bytes_held = 0

    def _give_back(self, buffer: _Buffer, reusable: bool) -> None:
        capacity = len(buffer.data)
        with self._lock:
            self._in_use -= 1
            self._in_use_bytes -= capacity
            if (
                reusable
                and self._buffers_held < self.max_buffers
                and self._bytes_held + capacity <= self.max_bytes
            ):
                self._free.setdefault(capacity, []).append(buffer)
                self._buffers_held += 1
                self._bytes_held += capacity
            else:
                self._dropped += 1

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"<BufferPool min_size={self.min_size} held={s.buffers_held} ({s.bytes_held} B) "
            f"in_use={s.in_use} hits={s.hits} misses={s.misses}>"
        )


_ZEROS = memoryview(bytes(64 * 1024))


def zero(view: memoryview, start: int, end: int) -> None:
    """Zero ``view[start:end]``.

    Assigning through a memoryview copies straight from one shared zero block; assigning to a
    bytearray slice would first copy the source into a new bytearray (an allocation per call).
    """
    while start < end:
        n = min(end - start, len(_ZEROS))
        view[start : start + n] = _ZEROS[:n]
        start += n


_default_pool: BufferPool | None = None
_default_lock = threading.Lock()


def default_pool() -> BufferPool:
    """The process-wide pool used when no pool is given (created on first use)."""
    global _default_pool
    if _default_pool is None:
        with _default_lock:
            if _default_pool is None:
                _default_pool = BufferPool()
    return _default_pool
