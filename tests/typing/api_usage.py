"""Checked by mypy --strict in test_typing.py: the public API keeps the signatures it wraps."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import ragguard
from ragguard import (
    CircuitBreaker,
    Guard,
    GuardedStream,
    Policy,
    StreamEnding,
    TenantQuota,
    deadline,
    guard,
    tenant,
)
from ragguard.rag import Partial


@guard("embedding")
async def embed(texts: list[str]) -> list[list[float]]:
    return [[0.0] for _ in texts]


@guard("stream")
async def tokens(prompt: str) -> AsyncIterator[str]:
    yield prompt


@guard("rerank")
def predict(pairs: list[tuple[str, str]]) -> list[float]:  # sync: run in a worker thread
    return [0.0 for _ in pairs]


async def larger(question: str, passages: list[str], *, error: BaseException) -> str:
    return question


@guard("generation", passages="passages", on_context_length=larger, on_content_policy=[larger])
async def answer(question: str, passages: list[str]) -> str:
    return question


breaker = CircuitBreaker("llm", failure_rate_threshold=50.0, minimum_calls=10)


@breaker
async def generate(prompt: str, *, max_tokens: int = 16) -> str:
    return prompt[:max_tokens]


async def use() -> None:
    async with tenant("acme"), deadline(0.8):
        vectors: list[list[float]] = await embed(["hello"])
        text: str = await generate("hi", max_tokens=4)
        direct: str = await breaker.call(generate, "hi")
        async for token in tokens("x"):
            chunk: str = token
        left: float | None = ragguard.remaining()
        scores: list[float] = await predict([("q", "d")])
        said: str = await answer("why?", ["a passage"])
    g = Guard(Policy(tenants={"acme": TenantQuota(max_concurrency=2)}))
    async with g.tenant("acme"):
        pass
    del vectors, text, direct, chunk, left, scores, said


async def closes_a_guarded_stream() -> list[str]:
    # a guarded async generator is an async generator: aclosing() accepts it
    async with aclosing(tokens("q")) as words:
        return [w async for w in words]


async def finish(prompt: str, *, partial: Partial) -> AsyncIterator[str]:
    yield (partial.text or "")[-1:]


@guard("generation", continuation=finish)
async def continued(prompt: str) -> AsyncIterator[str]:
    yield prompt


async def reads_the_ending() -> StreamEnding | None:
    stream: GuardedStream[str] = continued("q")
    words: list[str] = [w async for w in stream]
    del words
    endings: tuple[StreamEnding, ...] = ragguard.stream_endings()
    del endings
    return stream.ending


async def closes_a_groups_stream(g: Guard) -> list[str]:
    # a model group's stream is an async generator too: aclosing() accepts it, and closing it
    # early closes the deployment's stream (its call cancelled) at once
    async with aclosing(g.group("chat", {"a": tokens}).stream("q")) as words:
        return [w async for w in words]
