"""The load: several tenants sending the labelled questions at Poisson arrival times.

The arrival plan is drawn once from a seeded ``random.Random`` and replayed against both runs,
so the guarded and the unguarded service see exactly the same requests at the same offsets.
Requests are sent open-loop (a slow service does not slow the senders down); at most
``max_in_flight`` are outstanding, and a request that has to wait for a slot counts that wait in
its latency (no coordinated omission). A request is a ``Retrieve`` call or (``rpc="answer"``) an
``Answer`` stream, whose words are timed as they arrive: the first one, the longest wait between
two, and their tokens (:func:`ragguard.rag.count_tokens`, what the guard counts).
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import grpc

from ragguard import InvalidInput
from ragguard.grpc import RETRY_AFTER_KEY, STREAM_BUDGET_KEY, STREAM_BY_KEY, STREAM_ENDING_KEY
from ragguard.rag import count_tokens

from .corpus import Question
from .service import RetrievalClient

__all__ = ["RPCS", "Arrival", "Judge", "RequestRecord", "TenantLoad", "classify", "plan_arrivals", "run_load"]

OUTCOMES = ("ok", "quota", "overloaded", "unavailable", "deadline", "cut", "error")
RPCS = ("retrieve", "answer")


@dataclass(frozen=True, slots=True)
class TenantLoad:
    """Tenant ``name`` sends ``rate_per_s`` requests per second on average."""

    name: str
    rate_per_s: float
    greedy: bool = False

    def __post_init__(self) -> None:
        if not (self.rate_per_s > 0 and math.isfinite(self.rate_per_s)):
            raise InvalidInput(f"tenant {self.name!r}: rate_per_s must be > 0, got {self.rate_per_s}")


@dataclass(frozen=True, slots=True)
class Arrival:
    """A planned request: ``at_s`` seconds after the run starts, ``question`` an index."""

    at_s: float
    tenant: str
    question: int


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one request. ``latency_s`` runs from its planned send time to its answer
    (an Answer's last message); ``hit`` (answered requests only) tells whether a top-5 passage
    carries one of the question's topics; ``outcome`` is one of ``ok``, ``quota`` (shed by the
    tenant's quota), ``overloaded`` (the server's capacity was full), ``unavailable``,
    ``deadline``, ``cut`` (an Answer that failed after its first word: the caller has half an
    answer) or ``error``.

    An Answer's words: ``ttft_s`` from the planned send time to the first word (None: none came),
    ``max_gap_s`` the longest wait between two words (seconds), ``words`` and ``tokens``
    received, ``budget`` the ragguard budget that cut the stream (``first_item``, ``idle``,
    ``total``; "" when none did). How the stream ended, as the guarded service's trailing
    metadata said (:data:`ragguard.grpc.STREAM_ENDING_KEY`; "" when it said nothing):
    ``ending`` (``completed``, ``continued``, ``incomplete``), ``continued_by`` (the
    continuation that finished it); ``whole``: the words are the whole answer, none repeated
    or missing (None: not checked)."""

    at_s: float
    tenant: str
    question: int
    latency_s: float
    outcome: str
    fallbacks: tuple[str, ...] = ()
    hit: bool | None = None
    detail: str = ""
    ttft_s: float | None = None
    max_gap_s: float = 0.0
    words: int = 0
    tokens: int = 0
    budget: str = ""
    ending: str = ""
    continued_by: str = ""
    whole: bool | None = None


Judge = Callable[[Sequence[str], dict[str, object]], "bool | None"]
"""Whether an answer's words (as received) are its whole answer, given its last message (the
passages it was answered from); None: cannot tell."""


def plan_arrivals(
    tenants: Sequence[TenantLoad], duration_s: float, n_questions: int, rng: random.Random
) -> list[Arrival]:
    """Poisson arrivals of every tenant over ``duration_s`` seconds, sorted by time."""
    if not duration_s > 0:
        raise InvalidInput(f"duration_s must be > 0, got {duration_s}")
    if n_questions < 1:
        raise InvalidInput("need at least one question")
    out: list[Arrival] = []
    for t in tenants:
        at = rng.expovariate(t.rate_per_s)
        while at < duration_s:
            out.append(Arrival(at, t.name, rng.randrange(n_questions)))
            at += rng.expovariate(t.rate_per_s)
    out.sort(key=lambda a: a.at_s)
    return out


def classify(exc: grpc.aio.AioRpcError) -> str:
    """The outcome name of a failed call (see :class:`RequestRecord`)."""
    code = exc.code()
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        trailing = exc.trailing_metadata() or ()
        if any(key == RETRY_AFTER_KEY for key, _ in trailing):
            return "quota"
        return "overloaded"
    if code == grpc.StatusCode.UNAVAILABLE:
        return "unavailable"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "deadline"
    return "error"


