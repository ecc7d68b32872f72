"""docs/generation.md's continuation code, run as written: the guarded continuation on a stage of
its own, the chat recipes (Anthropic's prefill, an OpenAI-compatible server's assistant message
and instruction) through the real SDKs against the wire servers, and the reading of a stream's
ending."""

from __future__ import annotations

import re
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import ragguard
from ragguard import GenerationPolicy, Policy, StagePolicy
from wire import AnthropicWire, Fault, OpenAIWire, anthropic_error

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

DOC = Path(__file__).parents[2] / "docs" / "generation.md"
WORDS = ("The", " answer", " is", " in", " the", " third", " passage", " of", " the", " corpus.")
ANSWER = "".join(WORDS)


def _blocks() -> list[str]:
    """The python blocks below the marker of docs/generation.md, in order."""
    text = DOC.read_text(encoding="utf-8")
    marker = "<!-- the blocks below are executed by tests/generation/test_continuation_docs.py -->"
    return re.findall(r"```python\n(.*?)```", text[text.index(marker) :], re.S)


@pytest.fixture(autouse=True)
def _policy(isolated_registry: None) -> None:
    generation = GenerationPolicy(first_item_s=2.0, idle_s=0.3, total_s=30.0)
    ragguard.configure(Policy(stages={"generation": StagePolicy(generation=generation)}))


class Llm:
    """A model's stream of :data:`WORDS` that drops the connection after ``cut`` words; with a
    ``prefill`` it writes what follows it."""

    def __init__(self, cut: int | None = None) -> None:
        self.cut = cut
        self.prefills: list[str] = []

    async def stream(self, prompt: str, prefill: str | None = None) -> AsyncIterator[str]:
        start = 0
        if prefill is not None:
            self.prefills.append(prefill)
            start = next(i for i in range(len(WORDS) + 1) if "".join(WORDS[:i]) == prefill)
        for i, word in enumerate(WORDS[start:]):
            if i == self.cut:
                raise ConnectionResetError("the model dropped the stream")
            yield word


async def test_a_guarded_continuation_on_a_stage_of_its_own() -> None:
    large = Llm()
    namespace: dict[str, Any] = {"llm": Llm(cut=4), "large_llm": large, "prompt": lambda q, p: q}
    exec(compile(_blocks()[0], str(DOC), "exec"), namespace)
    async with ragguard.tenant("acme"):
        stream = namespace["answer"]("why?", ["a passage"])
        text = "".join([t async for t in stream])
        endings = ragguard.stream_endings()
    assert text == ANSWER and large.prefills == ["".join(WORDS[:4])]
    assert (stream.ending.kind, stream.ending.continued_by, stream.ending.continued_after) == (
        "continued",
        "answer_large",
        4,
    )
    assert [e.kind for e in endings] == ["completed", "continued"]  # answer_large's own, then answer's


@pytest.fixture
def wires() -> Iterator[tuple[AnthropicWire, OpenAIWire]]:
    claude, backup = AnthropicWire(tokens=WORDS), OpenAIWire(tokens=WORDS)
    backup.repeat_tokens = 2  # the OpenAI-compatible model restarts two words back: trimmed
    with claude.running(), backup.running():
        yield claude, backup


@pytest.mark.parametrize("claude_continues", [True, False])
async def test_the_chat_recipes_run_as_written(
    wires: tuple[AnthropicWire, OpenAIWire], claude_continues: bool
) -> None:
    claude, backup = wires
    claude.faults.push("messages", Fault(reset=True, after_tokens=4))  # the answer is cut
    if not claude_continues:  # Claude is overloaded now: the next continuation, on the backup
        claude.faults.push("messages", Fault(status=529, body=anthropic_error(529)))
    namespace: dict[str, Any] = {
        "ANTHROPIC_URL": claude.url,
        "OPENAI_URL": f"{backup.url}/v1",
        "API_KEY": "k",
    }
    blocks = _blocks()
    exec(compile(blocks[1], str(DOC), "exec"), namespace)
    # the reading of the ending, as the docs write it, inside a function of the question
    reading = "async def read(question):\n" + textwrap.indent(blocks[2], "    ") + "    return stream, text\n"
    exec(compile(reading, str(DOC), "exec"), namespace)
    try:
        stream, text = await namespace["read"]("why?")
    finally:
        await namespace["claude"].close()
        await namespace["backup"].close()
    assert text == ANSWER  # no word twice, none missing
    by = "on_claude" if claude_continues else "on_backup"
    assert (stream.ending.kind, stream.ending.continued_by) == ("continued", by)
    if claude_continues:
        assert claude.requests[1]["json"]["messages"][-1] == {
            "role": "assistant",
            "content": "The answer is in",
        }
    else:
        sent = backup.requests[0]["json"]["messages"]
        assert [m["role"] for m in sent] == ["user", "assistant", "user"]
        assert sent[1]["content"] == "The answer is in"
