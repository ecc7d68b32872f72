"""The embedding cache and the rerank batch limit on their own (pure logic, fake clock)."""

from __future__ import annotations

import numpy as np
import pytest

import ragguard
from ragguard.rag._cache import EmbeddingCache, normalise_text
from ragguard.rag._rerank import BatchLimiter


def test_keys_fold_case_and_white_space() -> None:
    assert normalise_text("  Hello\t\n  WORLD ") == "hello world"
    assert normalise_text("a  b") == normalise_text("A B")


def test_lru_eviction_and_refresh_on_lookup() -> None:
    clock = ragguard.FakeClock()
    cache = EmbeddingCache(max_entries=2, ttl_s=100, clock=clock)
    cache.store(["a"], np.array([[1.0, 0.0]]))
    cache.store(["b"], np.array([[2.0, 0.0]]))
    assert cache.lookup(["a"]) is not None  # a is now the most recent
    cache.store(["c"], np.array([[3.0, 0.0]]))
    assert cache.lookup(["b"]) is None  # b was the least recently used
    got = cache.lookup(["c", "a"])
    assert got.shape == (2, 2)
    np.testing.assert_array_equal(got, [[3.0, 0.0], [1.0, 0.0]])
    assert len(cache) == 2


def test_ttl_with_a_fake_clock() -> None:
    clock = ragguard.FakeClock()
    cache = EmbeddingCache(max_entries=10, ttl_s=5, clock=clock)
    cache.store(["a", "b"], [[1.0], [2.0]])
    clock.advance(5)
    assert cache.lookup(["a"]) == [[1.0]]
    clock.advance(0.001)
    assert cache.lookup(["a"]) is None
    assert len(cache) == 1  # the expired entry was dropped on the way


def test_stored_rows_are_copies() -> None:
    cache = EmbeddingCache(max_entries=10, ttl_s=5, clock=ragguard.FakeClock())
    result = np.ones((2, 3), dtype=np.float32)
    cache.store(["a", "b"], result)
    result[:] = 0
    assert cache.lookup(["a", "b"]).sum() == 6


def test_results_of_the_wrong_length_are_ignored() -> None:
    cache = EmbeddingCache(max_entries=10, ttl_s=5, clock=ragguard.FakeClock())
    cache.store(["a"], np.ones(4))  # a single vector for one text: shape (4,), not (1, 4)
    cache.store(["a", "b"], None)
    assert len(cache) == 0


@pytest.mark.parametrize(("kwargs", "word"), [({"max_entries": -1}, "max_entries"), ({"ttl_s": 0}, "ttl_s")])
def test_bad_cache_options(kwargs: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        EmbeddingCache(**kwargs)


def test_limit_halves_to_the_floor_then_gives_up() -> None:
    s = BatchLimiter(floor=4, clock=ragguard.FakeClock())
    assert s.allowed(32) == 32
    assert s.shrink(32) == 16
    assert s.shrink(16) == 8
    assert s.shrink(8) == 4
    assert s.shrink(4) is None
    assert s.allowed(32) == 4
    assert s.shrink(6) == 4  # half of 6 is under the floor: try the floor itself
    assert BatchLimiter(floor=4, clock=ragguard.FakeClock()).shrink(3) is None  # already below the floor


def test_limit_grows_back_by_a_quarter_only_after_a_run_of_successes() -> None:
    clock = ragguard.FakeClock()
    s = BatchLimiter(floor=2, grow_after=3, grow_after_s=60.0, clock=clock)
    s.shrink(40)
    assert s.limit == 20
    s.succeeded(20)
    s.succeeded(20)
    assert s.limit == 20  # two successes are not a run of three
    s.succeeded(5)  # a small batch says nothing about the limit
    assert s.limit == 20
    s.succeeded(20)
    assert s.limit == 25  # a quarter more
    s.shrink(80)  # an old, larger attempt failing must not raise the limit
    assert s.limit == 25
    s.shrink(25)
    assert s.limit == 12


def test_limit_grows_back_after_a_quiet_time_with_a_success() -> None:
    clock = ragguard.FakeClock()
    s = BatchLimiter(floor=2, grow_after=100, grow_after_s=30.0, clock=clock)
    s.shrink(16)
    clock.advance(29.0)
    s.succeeded(8)
    assert s.limit == 8
    clock.advance(1.0)
    s.succeeded(8)
    assert s.limit == 10  # 30 s since the limit last changed, with a success at it
    s.succeeded(10)
    assert s.limit == 10  # the clock starts over from the change


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [({"floor": 0}, "floor"), ({"floor": True}, "floor"), ({"grow_after": 0}, "grow_after"),
     ({"grow_after_s": 0}, "grow_after_s")],
)
def test_bad_limiter_options(kwargs: dict, word: str) -> None:
    with pytest.raises(ragguard.ConfigError, match=word):
        BatchLimiter(clock=ragguard.FakeClock(), **kwargs)
