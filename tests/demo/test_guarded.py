"""The guarded pipeline against real backends under real faults."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import grpc
import pytest

import ragguard
from ragguard import BreakerState, Guard, StreamEnding, TenantQuota
from ragguard.chaos import FaultProxy
from ragguard.events import BreakerTransition, StreamCut, StreamSettled, bus
from ragguard.grpc import (
    STREAM_BY_KEY,
    STREAM_ENDING_KEY,
    STREAM_ITEMS_KEY,
    GuardServerInterceptor,
    client_interceptors,
)
from ragguard_tools.demo.backends import BackendServers, ControlClient
from ragguard_tools.demo.corpus import Passage
from ragguard_tools.demo.generator import extractive_answer
from ragguard_tools.demo.guarded import GuardedPipeline, demo_policy
from ragguard_tools.demo.keyword import KeywordIndex
from ragguard_tools.demo.pipeline import BackendClients, Retrieval, UnguardedPipeline
from ragguard_tools.demo.rerank import Reranker
from ragguard_tools.demo.service import RetrievalClient, RetrievalServer

REFUSED = {"kind": "error", "stage": "vector_store", "error": "connection_refused"}

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

QUERY = "When does the finally clause of a try statement run?"


@dataclass
class Guarded:
    pipeline: GuardedPipeline
    plain: UnguardedPipeline
    control: ControlClient
    reranker: Reranker
    guard: Guard

    async def retrieve(self, query: str, tenant: str = "acme") -> Retrieval:
        """One request, as the service makes it: inside the tenant's block."""
        async with self.guard.tenant(tenant):
            return await self.pipeline.retrieve(query)

    async def answer(self, query: str, tenant: str = "acme") -> tuple[list[str], tuple[str, ...]]:
        """One Answer request inside the tenant's block: its words and the fallbacks that served."""
        async with self.guard.tenant(tenant):
            answer = await self.pipeline.answer(query)
            words = [word async for word in answer.words]
            return words, answer.fallbacks()


@pytest.fixture(scope="module")
def keyword(demo_passages: list[Passage]) -> KeywordIndex:
    return KeywordIndex(demo_passages)


@pytest.fixture
async def guarded(
    demo_backends: BackendServers,
    demo_reranker: Reranker,
    demo_passages: list[Passage],
    keyword: KeywordIndex,
) -> AsyncIterator[Guarded]:
    assert demo_backends.addresses is not None
    clients = BackendClients(demo_backends.addresses, interceptors=client_interceptors())
    guard = Guard(
        demo_policy(open_for_s=30.0, greedy={"greedy": TenantQuota(max_concurrency=1, timeout_s=2.0)}),
        rng=random.Random(5),
    )
    pipeline = GuardedPipeline(clients, demo_reranker, demo_passages, keyword, guard)
    plain_clients = BackendClients(demo_backends.addresses)
    plain = UnguardedPipeline(plain_clients, demo_reranker, demo_passages)
    control = ControlClient(demo_backends.addresses.control)
    try:
        yield Guarded(pipeline, plain, control, demo_reranker, guard)
    finally:
        await control.close()
        await clients.close()
        await plain_clients.close()


async def test_healthy_guarded_answers_like_unguarded(guarded: Guarded) -> None:
    got = await guarded.retrieve(QUERY)
    want = await guarded.plain.retrieve(QUERY)
    assert got.fallbacks == ()
    assert [h.pid for h in got.hits] == [h.pid for h in want.hits]


async def test_vector_store_down_is_served_by_keyword_search(
    guarded: Guarded, demo_passages: list[Passage]
) -> None:
    await guarded.control.set_faults([REFUSED])
    results = [await guarded.retrieve(QUERY) for _ in range(8)]
    assert all("keyword_search" in r.fallbacks for r in results)
    assert all(any("try" in demo_passages[h.pid].topics for h in r.hits) for r in results)
    assert guarded.guard.breaker("vector_store").state.value == "open"
    t0 = time.perf_counter()
    await guarded.retrieve(QUERY)
    assert time.perf_counter() - t0 < 0.25, "an open breaker answers without waiting on the dead store"


