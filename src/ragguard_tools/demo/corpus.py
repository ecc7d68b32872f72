"""The demo's corpus and its labelled questions.

The corpus is the Python language reference that ships with CPython (:mod:`pydoc_data.topics`,
about 80 topics). Each topic is cut into sections at its headings, each section into passages of
at most ``max_chars`` characters at paragraph boundaries. Several topics repeat the same section
(``compound`` holds the ``if`` statement, ``specialnames`` holds ``customization``...), so equal
passages are merged and keep every topic they came from as labels.

The questions (``questions.json`` next to this module) are about the Python language; each names
the topics that answer it. ``recall@k`` here is the share of questions for which at least one of
the top ``k`` passages carries one of the question's topics.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources

from ragguard import InvalidInput

__all__ = [
    "Passage",
    "Question",
    "load_passages",
    "load_questions",
    "recall_at_k",
]

# A heading is a line followed by a line of only "*" (topic title) or "=" / "-" (section).
_HEADING = re.compile(r"^(?P<title>[^\n]+)\n(?P<rule>[*=\-~^]{3,})[ \t]*$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Passage:
    """One retrievable passage: ``pid`` is its index in the corpus, ``topics`` its labels."""

    pid: int
    topics: tuple[str, ...]
    title: str
    text: str


@dataclass(frozen=True, slots=True)
class Question:
    """A labelled question: any passage carrying one of ``topics`` answers it."""

    text: str
    topics: tuple[str, ...]


def _sections(topic_text: str) -> Iterable[tuple[str, str]]:
    """Yield (heading, body) pairs of one topic's text."""
    matches = list(_HEADING.finditer(topic_text))
    if not matches:
        yield "", topic_text
        return
    head = topic_text[: matches[0].start()]
    if head.strip():
        yield "", head
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(topic_text)
        yield m.group("title").strip(), topic_text[m.end() : end]


def _chunks(body: str, max_chars: int) -> Iterable[str]:
    """Cut ``body`` at blank lines into pieces of at most ``max_chars`` (a longer paragraph is cut
    at line ends, a longer line at ``max_chars``)."""
    current: list[str] = []
    size = 0
    for para in re.split(r"\n\s*\n", body):
        para = para.strip("\n")
        if not para.strip():
            continue
        for piece in _split_long(para, max_chars):
            if current and size + len(piece) + 2 > max_chars:
                yield "\n\n".join(current)
                current, size = [], 0
            current.append(piece)
            size += len(piece) + 2
    if current:
        yield "\n\n".join(current)


def _split_long(para: str, max_chars: int) -> Iterable[str]:
    if len(para) <= max_chars:
        yield para
        return
    line_buf: list[str] = []
    size = 0
    for line in para.split("\n"):
        while len(line) > max_chars:
            yield line[:max_chars]
            line = line[max_chars:]
        if line_buf and size + len(line) + 1 > max_chars:
            yield "\n".join(line_buf)
            line_buf, size = [], 0
        line_buf.append(line)
        size += len(line) + 1
    if line_buf:
        yield "\n".join(line_buf)


def load_passages(*, max_chars: int = 900, min_chars: int = 40) -> list[Passage]:
    """Split :mod:`pydoc_data.topics` into passages (deterministic order, pids 0..n-1).

    ``max_chars`` (>= 200) bounds a passage's length; passages shorter than ``min_chars`` (>= 0)
    are dropped. Raises :class:`~ragguard.InvalidInput` for out-of-range values.
    """
    if max_chars < 200:
        raise InvalidInput(f"load_passages: max_chars must be >= 200, got {max_chars}")
    if min_chars < 0 or min_chars >= max_chars:
        raise InvalidInput(f"load_passages: min_chars must be in [0, max_chars), got {min_chars}")
    from pydoc_data.topics import topics

    order: list[str] = []
    labels: dict[str, list[str]] = {}
    titles: dict[str, str] = {}
    for topic in sorted(topics):
        for title, body in _sections(topics[topic]):
            for chunk in _chunks(body, max_chars):
                text = chunk.strip()
                if len(text) < min_chars:
                    continue
                if text not in labels:
                    order.append(text)
                    labels[text] = []
                    titles[text] = title or topic
                if topic not in labels[text]:
                    labels[text].append(topic)
    return [
        Passage(pid=i, topics=tuple(labels[t]), title=titles[t], text=t) for i, t in enumerate(order)
    ]


def load_questions() -> list[Question]:
    """The labelled questions shipped with the demo (``questions.json``), in file order.

    Raises :class:`~ragguard.InvalidInput` when the file names a topic that is not in
    :mod:`pydoc_data.topics` or a question has no topic.
    """
    from pydoc_data.topics import topics

    raw = json.loads(resources.files(__package__).joinpath("questions.json").read_text("utf-8"))
    out: list[Question] = []
    for i, item in enumerate(raw["questions"]):
        names = tuple(item["topics"])
        if not names:
            raise InvalidInput(f"questions.json: question {i} has no topic")
        unknown = [t for t in names if t not in topics]
        if unknown:
            raise InvalidInput(f"questions.json: question {i} names unknown topics {unknown}")
        out.append(Question(text=str(item["q"]), topics=names))
    return out


def recall_at_k(
    retrieved: Sequence[Sequence[Passage]], questions: Sequence[Question], k: int = 5
) -> float:
    """Share (0..1) of questions whose top ``k`` retrieved passages include one labelled with a
    topic of the question. ``retrieved[i]`` answers ``questions[i]``; lengths must match."""
    if len(retrieved) != len(questions):
        raise InvalidInput(
            f"recall_at_k: {len(retrieved)} result lists for {len(questions)} questions"
        )
    if k < 1:
        raise InvalidInput(f"recall_at_k: k must be >= 1, got {k}")
    if not questions:
        return 0.0
    hits = sum(1 for got, q in zip(retrieved, questions, strict=True) if is_hit(got[:k], q))
    return hits / len(questions)


def is_hit(passages: Iterable[Passage], question: Question) -> bool:
    """True when one of ``passages`` carries a topic of ``question``."""
    wanted = set(question.topics)
    return any(wanted.intersection(p.topics) for p in passages)
