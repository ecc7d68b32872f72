"""A thread-safe pool of reusable byte buffers, leased as exact-length memoryviews.

Buffers come in size classes: powers of two from ``min_size`` (1024, 2048, 4096, ...). A lease of
``n`` bytes takes an idle buffer of the smallest class that fits ``n`` (a hit) or allocates one (a
miss), and hands out a ``memoryview`` of exactly ``n`` bytes. On release the buffer goes back to
its class's free list unless the pool already holds ``max_buffers`` idle buffers or ``max_bytes``
idle bytes; then it is dropped for the garbage collector.

A reused buffer never shows an earlier payload past the requested length: each buffer remembers
how far it has been written (its high-water mark; every byte past it is zero) and only the bytes
between the new length and that mark are zeroed when it is leased again, never the whole buffer.
Bytes inside the requested length may still hold an earlier payload (the caller is about to
overwrite them); pass ``zeroed=True`` to clear them too.

Leasing and releasing take no lock: each size class keeps its idle buffers in a
``collections.deque`` whose ``pop``/``append`` are atomic, and a buffer's counters are changed
only by the thread that holds it. The lock guards the slow paths (allocation, dropping,
``clear``, ``stats``). ``max_buffers``/``max_bytes`` therefore bound every buffer the pool owns,
idle or leased: a lease beyond them gets a one-off buffer that is dropped on release.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from types import TracebackType

from .. import _validate as v
from .._errors import ConfigError, InvalidInput

__all__ = ["BufferPool", "DoubleRelease", "Lease", "OwnedLease", "PoolStats", "default_pool"]

_MAX_SHIFT = 62  # no lease above 2**62 bytes (bytearray could not allocate it anyway)


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
    __slots__ = ("data", "free", "hits", "pool", "view", "written")

    def __init__(self, pool: BufferPool, capacity: int) -> None:
        self.pool = pool
        self.free: deque[_Buffer] | None = None  # its class's free list; None: one-off buffer
        self.data = bytearray(capacity)
        self.view = memoryview(self.data)  # leases slice this; never released, never exported
        self.written = 0  # high-water mark: bytes past it are known to be zero
        self.hits = 0  # leases served after the first; changed only by the holder


class Lease:
    """One buffer on loan: ``view`` is a writable memoryview of exactly ``size`` bytes.

    Use as a context manager (``with pool.lease(n) as view:``) or call :meth:`release` once.
    The view, and every view derived from it, is valid only until release; the view itself
    is released then, so a stray use of it raises ValueError instead of reading another
    lease's bytes. A second :meth:`release` raises :class:`DoubleRelease`.
    """

    __slots__ = ("_buffer", "_view", "size")

    def __init__(self, buffer: _Buffer, view: memoryview) -> None:
        # The buffer's high-water mark is already at most len(view): the holder writes only
        # through the view, so nothing past it can change while it is leased.
        self._buffer: _Buffer | None = buffer
        self._view: memoryview | None = view
        self.size = len(view)

    @property
    def view(self) -> memoryview:
        """The leased bytes; raises DoubleRelease after release."""
        view = self._view
        if view is None:
            raise DoubleRelease("this lease was already released")
        return view

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
        _give_back(buffer, _release_view(view))

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
        buffer, view = self._buffer, self._view
        if buffer is not None and view is not None:  # released inside the block: nothing to do
            self._buffer = self._view = None
            try:  # _release_view and _give_back inlined: two Python frames less per lease
                view.release()
            except BufferError:
                buffer.pool._retire(buffer)
            else:
                free = buffer.free
                if free is not None:
                    free.append(buffer)
                else:
                    buffer.pool._retire(buffer)

    def __repr__(self) -> str:
        state = "released" if self._buffer is None else f"capacity={len(self._buffer.data)}"
        return f"<Lease size={self.size} {state}>"


class OwnedLease(Lease):
    """A lease of a buffer of its own, not the pool's (a message too small to be worth a pooled
    buffer: allocating its few bytes costs less than a pool's bookkeeping). The same contract as
    :class:`Lease`: the view is valid until release, a second release raises DoubleRelease;
    nothing goes back to a pool. The buffer is the view's ``obj``: only ``_view`` is set, so
    taking and releasing one costs a store each."""

    __slots__ = ()

    @staticmethod
    def of(data: bytearray, view: memoryview) -> OwnedLease:
        """A lease of ``view``, a view of ``data`` (the buffer this lease owns)."""
        if view.obj is not data:
            raise InvalidInput("OwnedLease.of: view must be a view of data")
        lease: OwnedLease = _new_object(OwnedLease)
        lease._view = view
        lease.size = len(view)
        return lease

    @property
    def capacity(self) -> int:
        view = self._view
        if view is None:
            raise DoubleRelease("this lease was already released")
        return len(view.obj)  # type: ignore[arg-type]

    @property
    def released(self) -> bool:
        return self._view is None

    def release(self) -> None:
        view = self._view
        if view is None:
            raise DoubleRelease("this lease was already released")
        self._view = None
        _release_view(view)  # still exported elsewhere: its buffer is simply not ours to reuse

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        view = self._view
        if view is not None:
            self._view = None
            try:
                view.release()
            except BufferError:
                pass

    def __repr__(self) -> str:
        state = "released" if self._view is None else "own buffer"
        return f"<OwnedLease size={self.size} {state}>"


_new_object = object.__new__


def _release_view(view: memoryview) -> bool:
    """Release a lease's view; False when something still exports it (e.g. a PickleBuffer of
    it): the buffer could be written through that later, so it must never serve another lease."""
    try:
        view.release()
    except BufferError:
        return False
    return True


def _give_back(buffer: _Buffer, reusable: bool = True) -> None:
    """Return a buffer taken with ``BufferPool._take`` (its high-water mark must cover every
    byte written into it): onto its free list, or dropped when one-off or not ``reusable``."""
    free = buffer.free
    if reusable and free is not None:
        free.append(buffer)
    else:
        buffer.pool._retire(buffer)


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
        v.size("min_size", min_size, low=16)
        if min_size & (min_size - 1):
            rule = "min_size must be a power of two >= 16"
            raise ConfigError(f"{rule}, got {v.shown(min_size)}", field="min_size")
        v.count("max_buffers", max_buffers, 0)
        v.size("max_bytes", max_bytes, low=0)
        self.min_size = min_size
        self.max_buffers = max_buffers
        self.max_bytes = max_bytes
        min_shift = min_size.bit_length() - 1
        smallest: deque[_Buffer] = deque()
        # Indexed by (size - 1).bit_length(): the free list of capacity max(min_size, 2**index).
        self._free = [smallest] * (min_shift + 1) + [deque() for _ in range(min_shift + 1, _MAX_SHIFT + 1)]
        self._lock = threading.Lock()
        self._owned: set[_Buffer] = set()  # pooled buffers, idle or leased
        self._owned_bytes = 0
        self._misses = self._dropped = self._retired_hits = 0
        self._one_off = self._one_off_bytes = 0  # one-off buffers in use

    def size_class(self, size: int) -> int:
        """The capacity in bytes of the buffer that serves a lease of ``size`` bytes."""
        if size <= self.min_size:
            return self.min_size
        return 1 << (size - 1).bit_length()

    def lease(self, size: int, *, zeroed: bool = False) -> Lease:
        """Lease ``size`` bytes (an int from 0 to 2**62); ``zeroed=True`` clears them first.

        Raises :class:`~ragguard.InvalidInput` for a negative, too large or non-int size.
        """
        if type(size) is not int or not 0 <= size <= 1 << _MAX_SHIFT:
            raise InvalidInput(f"BufferPool.lease: size must be an int in [0, 2**62], got {size!r}")
        buffer = self._take(size)
        if zeroed and buffer.written:
            zero(buffer.view, 0, buffer.written)
        buffer.written = size
        return Lease(buffer, buffer.view[:size])

    def _take(self, size: int) -> _Buffer:
        """An idle or new buffer of at least ``size`` bytes (0 <= size <= 2**62) with every
        byte past ``size`` zero; its high-water mark stays where earlier payloads end (at most
        ``size``), and the caller moves it to cover what it lets the holder write."""
        free = self._free[(size - 1).bit_length()]
        try:
            buffer = free.pop()
        except IndexError:
            return self._new_buffer(size, free)
        buffer.hits += 1
        if buffer.written > size:
            zero(buffer.view, size, buffer.written)
            buffer.written = size
        return buffer

    def _new_buffer(self, size: int, free: deque[_Buffer]) -> _Buffer:
        capacity = self.size_class(size)
        buffer = _Buffer(self, capacity)
        with self._lock:
            self._misses += 1
            if len(self._owned) < self.max_buffers and self._owned_bytes + capacity <= self.max_bytes:
                buffer.free = free
                self._owned.add(buffer)
                self._owned_bytes += capacity
            else:
                self._one_off += 1
                self._one_off_bytes += capacity
        return buffer

    def _retire(self, buffer: _Buffer) -> None:
        """Drop a returned buffer: one-off, or its view is still exported."""
        capacity = len(buffer.data)
        with self._lock:
            self._dropped += 1
            if buffer.free is None:
                self._one_off -= 1
                self._one_off_bytes -= capacity
            else:
                buffer.free = None
                self._owned.discard(buffer)
                self._owned_bytes -= capacity
                self._retired_hits += buffer.hits

    def stats(self) -> PoolStats:
        """A snapshot of the counters: exact while no lease is taken or released meanwhile,
        otherwise each figure is from some moment during the call."""
        with self._lock:
            held = held_bytes = 0
            for capacity, free in self._free_lists():
                n = len(free)
                held += n
                held_bytes += n * capacity
            hits = self._retired_hits + sum(b.hits for b in self._owned)
            return PoolStats(
                hits=hits,
                misses=self._misses,
                in_use=len(self._owned) - held + self._one_off,
                in_use_bytes=self._owned_bytes - held_bytes + self._one_off_bytes,
                buffers_held=held,
                bytes_held=held_bytes,
                dropped=self._dropped,
            )

    def clear(self) -> None:
        """Drop every idle buffer (leases in use are unaffected)."""
        with self._lock:
            for capacity, free in self._free_lists():
                while True:
                    try:
                        buffer = free.pop()
                    except IndexError:
                        break
                    buffer.free = None
                    self._owned.discard(buffer)
                    self._owned_bytes -= capacity
                    self._retired_hits += buffer.hits

    def _free_lists(self) -> list[tuple[int, deque[_Buffer]]]:
        min_shift = self.min_size.bit_length() - 1
        return [(1 << shift, self._free[shift]) for shift in range(min_shift, len(self._free))]

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