async def test_slow_embedding_is_served_from_the_cache(guarded: Guarded) -> None:
    await guarded.retrieve(QUERY)  # fills the embedding cache
    await guarded.control.set_faults([{"kind": "latency", "stage": "embedding", "seconds": 3.5}])
    t0 = time.perf_counter()
    cached = await guarded.retrieve(QUERY)
    assert time.perf_counter() - t0 < 1.5
    assert cached.fallbacks == ("embedding_cache",)
    fresh = await guarded.retrieve("What does the pass statement do?")
    assert fresh.fallbacks == ("keyword_search",) and len(fresh.hits) == 5


async def test_open_embedding_breaker_cache_first_then_keyword_search(
    guarded: Guarded, demo_passages: list[Passage]
) -> None:
    await guarded.retrieve(QUERY)  # fills the embedding cache
    guarded.guard.breaker("embedding").force_open()
    cached = await guarded.retrieve(QUERY)
    assert cached.fallbacks == ("embedding_cache",)
    fresh = await guarded.retrieve("What does the pass statement do?")
    assert fresh.fallbacks == ("keyword_search",), "the cache missed: the retrieval step's fallback serves"
    assert any("pass" in demo_passages[h.pid].topics for h in fresh.hits)
    assert guarded.guard.breaker("embedding").state is BreakerState.FORCED_OPEN