async def _one(
    client: RetrievalClient,
    arrival: Arrival,
    question: Question,
    planned: float,
    slots: asyncio.Semaphore,
    timeout_s: float,
) -> RequestRecord:
    async with slots:
        try:
            reply = await client.retrieve(arrival.tenant, question.text, timeout_s=timeout_s)
        except grpc.aio.AioRpcError as exc:
            latency = time.monotonic() - planned
            detail = (exc.details() or "")[:200]
            return RequestRecord(arrival.at_s, arrival.tenant, arrival.question, latency, classify(exc),
                                 detail=detail)
    latency = time.monotonic() - planned
    return RequestRecord(arrival.at_s, arrival.tenant, arrival.question, latency, "ok",
                         fallbacks=tuple(reply["fallbacks"]), hit=_hit(question, reply))


def _hit(question: Question, reply: dict[str, object]) -> bool:
    wanted = set(question.topics)
    hits = reply.get("hits")
    return isinstance(hits, list) and any(wanted.intersection(h["topics"]) for h in hits[:5])


async def _one_answer(
    client: RetrievalClient,
    arrival: Arrival,
    question: Question,
    planned: float,
    slots: asyncio.Semaphore,
    timeout_s: float,
    judge: Judge | None = None,
) -> RequestRecord:
    first: float | None = None
    last = gap = 0.0
    texts: list[str] = []
    tokens = 0
    reply: dict[str, object] | None = None
    trailers: dict[str, str] = {}
    async with slots:
        try:
            answer = client.answer(arrival.tenant, question.text, timeout_s=timeout_s, trailers=trailers)
            async with aclosing(answer) as stream:
                async for message in stream:
                    now = time.monotonic()
                    text = message.get("text")
                    if isinstance(text, str):
                        if first is None:
                            first = now
                        else:
                            gap = max(gap, now - last)
                        last = now
                        texts.append(text)
                        tokens += count_tokens(text)
                    else:
                        reply = message
        except grpc.aio.AioRpcError as exc:
            said = dict(exc.trailing_metadata() or ())
            return RequestRecord(
                arrival.at_s, arrival.tenant, arrival.question, time.monotonic() - planned,
                "cut" if texts else classify(exc), detail=(exc.details() or "")[:200],
                ttft_s=None if first is None else first - planned, max_gap_s=gap, words=len(texts),
                tokens=tokens, budget=str(said.get(STREAM_BUDGET_KEY, "")),
                ending=str(said.get(STREAM_ENDING_KEY, "")), continued_by=str(said.get(STREAM_BY_KEY, "")),
            )
    latency = time.monotonic() - planned
    ttft = None if first is None else first - planned
    ending, continued_by = trailers.get(STREAM_ENDING_KEY, ""), trailers.get(STREAM_BY_KEY, "")
    if reply is None:
        return RequestRecord(arrival.at_s, arrival.tenant, arrival.question, latency, "error",
                             detail="the answer ended without its last message", ttft_s=ttft,
                             max_gap_s=gap, words=len(texts), tokens=tokens, ending=ending,
                             continued_by=continued_by)  # fmt: skip
    fallbacks = reply.get("fallbacks")
    return RequestRecord(
        arrival.at_s, arrival.tenant, arrival.question, latency, "ok",
        fallbacks=tuple(fallbacks) if isinstance(fallbacks, list) else (), hit=_hit(question, reply),
        ttft_s=ttft, max_gap_s=gap, words=len(texts), tokens=tokens, ending=ending, continued_by=continued_by,
        whole=None if judge is None else judge(texts, reply),
    )


async def run_load(
    clients: Mapping[str, RetrievalClient],
    arrivals: Sequence[Arrival],
    questions: Sequence[Question],
    *,
    timeout_s: float,
    max_in_flight: int,
    start: float | None = None,
    on_done: Callable[[RequestRecord], None] | None = None,
    rpc: str = "retrieve",
    judge: Judge | None = None,
) -> list[RequestRecord]:
    """Send every arrival at ``start + at_s`` (``time.monotonic`` seconds; default now) through its
    tenant's client, each with a ``timeout_s`` gRPC deadline; returns the records in arrival order
    once every request has ended. ``rpc`` is ``retrieve`` (the Retrieve call) or ``answer`` (the
    Answer stream, read to its end; ``judge`` says whether each answer is whole). ``on_done`` is
    called as each request ends (progress bars).
    Raises InvalidInput for an ``rpc``, ``max_in_flight`` or tenant without a client."""
    if max_in_flight < 1:
        raise InvalidInput(f"max_in_flight must be >= 1, got {max_in_flight}")
    if rpc not in RPCS:
        raise InvalidInput(f"rpc must be one of {RPCS}, got {rpc!r}")
    one: Callable[..., Coroutine[Any, Any, RequestRecord]] = (
        functools.partial(_one_answer, judge=judge) if rpc == "answer" else _one
    )
    missing = {a.tenant for a in arrivals} - set(clients)
    if missing:
        raise InvalidInput(f"no client for tenants {sorted(missing)}")
    t0 = time.monotonic() if start is None else start
    slots = asyncio.Semaphore(max_in_flight)
    tasks: list[asyncio.Task[RequestRecord]] = []
    try:
        for arrival in arrivals:
            planned = t0 + arrival.at_s
            delay = planned - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(
                one(clients[arrival.tenant], arrival, questions[arrival.question], planned, slots, timeout_s)
            )
            if on_done is not None:
                task.add_done_callback(lambda t: t.cancelled() or t.exception() or on_done(t.result()))
            tasks.append(task)
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
