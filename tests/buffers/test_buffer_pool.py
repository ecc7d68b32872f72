"""BufferPool: size classes, exact views, release semantics, limits, stats, threads."""

from __future__ import annotations

import asyncio
import pickle
import threading

import pytest

from ragguard import ConfigError, InvalidInput
from ragguard.buffers import BufferPool, DoubleRelease

pytestmark = pytest.mark.timeout(30)


def test_size_classes_are_powers_of_two_from_min_size() -> None:
    pool = BufferPool(min_size=1024)
    assert [pool.size_class(n) for n in (0, 1, 1024, 1025, 2048, 3000, 70_000)] == [
        1024,
        1024,
        1024,
        2048,
        2048,
        4096,
        131072,
    ]


@pytest.mark.parametrize("size", [0, 1, 1023, 1024, 1025, 5000])
def test_lease_view_has_exactly_the_requested_length(size: int) -> None:
    pool = BufferPool()
    with pool.lease(size) as view:
        assert len(view) == size
        assert not view.readonly
        view[:] = b"\x07" * size
    assert pool.stats().in_use == 0


def test_second_lease_of_same_class_is_a_hit_and_reuses_the_buffer() -> None:
    pool = BufferPool()
    with pool.lease(1500) as view:
        first = view.obj
    with pool.lease(1800) as view:
        assert view.obj is first
    s = pool.stats()
    assert (s.hits, s.misses, s.buffers_held, s.bytes_held) == (1, 1, 1, 2048)


def test_reused_buffer_never_shows_old_bytes_past_the_requested_length() -> None:
    pool = BufferPool()
    with pool.lease(2000) as view:
        view[:] = b"\xaa" * 2000
    with pool.lease(100) as view:
        underlying = view.obj
        assert isinstance(underlying, bytearray)
        assert underlying[100:] == bytes(len(underlying) - 100)


def test_zeroed_lease_clears_the_requested_bytes_too() -> None:
    pool = BufferPool()
    with pool.lease(500) as view:
        view[:] = b"\x01" * 500
    with pool.lease(300, zeroed=True) as view:
        assert bytes(view) == bytes(300)


def test_double_release_raises() -> None:
    pool = BufferPool()
    lease = pool.lease(10)
    lease.release()
    with pytest.raises(DoubleRelease):
        lease.release()
    with pytest.raises(DoubleRelease):
        _ = lease.view
    assert pool.stats().in_use == 0


def test_view_is_unusable_after_release() -> None:
    pool = BufferPool()
    with pool.lease(10) as view:
        pass
    with pytest.raises(ValueError):
        view[0] = 1


def test_lease_is_released_on_error() -> None:
    pool = BufferPool()
    with pytest.raises(KeyError), pool.lease(64):
        raise KeyError("boom")
    assert pool.stats().in_use == 0
    assert pool.stats().buffers_held == 1


@pytest.mark.anyio
async def test_lease_is_released_on_cancellation() -> None:
    pool = BufferPool()
    entered = asyncio.Event()

    async def holder() -> None:
        with pool.lease(4096):
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(holder())
    await asyncio.wait_for(entered.wait(), 5)
    assert pool.stats().in_use == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pool.stats().in_use == 0


def test_buffer_still_exported_is_not_reused() -> None:
    pool = BufferPool()
    lease = pool.lease(100)
    escaped = pickle.PickleBuffer(lease.view)  # holds a buffer export the pool cannot revoke
    old = lease.view.obj
    lease.release()
    assert pool.stats().buffers_held == 0
    assert pool.stats().dropped == 1
    with pool.lease(100) as view:
        assert view.obj is not old
    escaped.release()


def test_limits_on_buffers_and_bytes_held() -> None:
    pool = BufferPool(max_buffers=2, max_bytes=1 << 20)
    leases = [pool.lease(1000) for _ in range(3)]
    for lease in leases:
        lease.release()
    assert pool.stats().buffers_held == 2
    assert pool.stats().dropped == 1

    small = BufferPool(max_bytes=3000)
    leases = [small.lease(1000) for _ in range(4)]
    for lease in leases:
        lease.release()
    assert small.stats().bytes_held == 2048


def test_stats_count_in_use_bytes() -> None:
    pool = BufferPool()
    a, b = pool.lease(10), pool.lease(3000)
    assert (pool.stats().in_use, pool.stats().in_use_bytes) == (2, 1024 + 4096)
    a.release()
    b.release()
    assert (pool.stats().in_use, pool.stats().in_use_bytes) == (0, 0)


@pytest.mark.parametrize(
    "kwargs", [{"min_size": 1000}, {"min_size": 8}, {"max_buffers": -1}, {"max_bytes": -5}]
)
def test_bad_options_raise_config_error(kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        BufferPool(**kwargs)


@pytest.mark.parametrize("size", [-1, 1.5, "10", True])
def test_bad_lease_size_raises_invalid_input(size: object) -> None:
    with pytest.raises(InvalidInput):
        BufferPool().lease(size)  # type: ignore[arg-type]


def test_threads_never_share_a_buffer() -> None:
    pool = BufferPool(max_buffers=8)
    errors: list[str] = []
    barrier = threading.Barrier(4)

    def worker(tag: int) -> None:
        barrier.wait(timeout=5)
        pattern = bytes([tag]) * 1500
        for _ in range(2000):
            with pool.lease(1500) as view:
                view[:] = pattern
                if bytes(view) != pattern:
                    errors.append(f"thread {tag} saw another thread's bytes")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not errors
    s = pool.stats()
    assert s.in_use == 0
    assert s.hits + s.misses == 8000
    assert s.misses <= 8 + s.dropped


def test_leases_beyond_the_limits_get_one_off_buffers() -> None:
    pool = BufferPool(max_buffers=1)
    first, second = pool.lease(100), pool.lease(100)
    assert (pool.stats().in_use, pool.stats().in_use_bytes) == (2, 2048)
    second.release()  # a one-off buffer: dropped, the pool keeps at most one buffer
    first.release()
    s = pool.stats()
    assert (s.buffers_held, s.dropped, s.misses, s.in_use) == (1, 1, 2, 0)
    with pool.lease(10):
        assert pool.stats().hits == 1
    pool.clear()
    assert (pool.stats().buffers_held, pool.stats().bytes_held, pool.stats().hits) == (0, 0, 1)
