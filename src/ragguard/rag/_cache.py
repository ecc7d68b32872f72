"""The embedding stage's fallback: embeddings served from an LRU + TTL cache.

Filled on every successful embedding call, one entry per text (keyed by the text with case and
runs of white space folded), and read when the embedding dependency fails or its breaker is open.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from .._clock import Clock, monotonic

__all__ = ["EmbeddingCache", "normalise_text"]

_WS = re.compile(r"\s+")


def normalise_text(text: str) -> str:
    """The cache key of ``text``: stripped, lower-cased, runs of white space folded to one space."""
    return _WS.sub(" ", text.strip()).lower()


class EmbeddingCache:
    """Rows of embeddings per text, at most ``max_entries``, each kept ``ttl_s`` seconds.

    ``store(texts, result)`` takes a sequence of ``n`` texts and a result with ``n`` rows (a float32
    numpy array of shape (n, dim), or a list of vectors); ``lookup(texts)`` returns a result of the
    same kind built from the cached rows, or None if any text is missing or expired.
    """

    __slots__ = ("_clock", "_entries", "_kind", "hits", "max_entries", "misses", "ttl_s")

    def __init__(self, *, max_entries: int = 10_000, ttl_s: float = 3600.0, clock: Clock = monotonic) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries must be >= 0, got {max_entries}")
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0 seconds, got {ttl_s}")
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self._kind: str | None = None
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def store(self, texts: Sequence[str], result: Any) -> None:
        """Remember row ``i`` of ``result`` for ``texts[i]``; ignores results of the wrong length."""
        if self.max_entries == 0:
            return
        try:
            if len(result) != len(texts):
                return
        except TypeError:
            return
        self._kind = "ndarray" if hasattr(result, "shape") else "list"
        expires = self._clock() + self.ttl_s
        entries = self._entries
        for text, row in zip(texts, result, strict=True):
            key = normalise_text(text)
            entries[key] = (expires, row.copy() if hasattr(row, "copy") else row)
            entries.move_to_end(key)
        while len(entries) > self.max_entries:
            entries.popitem(last=False)

    def lookup(self, texts: Sequence[str]) -> Any | None:
        """The cached result for ``texts`` (every text must be cached and fresh), else None."""
        now = self._clock()
        rows = []
        for text in texts:
            key = normalise_text(text)
            hit = self._entries.get(key)
            if hit is None or hit[0] < now:
                if hit is not None:
                    del self._entries[key]
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            rows.append(hit[1])
        self.hits += 1
        if self._kind == "ndarray":
            import numpy as np

            return np.stack(rows)
        return rows
