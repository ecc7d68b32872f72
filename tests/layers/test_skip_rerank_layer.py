"""skip_rerank, a rerank stage's last fallback: the candidates in retrieval order."""

from __future__ import annotations

import pytest
from layer_helpers import make_call

from ragguard._args import ArgRef
from ragguard.layers._fallback import FallbackMiss
from ragguard.rag._rerank import SkipRerank

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


async def rerank(query: str, candidates: list[str], *, top_k: int = 5) -> list[str]:  # pragma: no cover
    raise AssertionError


async def test_it_returns_a_copy_of_the_candidates_in_retrieval_order() -> None:
    skip = SkipRerank(ArgRef.resolve(rerank, "candidates", "candidates"))
    candidates = ("c3", "c1", "c2")
    got = await skip.serve(make_call("q", candidates), MemoryError())
    assert got == ["c3", "c1", "c2"] and isinstance(got, list)
    assert await skip.serve(make_call("q", candidates=["x"]), MemoryError()) == ["x"]
    assert skip.name == "skip_rerank"


async def test_without_a_candidate_list_it_misses() -> None:
    skip = SkipRerank(ArgRef.resolve(rerank, 1, "candidates"))
    with pytest.raises(FallbackMiss):
        await skip.serve(make_call("q"), MemoryError())
    with pytest.raises(FallbackMiss):
        await skip.serve(make_call("q", "not a list"), MemoryError())
