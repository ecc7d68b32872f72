"""Chunked rerank: every candidate scored in chunks the learnt limit allows, merged by score."""

from __future__ import annotations

from typing import Any

import pytest
from layer_helpers import make_call

from ragguard import BreakerOpen, FakeClock, degraded
from ragguard._args import ArgRef
from ragguard.breakers import is_out_of_memory
from ragguard.pipeline import Call
from ragguard.rag._rerank import BatchLimiter, ChunkedRerank

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


async def rerank(query: str, candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:  # pragma: no cover
    raise AssertionError


class Reranker:
    """A fake ``proceed``: scores the call's candidates (score = the doc number), running out of
    memory above ``fits`` candidates; records each batch and the call's ``recoverable``."""

    def __init__(
        self, call: Call, fits: int, top_k: int | None = None, error: Exception | None = None
    ) -> None:
        self.call = call
        self.fits = fits
        self.top_k = top_k
        self.error = error
        self.batches: list[int] = []
        self.recoverable: list[Any] = []

    async def __call__(self) -> list[dict[str, Any]]:
        docs = self.call.args[1]
        self.batches.append(len(docs))
        self.recoverable.append(self.call.recoverable)
        if self.error is not None:
            raise self.error
        if len(docs) > self.fits:
            raise MemoryError(f"{len(docs)} do not fit")
        scored = sorted(
            ({"doc": d["doc"], "score": float(d["doc"])} for d in docs),
            key=lambda d: d["score"],
            reverse=True,
        )
        return scored if self.top_k is None else scored[: self.top_k]


def _docs(n: int) -> list[dict[str, Any]]:
    return [{"doc": i} for i in range(n)]


def _layer(floor: int = 2) -> ChunkedRerank:
    limiter = BatchLimiter(floor=floor, clock=FakeClock())
    return ChunkedRerank("rerank", limiter, ArgRef.resolve(rerank, 1, "candidates"), lambda d: d["score"])


async def test_a_batch_that_fits_is_one_call_untouched() -> None:
    layer = _layer()
    docs = _docs(6)
    call = make_call("q", docs)
    reranker = Reranker(call, fits=10)
    got = await layer.around(call, reranker)
    assert reranker.batches == [6] and [d["doc"] for d in got] == [5, 4, 3, 2, 1, 0]
    assert call.args[1] is docs and degraded() == ()


async def test_out_of_memory_scores_every_candidate_in_chunks_and_merges_by_score() -> None:
    layer = _layer(floor=2)
    docs = _docs(20)
    call = make_call("q", docs)
    reranker = Reranker(call, fits=5)
    got = await layer.around(call, reranker)
    assert reranker.batches == [20, 10, 5, 5, 5, 5]  # halved until it fit, then every chunk
    assert [d["doc"] for d in got] == list(range(19, -1, -1))  # the same order as one big batch
    assert call.args == ("q", docs) and call.recoverable is None  # restored for the layers outside
    assert degraded() == ("chunked_rerank",)
    # chunks above the floor let the breaker give its permit back for an OOM: the chunker recovers
    assert all(r is is_out_of_memory for r in reranker.recoverable)
    second = make_call("q", _docs(20))
    again = Reranker(second, fits=5)
    await layer.around(second, again)
    assert again.batches == [5, 5, 5, 5]  # the learnt limit holds


async def test_an_out_of_memory_error_at_the_floor_is_raised_and_counted() -> None:
    layer = _layer(floor=4)
    call = make_call("q", _docs(8))
    reranker = Reranker(call, fits=2)
    with pytest.raises(MemoryError):
        await layer.around(call, reranker)
    assert reranker.batches == [8, 4]
    assert reranker.recoverable == [is_out_of_memory, None]  # at the floor the breaker counts it
    assert call.args[1] == _docs(8) and call.recoverable is None


@pytest.mark.parametrize("error", [BreakerOpen("rerank", 5.0), ConnectionResetError("gone")])
async def test_other_errors_pass_through_without_shrinking(error: Exception) -> None:
    layer = _layer()
    call = make_call("q", _docs(8))
    reranker = Reranker(call, fits=100, error=error)
    with pytest.raises(type(error)):
        await layer.around(call, reranker)
    assert reranker.batches == [8] and layer.limiter.limit is None


async def test_a_reranker_that_keeps_a_top_k_still_returns_a_top_k() -> None:
    layer = _layer(floor=2)
    call = make_call("q", _docs(12))
    got = await layer.around(call, Reranker(call, fits=6, top_k=3))
    assert [d["doc"] for d in got] == [11, 10, 9]


async def test_no_candidate_list_is_one_plain_call() -> None:
    layer = _layer()
    call = make_call("q", [])
    reranker = Reranker(call, fits=0)
    assert await layer.around(call, reranker) == []
    assert reranker.batches == [0]
