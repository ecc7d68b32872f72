"""The embedding preset's layers: a tap that fills the cache, and the cache as a fallback."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .._args import ArgRef
from ..layers._fallback import FallbackMiss
from ..pipeline import Call
from ._cache import EmbeddingCache

__all__ = ["CacheFallback", "CacheTap", "texts_of"]


def texts_of(ref: ArgRef, call: Call) -> Sequence[str] | None:
    """The texts of ``call`` (a str counts as one text), or None when they are not texts."""
    value = ref.get(call.args, call.kwargs)
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(t, str) for t in value):
        return value
    return None


class CacheTap:
    """Stores every successful embedding call's rows in the stage's cache, one per text."""

    __slots__ = ("cache", "texts")

    def __init__(self, cache: EmbeddingCache, texts: ArgRef) -> None:
        self.cache = cache
        self.texts = texts

    async def around(self, call: Call, proceed: Callable[[], Awaitable[Any]]) -> Any:
        result = await proceed()
        texts = texts_of(self.texts, call)
        if texts is not None:
            self.cache.store(texts, result)
        return result


class CacheFallback:
    """Answers a failed embedding call from the cache when every text is cached and fresh."""

    name = "embedding_cache"
    __slots__ = ("cache", "texts")

    def __init__(self, cache: EmbeddingCache, texts: ArgRef) -> None:
        self.cache = cache
        self.texts = texts

    async def serve(self, call: Call, exc: Exception) -> Any:
        texts = texts_of(self.texts, call)
        hit = None if texts is None else self.cache.lookup(texts)
        if hit is None:
            raise FallbackMiss("not every text is cached")
        return hit
