"""The trim of what a continuation repeats (``ragguard.rag.Overlap``), held to its promises by
Hypothesis: what it drops is always a repeat of the text before (a suffix of it that begins a
word), however the continuation is cut into pieces; a continuation that restarts some words back
joins without a duplicate or a gap; it holds back at most ``max_chars`` characters; and a
continuation that repeats nothing passes whole."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragguard import ConfigError
from ragguard.rag import Overlap


def pieces_of(text: str, cuts: list[int]) -> list[str]:
    """``text`` cut at the positions ``cuts`` (any ints, folded into range)."""
    points = sorted({c % (len(text) + 1) for c in cuts}) if text else []
    out, last = [], 0
    for p in points:
        out.append(text[last:p])
        last = p
    out.append(text[last:])
    return out


def trimmed(before: str, pieces: list[str], max_chars: int = 512) -> tuple[str, int]:
    """What the trim hands over of ``pieces`` (joined), and the most text it ever held back."""
    trim = Overlap(before, max_chars=max_chars)
    out, held, fed = [], 0, 0
    for piece in pieces:
        got = trim.feed(piece)
        fed += len(piece)
        out.append(got)
        held = max(held, fed - sum(map(len, out)) - trim.trimmed)
    out.append(trim.flush())
    return "".join(out), held


TEXT = st.text(alphabet=st.sampled_from("ab .,\n"), max_size=60)


@settings(max_examples=300, deadline=None)
@given(before=TEXT, after=TEXT, cuts=st.lists(st.integers(0, 100), max_size=6))
def test_what_is_dropped_is_a_repeat_that_begins_a_word(before: str, after: str, cuts: list[int]) -> None:
    got, _ = trimmed(before, pieces_of(after, cuts))
    assert after.endswith(got)  # only a prefix of the continuation is ever dropped
    dropped = after[: len(after) - len(got)]
    assert before.endswith(dropped)  # and it is a repeat of the text before
    if dropped:
        i = len(before) - len(dropped)
        assert i == 0 or not (before[i - 1].isalnum() and before[i].isalnum())  # not mid-word


@settings(max_examples=300, deadline=None)
@given(before=TEXT, after=TEXT, cuts=st.lists(st.integers(0, 100), max_size=6))
def test_the_result_does_not_depend_on_how_the_continuation_is_cut(
    before: str, after: str, cuts: list[int]
) -> None:
    assert trimmed(before, pieces_of(after, cuts))[0] == trimmed(before, [after])[0]


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(2, 40),
    cut=st.integers(1, 39),
    back=st.integers(0, 6),
    mid=st.booleans(),
    cuts=st.lists(st.integers(0, 400), max_size=8),
)
def test_a_restart_some_words_back_joins_without_a_duplicate_or_a_gap(
    n: int, cut: int, back: int, mid: bool, cuts: list[int]
) -> None:
    words = [f" word{i}" for i in range(n)]  # distinct words: the repeat is unambiguous
    answer = "".join(words)
    cut = min(cut, n - 1)
    before = "".join(words[:cut])
    if mid:  # the stream was cut in the middle of a word
        before += words[cut][:3]
    start = len("".join(words[: max(0, cut - back)]))
    after = answer[start:]  # the continuation starts `back` words before the cut
    got, held = trimmed(before, pieces_of(after, cuts))
    assert before + got == answer
    assert held <= 512


@settings(max_examples=200, deadline=None)
@given(before=st.text(max_size=80), after=st.text(max_size=80), limit=st.integers(0, 20))
def test_it_holds_back_at_most_max_chars(before: str, after: str, limit: int) -> None:
    trim = Overlap(before, max_chars=limit)
    handed = 0
    for fed, ch in enumerate(after, 1):
        handed += len(trim.feed(ch))
        assert fed - handed - trim.trimmed <= limit  # held back, not yet handed over
    handed += len(trim.flush())
    assert trim.done and handed == len(after) - trim.trimmed
    assert trim.trimmed <= limit  # never more than `limit` characters dropped


def test_the_cases_a_model_produces() -> None:
    assert trimmed("The capital of France is Pari", ["Paris."])[0] == "s."  # resumed mid-word
    assert trimmed("It is ", [" Paris"])[0] == "Paris"  # a prefill stripped of its space
    assert trimmed("It is", [" Paris"])[0] == " Paris"  # nothing repeated
    assert trimmed("One. Two. Three", [" Three", " and four"])[0] == " and four"
    assert trimmed("abc", ["bcd"])[0] == "bcd"  # "bc" begins no word of "abc": not a repeat
    assert trimmed("", ["anything"])[0] == "anything"
    assert trimmed("done.", [])[0] == ""
    assert trimmed("w1 w2", ["w1 w2"])[0] == ""  # the whole answer again: all of it a repeat


def test_max_chars_is_checked() -> None:
    with pytest.raises(ConfigError, match="max_chars"):
        Overlap("x", max_chars=-1)
