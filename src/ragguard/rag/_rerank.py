"""The rerank preset's layers: chunked rerank under a batch limit that learns, and skip rerank.

A reranker on a GPU runs out of memory on a batch too big for it. On an out-of-memory error the
batch limit halves (down to a floor) and *every* candidate is still scored, in chunks of the
allowed size, the results merged by score: a pointwise reranker (each candidate scored on its own,
as cross-encoders are) gives the same order as one big batch. Only an out-of-memory error at the
floor says the reranker is unwell: that one counts against the breaker, and the request falls back
(the user's fallback, then skip rerank: the candidates in retrieval order).

The limit grows back slowly, additive increase after multiplicative decrease (AIMD, as TCP's
congestion control): by a quarter after ``grow_after`` successes at the limit or ``grow_after_s``
seconds of the stage's clock, so an out-of-memory error does not recur every few requests.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .._args import MISSING, ArgRef
from .._clock import Clock
from .._context import current_tenant, mark_degraded
from .._errors import BreakerOpen, ConfigError
from ..breakers import is_out_of_memory
from ..events import EventBus, FallbackServed, bus
from ..layers._fallback import FallbackMiss
from ..pipeline import Call

__all__ = ["BatchLimiter", "ChunkedRerank", "SkipRerank", "score_of"]

log = logging.getLogger("ragguard.rag")

CHUNKED = "chunked_rerank"


class BatchLimiter:
    """The largest batch the reranker of one stage is trusted with.

    ``limit`` is None until the first out-of-memory error; ``floor`` (>= 1) is the smallest batch
    tried. ``grow_after`` successes at the limit, or ``grow_after_s`` seconds of ``clock`` since
    the last change with at least one success, raise the limit by a quarter (at least one).
    """

    __slots__ = ("_changed_at", "_clock", "_streak", "floor", "grow_after", "grow_after_s", "limit")

    def __init__(
        self, *, floor: int = 4, grow_after: int = 20, grow_after_s: float = 30.0, clock: Clock
    ) -> None:
        if isinstance(floor, bool) or not isinstance(floor, int) or floor < 1:
            raise ConfigError(f"floor must be an int >= 1, got {floor!r:.40}")
        if isinstance(grow_after, bool) or not isinstance(grow_after, int) or grow_after < 1:
            raise ConfigError(f"grow_after must be an int >= 1, got {grow_after!r:.40}")
        if not grow_after_s > 0:
            raise ConfigError(f"grow_after_s must be > 0 seconds, got {grow_after_s!r:.40}")
        self.floor = floor
        self.grow_after = grow_after
        self.grow_after_s = float(grow_after_s)
        self._clock = clock
        self.limit: int | None = None
        self._streak = 0
        self._changed_at = 0.0

    def allowed(self, n: int) -> int:
        """How many of ``n`` candidates go to the reranker in one batch now."""
        limit = self.limit
        return n if limit is None or n <= limit else limit

    def shrink(self, tried: int) -> int | None:
        """After an OOM on a batch of ``tried``: the next batch size (half, never below the
        floor), or None when ``tried`` was already at or below the floor."""
        nxt = max(tried // 2, self.floor)
        self.limit = nxt if self.limit is None else min(self.limit, nxt)
        self._streak = 0
        self._changed_at = self._clock()
        return nxt if nxt < tried else None

    def succeeded(self, tried: int) -> None:
        """After a success on a batch of ``tried``: grow the limit when it has held long enough."""
        limit = self.limit
        if limit is None or tried < limit:
            return
        self._streak += 1
        now = self._clock()
        if self._streak >= self.grow_after or now - self._changed_at >= self.grow_after_s:
            self.limit = limit + max(1, limit // 4)
            self._streak = 0
            self._changed_at = now


def score_of(item: Any) -> float:
    """The default score of a reranked item: its ``score`` attribute, or its ``"score"`` key."""
    score = getattr(item, "score", MISSING)
    if score is MISSING:
        score = item["score"]
    return float(score)


class ChunkedRerank:
    """Scores every candidate in chunks the stage's :class:`BatchLimiter` allows (see the module
    docstring). ``candidates`` says where the candidate list is; ``score(item)`` reads a reranked
    item's score for the merge."""

    __slots__ = ("_bus", "_warned", "candidates", "limiter", "score", "stage")

    def __init__(
        self,
        stage: str,
        limiter: BatchLimiter,
        candidates: ArgRef,
        score: Callable[[Any], float],
        event_bus: EventBus = bus,
    ) -> None:
        self.stage = stage
        self._bus = event_bus
        self.limiter = limiter
        self.candidates = candidates
        self.score = score
        self._warned = False

    async def around(self, call: Call, proceed: Callable[[], Awaitable[Any]]) -> Any:
        candidates = self.candidates.get(call.args, call.kwargs)
        if not isinstance(candidates, (list, tuple)) or not candidates:
            return await proceed()
        limiter = self.limiter
        n = len(candidates)
        size = limiter.allowed(n)
        original = call.args, call.kwargs
        done: list[tuple[int, Any]] = []  # (chunk length, the reranker's answer)
        start = 0
        try:
            while start < n:
                part = candidates[start : start + size]
                if size < n:
                    call.args, call.kwargs = self.candidates.replace(*original, part)
                call.recoverable = is_out_of_memory if len(part) > limiter.floor else None
                try:
                    answer = await proceed()
                except Exception as exc:
                    if isinstance(exc, BreakerOpen) or not is_out_of_memory(exc):
                        raise
                    smaller = limiter.shrink(len(part))
                    if smaller is None:
                        raise
                    size = smaller  # the chunks already scored stay; the rest go smaller
                    continue
                limiter.succeeded(len(part))
                done.append((len(part), answer))
                start += len(part)
        finally:
            call.args, call.kwargs = original
            call.recoverable = None
        if len(done) == 1:
            return done[0][1]
        mark_degraded(CHUNKED)
        if self._bus.active:
            self._bus.emit(FallbackServed(self.stage, CHUNKED, current_tenant(), "MemoryError"))
        return self._merge(done)

    def _merge(self, done: Sequence[tuple[int, Any]]) -> list[Any]:
        items = [item for _, answer in done for item in answer]
        try:
            merged = sorted(items, key=self.score, reverse=True)
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "rerank stage %r: cannot read a score to merge chunked results (%s: %s); pass "
                    "@guard(..., score=fn). Chunks are returned in order, unmerged.",
                    self.stage,
                    type(exc).__name__,
                    exc,
                )
            merged = items
        if all(len(answer) == size for size, answer in done):
            return merged
        return merged[: max(len(answer) for _, answer in done)]  # the reranker keeps a top k


class SkipRerank:
    """The last fallback of a rerank stage: the candidates in retrieval order, unreranked."""

    name = "skip_rerank"
    __slots__ = ("candidates",)

    def __init__(self, candidates: ArgRef) -> None:
        self.candidates = candidates

    async def serve(self, call: Call, exc: Exception) -> Any:
        candidates = self.candidates.get(call.args, call.kwargs)
        if not isinstance(candidates, (list, tuple)):
            raise FallbackMiss("no candidate list to return")
        return list(candidates)
