"""The embedding preset's layers: the tap that fills the cache, the cache as a fallback."""

from __future__ import annotations

import numpy as np
import pytest
from layer_helpers import Script, make_call

from ragguard import FakeClock
from ragguard._args import ArgRef
from ragguard.layers._fallback import FallbackMiss
from ragguard.rag._cache import EmbeddingCache
from ragguard.rag._embedding import CacheFallback, CacheTap

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


async def embed(texts: list[str], *, model: str = "m") -> np.ndarray:  # pragma: no cover - a signature
    raise AssertionError


def _texts(which: int | str = 0) -> ArgRef:
    return ArgRef.resolve(embed, which, "texts")


async def test_the_tap_stores_one_row_per_text_on_success_only() -> None:
    clock = FakeClock()
    cache = EmbeddingCache(max_entries=10, ttl_s=60, clock=clock)
    tap = CacheTap(cache, _texts())
    rows = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    assert await tap.around(make_call(["Hello  World", "b"]), Script(rows)) is rows
    assert len(cache) == 2
    with pytest.raises(ConnectionError):
        await tap.around(make_call(["c"]), Script(ConnectionError("down")))
    assert len(cache) == 2  # a failure stores nothing
    assert await tap.around(make_call(42), Script("not texts")) == "not texts"  # not texts: left alone
    assert len(cache) == 2


async def test_the_fallback_serves_only_when_every_text_is_cached_and_fresh() -> None:
    clock = FakeClock()
    cache = EmbeddingCache(max_entries=10, ttl_s=60, clock=clock)
    cache.store(["hello world", "b"], np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32))
    fallback = CacheFallback(cache, _texts("texts"))
    hit = await fallback.serve(make_call(texts=["  HELLO world ", "b"]), ConnectionError())
    assert hit.shape == (2, 2) and hit[0][0] == 1.0  # found by keyword, key folded
    with pytest.raises(FallbackMiss):
        await fallback.serve(make_call(["hello world", "unknown"]), ConnectionError())
    with pytest.raises(FallbackMiss):
        await fallback.serve(make_call(3), ConnectionError())  # no texts at all
    clock.advance(61)
    with pytest.raises(FallbackMiss):
        await fallback.serve(make_call(["b"]), ConnectionError())  # expired on the clock
    assert fallback.name == "embedding_cache"


async def test_a_single_text_is_one_text() -> None:
    cache = EmbeddingCache(clock=FakeClock())
    tap = CacheTap(cache, _texts())
    await tap.around(make_call("only"), Script([[0.5]]))
    assert await CacheFallback(cache, _texts()).serve(make_call("only"), ConnectionError()) == [[0.5]]