async def test_rerank_oom_scores_every_candidate_in_chunks_then_skips_rerank(
    guarded: Guarded, demo_passages: list[Passage]
) -> None:
    healthy = await guarded.retrieve(QUERY)
    assert healthy.fallbacks == ()
    texts = [p.text for p in demo_passages[:20]]
    guarded.reranker.set_budget(guarded.reranker.batch_bytes(texts) // 3)
    chunked = await guarded.retrieve(QUERY)
    assert chunked.fallbacks == ("chunked_rerank",)
    # a pointwise reranker scored in chunks gives the order of one big batch
    assert [h.pid for h in chunked.hits] == [h.pid for h in healthy.hits]
    # out-of-memory errors above the floor were recovered, not counted
    assert guarded.guard.breaker("rerank").state is BreakerState.CLOSED
    guarded.reranker.set_budget(1)
    skipped = await guarded.retrieve(QUERY)
    assert "skip_rerank" in skipped.fallbacks and len(skipped.hits) == 5


async def test_the_greedy_tenant_is_shed_and_the_others_are_not(
    guarded: Guarded, demo_passages: list[Passage]
) -> None:
    server = RetrievalServer(guarded.pipeline, demo_passages, capacity=32,
                             interceptors=[GuardServerInterceptor(guard=guarded.guard)])
    client = RetrievalClient(await server.start())
    await guarded.control.set_faults([{"kind": "latency", "stage": "embedding", "seconds": 0.2}])
    try:
        greedy = await asyncio.gather(
            *(client.retrieve("greedy", f"{QUERY} {i}", timeout_s=5) for i in range(4)),
            return_exceptions=True,
        )
        polite = await asyncio.gather(
            *(client.retrieve("polite", f"{QUERY} {i}", timeout_s=5) for i in range(4)),
            return_exceptions=True,
        )
    finally:
        await client.close()
        await server.stop()
    shed = [r for r in greedy if isinstance(r, grpc.aio.AioRpcError)]
    assert shed and all(r.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for r in shed)
    assert all(isinstance(r, dict) for r in polite), polite


@pytest.mark.parametrize("tenant", ["bad tenant!", "x" * 65])
async def test_a_bad_tenant_id_is_invalid_argument(
    guarded: Guarded, demo_passages: list[Passage], tenant: str
) -> None:
    server = RetrievalServer(guarded.pipeline, demo_passages, capacity=4,
                             interceptors=[GuardServerInterceptor(guard=guarded.guard)])
    client = RetrievalClient(await server.start())
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.retrieve(tenant, QUERY, timeout_s=5)
    finally:
        await client.close()
        await server.stop()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_with_redis_quotas_and_breakers_live_in_redis(
    redis_server: object, demo_backends: BackendServers, demo_reranker: Reranker,
    demo_passages: list[Passage], keyword: KeywordIndex,
) -> None:
    import redis.asyncio as aredis

    from ragguard_tools.demo.runner import REDIS_PREFIX, _redis_client, _shared_guard

    assert demo_backends.addresses is not None
    client = _redis_client(redis_server.url)  # type: ignore[attr-defined]
    policy = demo_policy(greedy={"greedy": TenantQuota(max_concurrency=2, rate_per_s=5.0, timeout_s=2.0)})
    guard, closers = _shared_guard(policy, client, random.Random(3))
    clients = BackendClients(demo_backends.addresses)
    pipeline = GuardedPipeline(clients, demo_reranker, demo_passages, keyword, guard)
    try:
        async with guard.tenant("greedy"):
            got = await pipeline.retrieve(QUERY)
        assert len(got.hits) == 5 and got.fallbacks == ()
        assert type(guard.breaker("vector_store")).__name__ == "SharedCircuitBreaker"
    finally:
        for close in closers:
            await close()
        await clients.close()
    probe = aredis.Redis.from_url(redis_server.url)  # type: ignore[attr-defined]
    try:
        keys = {k.decode() for k in await probe.keys(f"{{{REDIS_PREFIX}:*")}
    finally:
        await probe.aclose()
        await client.aclose()
    assert any(k.startswith(f"{{{REDIS_PREFIX}:quota:greedy}}") for k in keys), keys


async def plain_answer(guarded: Guarded, query: str) -> list[str]:
    answer = await guarded.plain.answer(query, tenant="acme")
    return [word async for word in answer.words]


async def test_a_healthy_guarded_answer_is_the_generators(guarded: Guarded) -> None:
    words, fallbacks = await guarded.answer(QUERY)
    assert fallbacks == ()
    assert words == await plain_answer(guarded, QUERY) and len(words) == 30


async def test_a_slow_first_word_fails_over_then_the_extractive_answer_serves(
    guarded: Guarded, demo_passages: list[Passage]
) -> None:
    cuts: list[StreamCut] = []
    unsubscribe = bus.subscribe(lambda e: cuts.append(e) if isinstance(e, StreamCut) else None)
    await guarded.control.set_faults([{"kind": "latency", "stage": "generation", "seconds": 3.0}])
    try:
        t0 = time.perf_counter()
        words, fallbacks = await guarded.answer(QUERY)
        elapsed = time.perf_counter() - t0
    finally:
        await asyncio.sleep(0)  # the bus delivers on the loop's next turn
        unsubscribe()
    assert fallbacks == ("extractive_answer",)
    top = demo_passages[(await guarded.retrieve(QUERY)).hits[0].pid].text
    assert words == extractive_answer(QUERY, [top], 30) and words
    # deployment a's first word took over 0.4 s: b was tried, and the answer's first-word budget
    # (0.6 s in all) cut it
    assert [(c.stage, c.budget, c.items) for c in cuts] == [("generation", "first_item", 0)]
    assert elapsed < 1.5, "one first-word budget of 0.6 s, not the model's 3 s"


async def streams_closed(backends: BackendServers) -> bool:
    for _ in range(200):
        if backends.streams_open == 0:
            return True
        await asyncio.sleep(0.01)
    return False


async def test_a_stall_after_the_first_word_is_continued_by_b_then_without_the_model(
    guarded: Guarded, demo_backends: BackendServers
) -> None:
    healthy = await plain_answer(guarded, QUERY)
    # every answer stalls halfway through the words it is asked for: the first, and b's continuation
    await guarded.control.set_faults([{"kind": "latency", "stage": "generation_midway", "seconds": 5.0}])
    t0 = time.perf_counter()
    async with guarded.guard.tenant("acme"):
        answer = await guarded.pipeline.answer(QUERY)
        words = [word async for word in answer.words]
        endings, fallbacks = ragguard.stream_endings(), answer.fallbacks()
    assert time.perf_counter() - t0 < 2.5, "two 0.4 s cuts, not two 5 s stalls"
    assert words == healthy, "the whole answer: no word repeated (b starts again at word 15), none missing"
    assert fallbacks == (
        "incomplete: model after 15 items", "continued: finish_on_model after 15 items",
        "incomplete: model after 8 items", "continued: finish_extractive after 22 items",
    )  # fmt: skip
    assert endings[-1] == StreamEnding("continued", "generation", 30, "finish_extractive", 22, "StageTimeout")
    assert await streams_closed(demo_backends), "each cut cancelled its deployment's call"


async def test_a_continued_answer_reaches_the_caller_whole_with_its_typed_ending(
    guarded: Guarded, demo_passages: list[Passage]
) -> None:
    healthy = await plain_answer(guarded, QUERY)
    server = RetrievalServer(guarded.pipeline, demo_passages, capacity=4,
                             interceptors=[GuardServerInterceptor(guard=guarded.guard)])
    client = RetrievalClient(await server.start())
    await guarded.control.set_faults([{"kind": "latency", "stage": "generation_midway", "seconds": 5.0}])
    trailers: dict[str, str] = {}
    try:
        messages = [m async for m in client.answer("acme", QUERY, timeout_s=5, trailers=trailers)]
    finally:
        await client.close()
        await server.stop()
    assert [m["text"] for m in messages[:-1]] == healthy
    assert "continued: finish_extractive after 22 items" in messages[-1]["fallbacks"]
    assert (trailers[STREAM_ENDING_KEY], trailers[STREAM_BY_KEY], trailers[STREAM_ITEMS_KEY]) == (
        "continued", "finish_extractive", "30")  # fmt: skip


async def test_a_stall_past_the_deadline_ends_incomplete_after_the_words_sent(
    demo_backends: BackendServers,
    demo_reranker: Reranker,
    demo_passages: list[Passage],
    keyword: KeywordIndex,
) -> None:
    assert demo_backends.addresses is not None
    policy = demo_policy(tenant_timeout_s=1.0)  # the request's deadline, the service's own
    # budgets longer than the deadline: what ends the stalled stream is the request's deadline,
    # which no continuation serves
    stages = dict(policy.stages)
    stages["model"] = stages["model"].model_copy(update={"timeout_s": 10.0})
    answer = stages["generation"].generation
    assert answer is not None
    stages["generation"] = stages["generation"].model_copy(
        update={"generation": answer.model_copy(update={"idle_s": 10.0})}
    )
    guard = Guard(policy.model_copy(update={"stages": stages}), rng=random.Random(5))
    clients = BackendClients(demo_backends.addresses, interceptors=client_interceptors())
    pipeline = GuardedPipeline(clients, demo_reranker, demo_passages, keyword, guard)
    server = RetrievalServer(pipeline, demo_passages, capacity=4,
                             interceptors=[GuardServerInterceptor(guard=guard)])
    client = RetrievalClient(await server.start())
    control = ControlClient(demo_backends.addresses.control)
    await control.set_faults([{"kind": "latency", "stage": "generation_midway", "seconds": 5.0}])
    words = []
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for message in client.answer("acme", QUERY, timeout_s=5):
                words.append(message["text"])
    finally:
        await control.heal()
        await control.close()
        await client.close()
        await server.stop()
        await clients.close()
    assert len(words) == 15 and info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    trailers = dict(info.value.trailing_metadata() or ())
    assert (trailers[STREAM_ENDING_KEY], trailers[STREAM_ITEMS_KEY]) == ("incomplete", "15")


async def test_deployment_a_down_every_answer_by_b_and_a_back_after_its_cooldown(
    demo_backends: BackendServers,
    demo_reranker: Reranker,
    demo_passages: list[Passage],
    keyword: KeywordIndex,
) -> None:
    assert demo_backends.addresses is not None
    proxy = await FaultProxy(int(demo_backends.addresses.generation.rsplit(":", 1)[1])).open()
    addresses = replace(demo_backends.addresses, generation=proxy.target)
    guard = Guard(demo_policy(open_for_s=0.5), rng=random.Random(5))
    clients = BackendClients(addresses, interceptors=client_interceptors())
    pipeline = GuardedPipeline(clients, demo_reranker, demo_passages, keyword, guard)
    moves: list[tuple[str, str]] = []
    unsubscribe = bus.subscribe(
        lambda e: moves.append((e.breaker, e.new)) if isinstance(e, BreakerTransition) else None
    )

    async def answer() -> tuple[list[str], tuple[str, ...]]:
        async with guard.tenant("acme"):
            got = await pipeline.answer(QUERY)
            return [word async for word in got.words], got.fallbacks()

    try:
        healthy, fallbacks = await answer()
        assert fallbacks == () and len(healthy) == 30
        proxy.stop()
        down = [await answer() for _ in range(8)]
        assert all(words == healthy and fallbacks == ("model/b",) for words, fallbacks in down), down
        await asyncio.sleep(0)  # the bus delivers on the loop's next turn
        assert ("model[a]", "open") in moves and not any(b == "model[b]" for b, _ in moves)
        proxy.restart()
        # a's breaker half-opens after its cooldown (open_for_s) and closes once a round of
        # trials passes; a round begun while a was still down reopens it first
        back: list[tuple[list[str], tuple[str, ...]]] = []
        until = time.monotonic() + 5.0
        while time.monotonic() < until:
            back.append(await answer())
            if back[-1][1] == () and guard.breaker("model", "a").state is BreakerState.CLOSED:
                break
            await asyncio.sleep(0.1)
        assert all(words == healthy for words, _ in back)
        assert back[-1][1] == () and guard.breaker("model", "a").state is BreakerState.CLOSED
    finally:
        unsubscribe()
        await clients.close()
        await proxy.aclose()


async def test_the_greedy_tenants_words_are_paced_and_the_others_are_not(
    demo_backends: BackendServers,
    demo_reranker: Reranker,
    demo_passages: list[Passage],
    keyword: KeywordIndex,
) -> None:
    assert demo_backends.addresses is not None
    greedy = TenantQuota(timeout_s=5.0, tokens_per_s=100.0, token_burst=10)
    guard = Guard(demo_policy(greedy={"greedy": greedy}), rng=random.Random(5))
    clients = BackendClients(demo_backends.addresses, interceptors=client_interceptors())
    pipeline = GuardedPipeline(clients, demo_reranker, demo_passages, keyword, guard)
    settled: list[StreamSettled] = []
    unsubscribe = bus.subscribe(lambda e: settled.append(e) if isinstance(e, StreamSettled) else None)
    try:
        for tenant in ("polite", "greedy"):
            async with guard.tenant(tenant):
                answer = await pipeline.answer(QUERY)
                assert len([w async for w in answer.words]) == 30
    finally:
        await asyncio.sleep(0)  # the bus delivers on the loop's next turn
        unsubscribe()
        await clients.close()
    polite, paced = settled
    assert (polite.tenant, polite.paced_s) == ("polite", 0.0)
    assert paced.tenant == "greedy" and paced.tokens > 40
    # GCRA: beyond the burst of 10, 100 tokens/s; the model's own 5 ms a word overlaps the waits
    assert paced.paced_s >= (paced.tokens - 10) / 100.0 - 30 * 0.005 - 0.05
