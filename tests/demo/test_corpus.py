"""The corpus split and the labelled questions."""

from __future__ import annotations

import pydoc_data.topics

import pytest

from ragguard import InvalidInput
from ragguard_tools.demo.corpus import Passage, Question, is_hit, load_passages, load_questions, recall_at_k


def test_passages_cover_every_topic_within_the_size_bound(demo_passages: list[Passage]) -> None:
    assert [p.pid for p in demo_passages] == list(range(len(demo_passages)))
    assert all(len(p.text) <= 900 for p in demo_passages)
    labelled = {t for p in demo_passages for t in p.topics}
    assert labelled == set(pydoc_data.topics.topics)
    assert len({p.text for p in demo_passages}) == len(demo_passages), "passages must be unique"


def test_a_section_shared_by_two_topics_is_one_passage_with_both_labels(demo_passages: list[Passage]) -> None:
    shared = [p for p in demo_passages if "if" in p.topics]
    assert shared and all("compound" in p.topics for p in shared)


def test_split_is_deterministic_and_honours_max_chars() -> None:
    small = load_passages(max_chars=300)
    assert small == load_passages(max_chars=300)
    assert max(len(p.text) for p in small) <= 300
    assert len(small) > len(load_passages())


@pytest.mark.parametrize(
    "kwargs", [{"max_chars": 10}, {"min_chars": -1}, {"max_chars": 300, "min_chars": 300}]
)
def test_bad_split_options_raise(kwargs: dict[str, int]) -> None:
    with pytest.raises(InvalidInput):
        load_passages(**kwargs)


def test_at_least_40_distinct_labelled_questions() -> None:
    questions = load_questions()
    assert len(questions) >= 40
    assert len({q.text for q in questions}) == len(questions)
    assert all(q.topics and set(q.topics) <= set(pydoc_data.topics.topics) for q in questions)


def test_recall_at_k_counts_questions_with_a_labelled_passage_in_the_top_k() -> None:
    a = Passage(0, ("with",), "t", "x")
    b = Passage(1, ("try",), "t", "y")
    qs = [Question("q1", ("with",)), Question("q2", ("try", "raise"))]
    assert recall_at_k([[a, b], [a, b]], qs, k=2) == 1.0
    assert recall_at_k([[a, b], [a, b]], qs, k=1) == 0.5
    assert recall_at_k([[b], [a]], qs) == 0.0
    assert is_hit([b], qs[1]) and not is_hit([a], qs[1])
    with pytest.raises(InvalidInput):
        recall_at_k([[a]], qs)
    with pytest.raises(InvalidInput):
        recall_at_k([[a], [b]], qs, k=0)
