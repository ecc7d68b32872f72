"""The rerank stage's fallback: a smaller batch, then no rerank at all.

On an out-of-memory error the reranker is called again on the first half of the candidates (the
rest keep their retrieval order behind them), halving down to a floor; the largest batch that
worked is remembered and grows back by one candidate per success, additive increase and
multiplicative decrease (AIMD, as TCP congestion control). Below the floor, or while the breaker is
open, rerank is skipped and the hits come back in retrieval order.
"""

from __future__ import annotations

__all__ = ["BatchShrinker"]


class BatchShrinker:
    """The batch-size limit of one rerank stage.

    ``limit`` is None until the first out-of-memory error; ``floor`` is the smallest batch tried
    (>= 1).
    """

    __slots__ = ("floor", "limit")

    def __init__(self, *, floor: int = 4) -> None:
        if floor < 1:
            raise ValueError(f"floor must be >= 1, got {floor}")
        self.floor = floor
        self.limit: int | None = None

    def allowed(self, n: int) -> int:
        """How many of ``n`` candidates to send to the reranker now."""
        return n if self.limit is None or n <= self.limit else self.limit

    def shrink(self, tried: int) -> int | None:
        """After an OOM on ``tried`` candidates: the next batch size (half, but never below the
        floor), or None when ``tried`` was already at or below the floor."""
        nxt = max(tried // 2, self.floor)
        self.limit = nxt if self.limit is None else min(self.limit, nxt)
        return nxt if nxt < tried else None

    def succeeded(self, tried: int) -> None:
        """After a success on ``tried`` candidates: grow the limit back by one (additive increase)."""
        if self.limit is not None and tried >= self.limit:
            self.limit += 1
