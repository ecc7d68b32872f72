"""Rerank candidates by WordLlama similarity of the query to each passage's windows.

A passage is cut into windows of a few lines; its score mixes the passage's own cosine with the
best window's (a cheap late-interaction score that, unlike the vector search, rewards a passage
where one part answers the query). Embedding a batch holds a (windows x tokens x 256) float32
tensor; before computing it the reranker checks that size against its memory budget and raises
:class:`RerankOutOfMemoryError` (a real :class:`MemoryError`) when the batch would not fit. The
chaos scenario lowers the budget to make big batches fail, as a GPU reranker does.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ragguard import InvalidInput

from .embedder import Embedder

__all__ = ["RerankOutOfMemoryError", "Reranker", "Scored"]

_BYTES_PER_FLOAT = 4
_WINDOW_LINES = 4


class RerankOutOfMemoryError(MemoryError):
    """The rerank batch needs ``needed_bytes`` but the budget is ``budget_bytes``: out of memory."""

    def __init__(self, needed_bytes: int, budget_bytes: int, batch: int) -> None:
        self.needed_bytes = needed_bytes
        self.budget_bytes = budget_bytes
        self.batch = batch
        super().__init__(
            f"rerank out of memory: batch of {batch} passages needs {needed_bytes / 2**20:.1f} MiB, "
            f"budget {budget_bytes / 2**20:.1f} MiB"
        )


@dataclass(frozen=True, slots=True)
class Scored:
    """A candidate's corpus index ``pid`` and rerank ``score`` (higher is better)."""

    pid: int
    score: float


def _windows(text: str) -> list[str]:
    lines = [ln for ln in text.split("\n") if ln.strip()]
    if not lines:
        return [text]
    return ["\n".join(lines[i : i + _WINDOW_LINES]) for i in range(0, len(lines), _WINDOW_LINES)]


class Reranker:
    """Scores (query, passages) pairs. ``memory_budget_bytes`` (> 0) may be changed at run time
    with :meth:`set_budget` (the chaos scenario does). Thread-safe; CPU-bound.

    The batch tensor is (windows, longest window in tokens, 256) float32; passages' token ids are
    cached (the corpus is fixed), the tensor is built per call.
    """

    def __init__(
        self, embedder: Embedder, *, memory_budget_bytes: int = 64 * 2**20, cache_size: int = 50_000
    ) -> None:
        self._embedder = embedder
        self._lock = threading.Lock()
        self._ids: dict[str, list[npt.NDArray[np.int64]]] = {}
        self._cache_size = cache_size
        self._budget = 0
        self.set_budget(memory_budget_bytes)

    @property
    def budget_bytes(self) -> int:
        return self._budget

    def set_budget(self, memory_budget_bytes: int) -> None:
        """Set the per-batch memory budget in bytes (> 0); raises InvalidInput otherwise."""
        if isinstance(memory_budget_bytes, bool) or not isinstance(memory_budget_bytes, int) \
                or memory_budget_bytes <= 0:
            raise InvalidInput(f"memory_budget_bytes must be a positive int, got {memory_budget_bytes!r}")
        self._budget = memory_budget_bytes

    def warm(self, texts: Sequence[str]) -> None:
        """Tokenize ``texts`` ahead of time (the corpus), so calls only tokenize the query."""
        self._window_ids(list(texts))

    def _window_ids(self, texts: list[str]) -> list[list[npt.NDArray[np.int64]]]:
        known = self._ids
        fresh: dict[str, list[npt.NDArray[np.int64]]] = {}
        missing = [t for t in dict.fromkeys(texts) if t not in known]
        if missing:
            windows = [_windows(t) for t in missing]
            flat = self._embedder.token_ids([w for ws in windows for w in ws])
            at = 0
            for text, ws in zip(missing, windows, strict=True):
                fresh[text] = flat[at : at + len(ws)]
                at += len(ws)
            with self._lock:
                if len(known) + len(fresh) <= self._cache_size:
                    known.update(fresh)
        return [fresh[t] if t in fresh else known[t] for t in texts]

    def batch_bytes(self, texts: Sequence[str]) -> int:
        """Bytes of the (windows, tokens, dim) float32 tensor a batch of ``texts`` needs."""
        ids = [w for ws in self._window_ids(list(texts)) for w in ws]
        longest = max((len(w) for w in ids), default=0)
        return len(ids) * longest * self._embedder.dim * _BYTES_PER_FLOAT

    def rerank(self, query: str, pids: Sequence[int], texts: Sequence[str], top_k: int) -> list[Scored]:
        """Return the ``top_k`` best of the candidates (``pids[i]`` has text ``texts[i]``), best
        first. Raises RerankOutOfMemoryError when the batch exceeds the budget, InvalidInput on
        mismatched inputs."""
        if len(pids) != len(texts):
            raise InvalidInput(f"rerank: {len(pids)} pids for {len(texts)} texts")
        if top_k < 1:
            raise InvalidInput(f"rerank: top_k must be >= 1, got {top_k}")
        if not texts:
            return []
        per_text = self._window_ids(list(texts))
        owners = np.asarray([i for i, ws in enumerate(per_text) for _ in ws], dtype=np.int64)
        windows = [w for ws in per_text for w in ws]
        longest = max(1, max(len(w) for w in windows))
        needed = len(windows) * longest * self._embedder.dim * _BYTES_PER_FLOAT
        budget = self._budget
        if needed > budget:
            raise RerankOutOfMemoryError(needed, budget, len(texts))
        padded = np.zeros((len(windows), longest), dtype=np.int64)
        mask = np.zeros((len(windows), longest), dtype=np.float32)
        for row, w in enumerate(windows):
            padded[row, : len(w)] = w
            mask[row, : len(w)] = 1.0
        tokens = self._embedder.token_vectors[padded]  # the batch tensor: (windows, longest, dim)
        sums = np.einsum("wtd,wt->wd", tokens, mask)
        del tokens
        counts = np.maximum(mask.sum(axis=1), 1.0)
        q = self._embedder.embed([query])[0]
        window_vecs = _normalise(sums / counts[:, None])
        passage_sums = np.zeros((len(texts), sums.shape[1]), dtype=np.float32)
        np.add.at(passage_sums, owners, sums)
        whole = _normalise(passage_sums) @ q
        best = np.full(len(texts), -1.0, dtype=np.float32)
        np.maximum.at(best, owners, window_vecs @ q)
        scores = 0.5 * whole + 0.5 * best
        order = np.argsort(-scores, kind="stable")[:top_k]
        return [Scored(pid=int(pids[i]), score=float(scores[i])) for i in order]


def _normalise(m: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    out: npt.NDArray[np.float32] = (m / np.maximum(norms, 1e-12)).astype(np.float32)
    return out
