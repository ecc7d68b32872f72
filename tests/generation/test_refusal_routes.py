"""Fallbacks chosen by what the provider said: a context-length refusal of the small model answered
by the large one (``on_context_length=``), or by the same model with fewer passages (the
generation preset's ``passages=``), a content-policy refusal by its own route, and a fallback
that asks for the error it replaces. Through the real openai SDK against the OpenAI wire server
of tests/wire (which refuses, as OpenAI, vLLM and TGI do, a request longer than its model's
window), for calls and for streams, and through the ASGI front door."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import aclosing
from itertools import pairwise
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

import ragguard
from ragguard import (
    BreakerPolicy,
    ConfigError,
    FakeClock,
    GenerationPolicy,
    Guard,
    Policy,
    RetryPolicy,
    StagePolicy,
    TenantQuota,
)
from ragguard.asgi import RagguardMiddleware, primed
from ragguard.breakers import BreakerState
from ragguard.events import FallbackServed, StreamSettled
from ragguard.outcomes import CONTEXT_LENGTH, classify, context_overflow
from wire import CONTENT_BLOCKED, AnthropicWire, Fault, OpenAIWire, openai_error, serving

pytestmark = pytest.mark.anyio

PASSAGES = [f"passage {i:02d}: " + "lorem ipsum " * 6 for i in range(12)]  # 20 tokens each
SMALL, LARGE = 160, 10_000  # the small model's window fits 7 passages and the question


def _policy(min_attempt_s: float = 0.0, **generation: Any) -> Policy:
    """``generation`` (small model) and ``generation_large``, both on the generation preset, with
    a generic breaker that any counted failure would trip, and three attempts each."""
    stage = StagePolicy(
        preset="generation",
        min_attempt_s=min_attempt_s,
        generation=GenerationPolicy(first_item_s=None, idle_s=None, total_s=None, **generation),
        breaker=BreakerPolicy(kind="generic", minimum_calls=2, window_size=2),
        retry=RetryPolicy(attempts=3, jitter_s=0),
    )
    return Policy(stages={"generation": stage, "generation_large": stage})


def _prompt(question: str, passages: list[str]) -> list[dict[str, str]]:
    return [{"role": "user", "content": "\n".join([*passages, question])}]


def _passages_sent(wire: OpenAIWire) -> list[tuple[str, int]]:
    """(model, passages in its prompt) of each chat request the wire server saw."""
    return [
        (r["json"]["model"], r["json"]["messages"][0]["content"].count("passage "))
        for r in wire.requests
        if r["route"] == "chat"
    ]


class Answers:
    """The guarded answer functions of one Guard over the wire server at ``url`` (a client per
    call, so that a front door's own loop may run them): ``large`` and
    ``large_stream`` (stage ``generation_large``), then ``small`` and ``small_stream`` (stage
    ``generation``) with the ``@guard`` options :meth:`small_ones` gives them."""

    def __init__(self, g: Guard, url: str) -> None:
        self.g = g
        self.url = f"{url}/v1"

        @g.guard("generation_large")
        async def large(question: str, passages: list[str]) -> str:
            return await self.whole("large", question, passages)

        @g.guard("generation_large")
        async def large_stream(question: str, passages: list[str]) -> AsyncIterator[str]:
            async for text in self.streamed("large", question, passages):
                yield text

        self.large, self.large_stream = large, large_stream
        self.small_ones()

    def small_ones(self, stream: dict[str, Any] | None = None, **call: Any) -> Answers:
        """(Re)decorate ``small`` with ``call`` options and ``small_stream`` with ``stream`` ones
        (default: the same)."""

        @self.g.guard("generation", **call)
        async def small(question: str, passages: list[str]) -> str:
            return await self.whole("small", question, passages)

        @self.g.guard("generation", **(call if stream is None else stream))
        async def small_stream(question: str, passages: list[str]) -> AsyncIterator[str]:
            async for text in self.streamed("small", question, passages):
                yield text

        self.small, self.small_stream = small, small_stream
        return self

    async def ask(self, shape: str) -> tuple[str, tuple[str, ...]]:
        """``small`` (``shape`` "call") or ``small_stream`` ("stream") asked about :data:`PASSAGES`
        under a deadline: its answer and what :func:`ragguard.degraded` named."""
        async with self.g.deadline(5.0):
            if shape == "call":
                said = await self.small("why?", PASSAGES)
            else:
                said = await _joined(self.small_stream("why?", PASSAGES))
            return said, ragguard.degraded()

    def to_large(self) -> Answers:
        """``small`` routes a context-length refusal to ``large``, ``small_stream`` to ``large_stream``."""
        return self.small_ones(
            on_context_length=self.large, stream={"on_context_length": self.large_stream}
        )

    async def whole(self, model: str, question: str, passages: list[str]) -> str:
        async with openai.AsyncOpenAI(base_url=self.url, api_key="k", max_retries=0) as client:
            reply = await client.chat.completions.create(
                model=model, messages=_prompt(question, passages), max_tokens=8  # type: ignore[arg-type]
            )
        return f"{model}: {reply.choices[0].message.content}"

    async def streamed(self, model: str, question: str, passages: list[str]) -> AsyncIterator[str]:
        async with openai.AsyncOpenAI(base_url=self.url, api_key="k", max_retries=0) as client:
            stream = await client.chat.completions.create(
                model=model, messages=_prompt(question, passages), max_tokens=8, stream=True  # type: ignore[arg-type]
            )
            first = True
            async for chunk in stream:
                text = chunk.choices[0].delta.content if chunk.choices else None
                if text:
                    yield f"{model}: {text}" if first else text
                    first = False


async def _joined(items: AsyncIterator[str]) -> str:
    return "".join([text async for text in items])


# -- the large model -------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["openai", "vllm", "tgi"])
@pytest.mark.parametrize("shape", ["call", "stream"])
async def test_a_context_length_refusal_of_the_small_model_is_answered_by_the_large_one(
    dialect: str, shape: str
) -> None:
    g = Guard(_policy())
    wire = OpenAIWire(context_limits={"small": SMALL, "large": LARGE}, dialect=dialect)  # type: ignore[arg-type]
    with wire.running() as url:
        said, served = await Answers(g, url).to_large().ask(shape)
    assert said == "large: Hello from the wire"
    name = "large" if shape == "call" else "large_stream"
    assert served == (name,)
    # one refused request (never retried), then the large model with every passage
    assert _passages_sent(wire) == [("small", 12), ("large", 12)]
    assert g.breaker("generation").state is BreakerState.CLOSED


async def test_without_a_route_a_context_length_refusal_reaches_the_caller_and_no_fallback() -> None:
    g = Guard(_policy())
    wire = OpenAIWire(context_limits={"small": SMALL})
    served: list[str] = []

    def extractive(question: str, passages: list[str]) -> str:
        served.append(question)
        return passages[0]

    with wire.running() as url:
        answers = Answers(g, url).small_ones(fallback=extractive)
        with pytest.raises(openai.BadRequestError) as info:
            await answers.small("why?", PASSAGES)
        assert await answers.small("why?", PASSAGES[:2]) == "small: Hello from the wire"
    assert classify(info.value).reason == CONTEXT_LENGTH
    assert served == []  # a caller's error: the stage's fallback never served it
    assert _passages_sent(wire) == [("small", 12), ("small", 2)]


async def test_a_fallback_that_declares_error_receives_the_refusal_and_a_plain_one_does_not() -> None:
    g = Guard(_policy())
    wire = OpenAIWire(context_limits={"small": SMALL, "large": LARGE})
    received: list[Any] = []

    async def fitted(question: str, passages: list[str], *, error: BaseException) -> str:
        limit, asked = context_overflow(error) or (0, 0)
        received.append((type(error), limit, asked))
        return f"{len(passages)} passages, {limit} < {asked}"

    async def plain(question: str, passages: list[str]) -> str:
        received.append("plain")
        return "plain"

    with wire.running() as url:
        answers = Answers(g, url).small_ones(on_context_length=fitted)
        said = await answers.small("why?", PASSAGES)
        answers.small_ones(on_context_length=plain)
        assert await answers.small("why?", PASSAGES) == "plain"
    assert said.startswith("12 passages, 160 < ")
    assert received[0][:2] == (openai.BadRequestError, 160) and received[0][2] > 160
    assert received[1] == "plain"


async def test_a_content_policy_refusal_goes_to_its_own_route_and_not_to_the_context_one() -> None:
    g = Guard(_policy())
    wire = OpenAIWire()
    blocked = openai_error(400, code="content_filter", message="filtered by the content management policy")

    def safe(question: str, passages: list[str]) -> str:
        return "I cannot answer that."

    def larger(question: str, passages: list[str]) -> str:
        raise AssertionError("a content-policy refusal reached the context-length route")

    with wire.running() as url:
        answers = Answers(g, url).small_ones(on_context_length=larger, on_content_policy=[safe])
        wire.faults.push("chat", Fault(status=400, body=blocked))
        said = await answers.small("why?", PASSAGES)
        wire.faults.push("chat", Fault(status=400, body=blocked))
        streamed = await _joined(answers.small_stream("why?", PASSAGES))
    assert said == "I cannot answer that." == streamed
    assert wire.faults.seen["chat"] == 2


def test_routes_are_checked_at_decoration() -> None:
    with pytest.raises(ConfigError, match="on_context_length"):
        ragguard.guard("generation", on_context_length=42)

    async def wants(question: str, *, error: BaseException) -> str:
        return ""

    with pytest.raises(ConfigError, match="error"):

        @ragguard.guard("generation", on_content_policy=wants)
        async def clash(question: str, error: str = "") -> str:
            return question


# -- fewer passages ------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["openai", "vllm", "tgi"])
@pytest.mark.parametrize("shape", ["call", "stream"])
async def test_the_shrink_answers_with_the_same_model_and_fewer_passages(dialect: str, shape: str) -> None:
    g = Guard(_policy())
    wire = OpenAIWire(context_limits={"small": SMALL}, dialect=dialect)  # type: ignore[arg-type]
    with wire.running() as url:
        said, served = await Answers(g, url).small_ones(passages="passages").ask(shape)
    assert said == "small: Hello from the wire"
    sent = _passages_sent(wire)
    assert [model for model, _ in sent] == ["small"] * len(sent)
    counts = [n for _, n in sent]
    assert counts[0] == 12 and counts == sorted(counts, reverse=True) and 2 <= len(counts) <= 3, counts
    assert served == tuple(f"shrink: {a} -> {b} passages" for a, b in pairwise(counts))
    assert g.breaker("generation").state is BreakerState.CLOSED


async def test_the_shrink_drops_the_lowest_ranked_down_to_min_passages() -> None:
    g = Guard(_policy(max_shrinks=2, min_passages=1))
    wire = OpenAIWire(context_limits={"small": 30})  # even one passage and the question do not fit
    with wire.running() as url:
        answers = Answers(g, url).small_ones(passages="passages")
        with pytest.raises(openai.BadRequestError):
            await answers.small("why?", PASSAGES)
    # the figures the refusal stated say one passage at most can fit: one shrink, to the floor
    sent = [r["json"]["messages"][0]["content"] for r in wire.requests]
    assert [prompt.count("passage ") for prompt in sent] == [12, 1]
    assert sent[1] == f"{PASSAGES[0]}\nwhy?"  # the best passage kept


async def test_a_refusal_stating_no_figures_drops_a_third_at_most_max_shrinks_times() -> None:
    g = Guard(_policy(max_shrinks=2))
    wire = OpenAIWire()
    too_long = openai_error(400, code="context_length_exceeded", message="Please reduce the length.")
    wire.faults.push("chat", Fault(status=400, body=too_long), times=3)
    with wire.running() as url:
        answers = Answers(g, url).small_ones(passages="passages")
        async with g.deadline(5.0):
            with pytest.raises(openai.BadRequestError):
                await answers.small("why?", PASSAGES)
            served = ragguard.degraded()
    sent = [r["json"]["messages"][0]["content"] for r in wire.requests]
    assert [prompt.count("passage ") for prompt in sent] == [12, 8, 6]  # the call and max_shrinks more
    for prompt in sent[1:]:  # the best passages kept, in their order
        assert prompt.startswith("\n".join(PASSAGES[: prompt.count("passage ")]))
    assert served == ("shrink: 12 -> 8 passages", "shrink: 8 -> 6 passages")


async def test_when_the_shrink_cannot_fit_the_route_serves_with_every_passage() -> None:
    g = Guard(_policy(max_shrinks=1, min_passages=10))
    wire = OpenAIWire(context_limits={"small": SMALL, "large": LARGE})
    with wire.running() as url:
        answers = Answers(g, url)
        answers.small_ones(passages="passages", on_context_length=answers.large)
        async with g.deadline(5.0):
            said = await answers.small("why?", PASSAGES)
            served = ragguard.degraded()
    assert said == "large: Hello from the wire"
    assert _passages_sent(wire) == [("small", 12), ("small", 10), ("large", 12)]
    assert served == ("shrink: 12 -> 10 passages", "large")


async def test_no_shrink_once_the_deadline_cannot_fit_another_attempt() -> None:
    clock = FakeClock()
    g = Guard(_policy(min_attempt_s=0.5), clock=clock)
    wire = OpenAIWire(context_limits={"small": SMALL})
    with wire.running() as url:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as client:

            @g.guard("generation", passages="passages")
            async def slow(question: str, passages: list[str]) -> str:
                clock.advance(0.7)  # a refusal that took most of the budget
                messages = _prompt(question, passages)
                return (await client.chat.completions.create(model="small", messages=messages)).id  # type: ignore[arg-type]

            async with g.deadline(1.0):
                with pytest.raises(openai.BadRequestError):
                    await slow("why?", PASSAGES)
            async with g.deadline(5.0):  # with time left, the same call shrinks and is answered
                assert await slow("why?", PASSAGES)
    counts = [n for _, n in _passages_sent(wire)]
    assert counts[:2] == [12, 12] and len(counts) == 3 and counts[2] < 12  # no shrink, then one


def test_passages_name_a_parameter_and_need_the_generation_preset() -> None:
    with pytest.raises(ConfigError, match="passages"):

        @ragguard.guard("generation", passages="documents")
        async def answer(question: str, passages: list[str]) -> str:
            return question

    with pytest.raises(ConfigError, match="preset"):

        @ragguard.guard("llm", passages="passages")
        async def plain(question: str, passages: list[str]) -> str:
            return question


# -- through the front door -----------------------------------------------------------------------


def _door(g: Guard, answers: Answers) -> FastAPI:
    app = FastAPI()
    app.add_middleware(RagguardMiddleware, guard=g)

    @app.get("/answer")
    async def answer(n: int = 12) -> dict[str, Any]:
        return {"said": await answers.small("why?", PASSAGES[:n]), "degraded": list(ragguard.degraded())}

    @app.get("/stream")
    async def stream(n: int = 12) -> StreamingResponse:
        items = await primed(answers.small_stream("why?", PASSAGES[:n]))

        async def body() -> AsyncIterator[str]:
            async with aclosing(items):
                async for text in items:
                    yield text

        return StreamingResponse(body(), media_type="text/plain")

    return app


@pytest.mark.parametrize("how", ["large", "shrink", "none"])
async def test_through_the_asgi_door_for_a_call_and_a_stream(how: str) -> None:
    g = Guard(_policy())
    wire = OpenAIWire(context_limits={"small": SMALL, "large": LARGE})
    with wire.running() as url:
        answers = Answers(g, url)
        if how == "large":
            answers.to_large()
        elif how == "shrink":
            answers.small_ones(passages="passages")
        with serving(_door(g, answers)) as (door, _):
            async with httpx.AsyncClient(base_url=door, timeout=10) as http:
                call = await http.get("/answer", headers={"x-tenant-id": "acme"})
                stream = await http.get("/stream", headers={"x-tenant-id": "acme"})
    if how == "none":  # not routed: the caller's error, 400, in general words
        assert call.status_code == stream.status_code == 400
        assert "context window" in call.text and url.split("//")[-1] not in call.text
        return
    model = "large" if how == "large" else "small"
    assert call.status_code == 200 and call.json()["said"] == f"{model}: Hello from the wire"
    assert stream.status_code == 200 and stream.text == f"{model}: Hello from the wire"
    if how == "shrink":
        assert call.json()["degraded"][0].startswith("shrink: 12 -> ")
        assert all(n < 12 for _, n in _passages_sent(wire)[1::2][:1])
    assert g.breaker("generation").state is BreakerState.CLOSED


# -- what the shrink keeps, and what it tells -------------------------------------------------------


async def test_a_shrink_takes_no_second_quota_slot_and_a_shrunk_stream_settles_once(
    events: Any,
) -> None:
    # outside a request, each call takes a slot of the default quota: one at a time, no wait
    g = Guard(Policy(stages=_policy().stages, default_quota=TenantQuota(max_concurrency=1)))
    wire = OpenAIWire(context_limits={"small": SMALL})
    with wire.running() as url:
        answers = Answers(g, url).small_ones(passages="passages")
        async with g.deadline(5.0):
            said = await _joined(answers.small_stream("why?", PASSAGES))
            whole = await answers.small("why?", PASSAGES)
    await events.settle()
    assert said == whole == "small: Hello from the wire"
    settled = events.of(StreamSettled)
    assert len(settled) == 1 and settled[0].outcome == "ok"  # one stream: one reservation, settled once
    served = events.of(FallbackServed)
    shrink = ("generation", "shrink", "BadRequestError")
    assert [(e.stage, e.fallback, e.cause) for e in served] == [shrink] * 2
    assert len(wire.requests) == 4  # each refused once, then answered with fewer passages


# -- the recipe of docs/generation.md -----------------------------------------------------------------

DOC = Path(__file__).parents[2] / "docs" / "generation.md"


def _recipe() -> tuple[str, str]:
    """The YAML policy and the Python code below the marker of docs/generation.md."""
    text = DOC.read_text(encoding="utf-8")
    marker = "<!-- the blocks below are executed by tests/generation/test_refusal_routes.py -->"
    after = text[text.index(marker) :]
    yaml_block = re.search(r"```yaml\n(.*?)```", after, re.S)
    python_block = re.search(r"```python\n(.*?)```", after, re.S)
    assert yaml_block is not None and python_block is not None
    return yaml_block.group(1), python_block.group(1)


@pytest.mark.parametrize(
    "limit, sent",
    [
        (200, [("chat-8k", 12), ("chat-8k", 8)]),  # fewer passages fit
        (60, [("chat-8k", 12), ("chat-8k", 3), ("chat-128k", 12)]),  # not even 3: the 128k model, all
    ],
)
async def test_the_recipe_of_the_docs_runs_as_written(
    limit: int, sent: list[tuple[str, int]], tmp_path: Path
) -> None:
    policy_text, code = _recipe()
    (tmp_path / "ragguard.yaml").write_text(policy_text, encoding="utf-8")
    ragguard.configure(tmp_path / "ragguard.yaml")
    wire = OpenAIWire(context_limits={"chat-8k": limit, "chat-128k": 128_000})
    with wire.running() as url:
        namespace: dict[str, Any] = {"BASE_URL": f"{url}/v1", "API_KEY": "k"}
        exec(compile(code, str(DOC), "exec"), namespace)
        said = await namespace["answer"]("why?", PASSAGES)
        await namespace["client"].close()
    assert said == "Hello from the wire"
    asked = [(r["json"]["model"], r["json"]["messages"][1]["content"]) for r in wire.requests]
    assert [(model, prompt.count("passage ")) for model, prompt in asked] == sent


# -- Anthropic -------------------------------------------------------------------------------------


async def test_anthropics_refusals_through_its_sdk_for_a_call_and_a_stream() -> None:
    g = Guard(_policy())
    wire = AnthropicWire(context_limits={"claude-small": SMALL})

    async def ask(model: str, passages: list[str]) -> AsyncIterator[str]:
        async with anthropic.AsyncAnthropic(base_url=wire.url, api_key="k", max_retries=0) as client:
            stream = await client.messages.create(
                model=model, max_tokens=8, messages=_prompt("why?", passages), stream=True  # type: ignore[arg-type]
            )
            async for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    yield event.delta.text

    @g.guard("generation_large")
    async def claude_large(passages: list[str]) -> str:
        return "large: " + await _joined(ask("claude-large", passages))

    def declined(passages: list[str], *, error: BaseException) -> list[str]:
        return [f"declined ({classify(error).reason})"]

    @g.guard("generation", passages="passages", on_content_policy=declined)
    async def shrunk(passages: list[str]) -> AsyncIterator[str]:
        async for text in ask("claude-small", passages):
            yield text

    @g.guard("generation", on_context_length=claude_large)
    async def whole(passages: list[str]) -> str:
        return await _joined(ask("claude-small", passages))

    with wire.running():
        async with g.deadline(5.0):
            assert await whole(PASSAGES) == "large: Hello from the wire"
            assert await _joined(shrunk(PASSAGES)) == "Hello from the wire"
            # Output blocked by content filtering policy: an error event of the 200 stream, before
            # its first text
            wire.faults.push("messages", Fault(event=CONTENT_BLOCKED, event_after=3))
            assert await _joined(shrunk(PASSAGES[:2])) == "declined (content_policy)"
            served = ragguard.degraded()
    assert served[0] == "claude_large" and served[1].startswith("shrink: 12 -> ") and served[2] == "declined"
    assert g.breaker("generation").state is BreakerState.CLOSED


async def test_a_refusal_answered_with_http_200_is_routed_when_the_function_raises_it() -> None:
    # Anthropic's stop_reason "refusal" is no error: the guarded function says it with one of its
    # own, whose words name the refusal
    g = Guard(_policy())
    wire = AnthropicWire()
    wire.stop_reason = "refusal"

    def safe(question: str) -> str:
        return "I cannot help with that."

    @g.guard("generation", on_content_policy=safe)
    async def ask(question: str) -> str:
        async with anthropic.AsyncAnthropic(base_url=wire.url, api_key="k", max_retries=0) as client:
            asked = [{"role": "user", "content": question}]
            reply = await client.messages.create(model="x", max_tokens=8, messages=asked)  # type: ignore[arg-type]
        if reply.stop_reason == "refusal":
            raise ValueError("the model declined under its content policy")
        return "".join(block.text for block in reply.content if block.type == "text")

    with wire.running():
        assert await ask("why?") == "I cannot help with that."
        wire.stop_reason = "end_turn"
        assert await ask("why?") == "Hello from the wire"


async def test_the_larger_model_first_when_passages_are_named_on_it_and_the_routes_stay_apart() -> None:
    g = Guard(_policy())
    wire = OpenAIWire(context_limits={"small": 100, "large": SMALL})
    with wire.running() as url:
        answers = Answers(g, url)
        answers.large = g.guard("generation_large", passages="passages")(answers.large.__wrapped__)  # type: ignore[attr-defined]
        answers.small_ones(on_context_length=answers.large)
        said, served = await answers.ask("call")
        # a context-length refusal never reaches on_content_policy=
        answers.small_ones(on_content_policy=answers.large)
        with pytest.raises(openai.BadRequestError):
            await answers.small("why?", PASSAGES)
    assert said == "large: Hello from the wire"
    sent = _passages_sent(wire)
    assert sent[:2] == [("small", 12), ("large", 12)] and sent[2][0] == "large" and sent[2][1] < 12
    assert served[0].startswith("shrink: 12 -> ") and served[1] == "large"
    assert sent[3:] == [("small", 12)]


async def test_fallback_given_error_gets_the_failure_it_replaces() -> None:
    g = Guard(Policy(stages={"generation": StagePolicy(preset="generation", retry=RetryPolicy(attempts=1))}))
    wire = OpenAIWire()
    got: list[BaseException] = []

    def cached(question: str, passages: list[str], *, error: BaseException) -> str:
        got.append(error)
        return "cached"

    with wire.running() as url:
        answers = Answers(g, url).small_ones(fallback=cached)
        wire.faults.push("chat", Fault(status=500))
        assert await answers.small("why?", PASSAGES) == "cached"
    assert len(got) == 1 and isinstance(got[0], openai.InternalServerError)
