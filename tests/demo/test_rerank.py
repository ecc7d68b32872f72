"""The reranker's scoring and its memory budget."""

from __future__ import annotations

import pytest

from ragguard import InvalidInput
from ragguard_tools.demo.corpus import Passage, load_questions
from ragguard_tools.demo.embedder import Embedder
from ragguard_tools.demo.rerank import Reranker, RerankOutOfMemoryError


def _candidates(passages: list[Passage], topics: tuple[str, ...], n: int) -> list[Passage]:
    wanted = [p for p in passages if set(topics) & set(p.topics)][:2]
    others = [p for p in passages if not set(topics) & set(p.topics)][: n - len(wanted)]
    return others + wanted  # the answers last, so the reranker has to move them up


def test_rerank_moves_the_answer_to_the_top(demo_reranker: Reranker, demo_passages: list[Passage]) -> None:
    question = next(q for q in load_questions() if "try" in q.topics)
    cands = _candidates(demo_passages, question.topics, 12)
    top = demo_reranker.rerank(question.text, [p.pid for p in cands], [p.text for p in cands], 3)
    assert len(top) == 3
    assert [s.score for s in top] == sorted((s.score for s in top), reverse=True)
    assert set(question.topics) & set(demo_passages[top[0].pid].topics)


def test_a_batch_over_the_budget_is_out_of_memory(
    demo_reranker: Reranker, demo_passages: list[Passage]
) -> None:
    cands = demo_passages[:20]
    texts = [p.text for p in cands]
    needed = demo_reranker.batch_bytes(texts)
    assert needed > demo_reranker.batch_bytes(texts[:4])
    demo_reranker.set_budget(needed - 1)
    with pytest.raises(MemoryError, match="out of memory") as info:
        demo_reranker.rerank("q", [p.pid for p in cands], texts, 5)
    assert isinstance(info.value, RerankOutOfMemoryError)
    assert info.value.needed_bytes == needed and info.value.batch == 20
    # A smaller batch fits the same budget.
    assert len(demo_reranker.rerank("q", [p.pid for p in cands[:4]], texts[:4], 2)) == 2
    demo_reranker.set_budget(needed)
    assert len(demo_reranker.rerank("q", [p.pid for p in cands], texts, 5)) == 5


def test_the_rerank_breaker_classifies_it_as_out_of_memory() -> None:
    breakers = pytest.importorskip("ragguard.breakers")
    is_out_of_memory = getattr(breakers, "is_out_of_memory", None)
    if is_out_of_memory is None:
        pytest.skip("ragguard.breakers.is_out_of_memory not there yet")
    assert is_out_of_memory(RerankOutOfMemoryError(10, 5, 3))


def test_bad_inputs_raise(demo_embedder: Embedder) -> None:
    reranker = Reranker(demo_embedder)
    with pytest.raises(InvalidInput):
        reranker.set_budget(0)
    with pytest.raises(InvalidInput):
        Reranker(demo_embedder, memory_budget_bytes=-5)
    with pytest.raises(InvalidInput):
        reranker.rerank("q", [1, 2], ["a"], 1)
    with pytest.raises(InvalidInput):
        reranker.rerank("q", [1], ["a"], 0)
    assert reranker.rerank("q", [], [], 3) == []
