"""The four services ``ragguard bench`` compares, all built on the demo's real parts.

Each is the demo's retrieval service (:class:`~ragguard_tools.demo.service.RetrievalServer`: gRPC, a
WordLlama embedding service and a faiss vector store in the backends' process, BM25 unused, a
WordLlama reranker here) with a different protection in front of its dependencies:

``unguarded``
    plain calls with the demo's plain timeouts (:class:`~ragguard_tools.demo.pipeline.UnguardedPipeline`).
``hand-composed``
    what a user assembles from popular libraries, configured the way their docs suggest: a
    tenacity retry (``stop_after_attempt(3)``, ``wait_random_exponential``: the "exponential backoff
    with jitter" the tenacity docs recommend for distributed services), an aiobreaker
    ``CircuitBreaker(fail_max=5, timeout_duration=...)`` per dependency (its README's), an
    ``asyncio.timeout`` per call, and per tenant an ``asyncio.Semaphore`` plus an aiolimiter
    ``AsyncLimiter(rate, 1)`` entered with ``async with`` (aiolimiter's documented use: a caller
    over the rate waits its turn).
``ragguard-static``
    ragguard's stages (typed breakers, attempt timeouts, deadline-aware retries) behind
    :class:`~ragguard.grpc.GuardServerInterceptor` with the same per-tenant quotas (refused at once
    over quota, ``QuotaExceeded`` to RESOURCE_EXHAUSTED).
``ragguard-adaptive``
    the same, plus the overload layers: an adaptive limit on each stage (priority shedding:
    the batch tenant first, then the heaviest), hedged vector-store searches.

The ragguard stages are named ``embed``, ``search`` and ``rank``: the standard stage names would
bring their RAG presets' fallbacks.

No contender has a fallback (the demo shows those): a call shed or failed fails its request, so
the comparison is of overload protection alone.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import grpc

from ragguard import Guard
from ragguard.grpc import TENANT_KEY
from ragguard.options import (
    AdaptivePolicy,
    BreakerPolicy,
    HedgePolicy,
    Policy,
    RetryPolicy,
    StagePolicy,
    TenantQuota,
)

from ..demo.corpus import Passage
from ..demo.pipeline import BackendClients, Hit, PipelineSettings, Retrieval, UnguardedPipeline, rerank_hits
from ..demo.rerank import Reranker
from ..demo.service import RetrievalServer

__all__ = ["CONTENDERS", "Contender", "TenantPlan", "build_contender"]

CONTENDERS = ("unguarded", "hand-composed", "ragguard-static", "ragguard-adaptive")
SERVER_CAPACITY = 512  # gRPC's maximum_concurrent_rpcs: high enough to cap nothing here


@dataclass(frozen=True, slots=True)
class TenantPlan:
    """A tenant of the load: its quota (the same numbers for every contender that has quotas)."""

    name: str
    priority: str
    max_concurrency: int
    rate_per_s: float
    well_behaved: bool


@dataclass(slots=True)
class Contender:
    """One running service: ``address`` to send the load to, ``guard`` for ragguard's (its
    limits are sampled during the capacity-halving run), ``close`` to stop it."""

    name: str
    address: str
    guard: Guard | None
    close: Callable[[], Awaitable[None]]
    extra: dict[str, Any] = field(default_factory=dict)


async def build_contender(
    name: str,
    *,
    addresses: Any,
    reranker: Reranker,
    passages: Sequence[Passage],
    tenants: Sequence[TenantPlan],
    deadline_s: float,
    seed: int,
) -> Contender:
    """Start contender ``name`` (one of :data:`CONTENDERS`) on 127.0.0.1."""
    settings = PipelineSettings(candidates=10)
    clients = BackendClients(addresses)
    guard: Guard | None = None
    pipeline: Any
    interceptors: list[Any] = []
    if name == "unguarded":
        pipeline = UnguardedPipeline(clients, reranker, passages, settings)
    elif name == "hand-composed":
        pipeline = HandComposedPipeline(clients, reranker, passages, settings, call_timeout_s=deadline_s / 2)
        interceptors = [_TenantGates(_per_tenant_gates(tenants))]
    elif name in ("ragguard-static", "ragguard-adaptive"):
        from ragguard.grpc import GuardServerInterceptor

        guard = Guard(
            bench_policy(tenants, adaptive=name == "ragguard-adaptive", deadline_s=deadline_s),
            rng=random.Random(seed),
        )
        pipeline = RagguardPipeline(clients, reranker, passages, settings, guard)
        interceptors = [GuardServerInterceptor(guard=guard)]
    else:
        raise ValueError(f"unknown contender {name!r}; one of {CONTENDERS}")
    server = RetrievalServer(pipeline, passages, capacity=SERVER_CAPACITY, interceptors=interceptors)
    address = await server.start()

    async def close() -> None:
        await server.stop(None)
        await clients.close()

    return Contender(name, address, guard, close)


# -- hand-composed ----------------------------------------------------------------------------------


def _transient(exc: BaseException) -> bool:
    """What the hand-composed stack retries: a timeout or an unavailable dependency."""
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    return False


class HandComposedPipeline:
    """embed -> search -> rerank, each dependency call in tenacity retry > aiobreaker > asyncio.timeout."""

    def __init__(
        self,
        clients: BackendClients,
        reranker: Reranker,
        passages: Sequence[Passage],
        settings: PipelineSettings,
        *,
        call_timeout_s: float,
    ) -> None:
        import aiobreaker

        self._clients = clients
        self._reranker = reranker
        self._passages = passages
        self._settings = settings
        self._timeout = call_timeout_s
        # aiobreaker's README: CircuitBreaker(fail_max=5, timeout_duration=timedelta(seconds=60)),
        # the open time scaled to a run of seconds
        self._embed_breaker = aiobreaker.CircuitBreaker(fail_max=5, timeout_duration=timedelta(seconds=2))
        self._search_breaker = aiobreaker.CircuitBreaker(fail_max=5, timeout_duration=timedelta(seconds=2))

    async def _call(self, breaker: Any, fn: Callable[[], Awaitable[Any]]) -> Any:
        import tenacity

        async def timed() -> Any:
            async with asyncio.timeout(self._timeout):
                return await fn()

        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(3),
            wait=tenacity.wait_random_exponential(multiplier=0.05, max=0.5),
            retry=tenacity.retry_if_exception(_transient),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await breaker.call_async(timed)
        raise AssertionError("unreachable")  # pragma: no cover

    async def retrieve(self, query: str) -> Retrieval:
        s = self._settings
        vectors = await self._call(self._embed_breaker, lambda: self._clients.embed([query], timeout_s=None))
        hits = await self._call(
            self._search_breaker, lambda: self._clients.search(vectors[0], s.candidates, timeout_s=None)
        )
        async with asyncio.timeout(self._timeout):
            top = await rerank_hits(self._reranker, self._passages, query, hits, s.top_k)
        return Retrieval(hits=top)


def _per_tenant_gates(tenants: Sequence[TenantPlan]) -> Callable[[str], Any]:
    """Per tenant an asyncio.Semaphore and an aiolimiter.AsyncLimiter, as their docs use them."""
    from aiolimiter import AsyncLimiter

    sems = {t.name: asyncio.Semaphore(t.max_concurrency) for t in tenants}
    rates = {t.name: AsyncLimiter(t.rate_per_s, 1.0) for t in tenants}

    @asynccontextmanager
    async def admit(tenant: str) -> AsyncIterator[None]:
        async with rates[tenant], sems[tenant]:
            yield

    return admit


class _TenantGates(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """The hand-composed stack's front door, as a user writes one from grpcio's interceptor API:
    each RPC passes its tenant's gate (``x-tenant-id`` metadata) before the handler runs."""

    def __init__(self, admit: Callable[[str], Any]) -> None:
        self._admit = admit

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        tenant = dict(details.invocation_metadata or ()).get(TENANT_KEY, "default")
        admit = self._admit
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request: Any, context: Any) -> Any:
                async with admit(tenant):
                    return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
                async with admit(tenant):
                    async for item in inner_stream(request, context):
                        yield item

            return grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


# -- ragguard ---------------------------------------------------------------------------------------


def bench_policy(tenants: Sequence[TenantPlan], *, adaptive: bool, deadline_s: float) -> Policy:
    """The ragguard contenders' policy: the demo's stage protections (typed breakers, attempt
    timeouts, retries), the tenants' quotas, and for the adaptive contender an adaptive limit on
    the service itself (stage ``retrieve``, around the whole pipeline: a request is shed before it
    does any work) and hedged vector-store searches."""
    common: dict[str, Any] = {
        "open_for_s": 2.0,
        "window_size": 20,
        "half_open_permits": 3,
        "minimum_calls": 10,
    }
    stages = {  # not the standard stage names: those bring their RAG presets' fallbacks
        "embed": StagePolicy(
            timeout_s=deadline_s / 2,
            breaker=BreakerPolicy(kind="embedding_timeout", slow_call_duration_s=deadline_s / 2, **common),
            retry=RetryPolicy(attempts=2, retry_on=("connection",)),
        ),
        "search": StagePolicy(
            timeout_s=deadline_s / 2,
            breaker=BreakerPolicy(kind="vector_store_unavailable", **common),
            retry=RetryPolicy(attempts=2, retry_on=("connection", "timeout"), initial_backoff_s=0.02),
            idempotent=True,
            hedge=HedgePolicy(quantile=0.95, min_delay_s=0.01) if adaptive else None,
        ),
        "rank": StagePolicy(
            timeout_s=deadline_s / 2,
            breaker=BreakerPolicy(kind="rerank_oom", **common),
        ),
    }
    if adaptive:
        stages["retrieve"] = StagePolicy(
            breaker=BreakerPolicy(kind="none"),
            adaptive=ADAPTIVE,
        )
    quotas = {
        t.name: TenantQuota(
            max_concurrency=t.max_concurrency,
            rate_per_s=t.rate_per_s,
            max_wait_s=0.0,
            timeout_s=deadline_s,
            priority=t.priority,  # type: ignore[arg-type]
        )
        for t in tenants
    }
    return Policy(stages=stages, tenants=quotas)


ADAPTIVE = AdaptivePolicy(
    min_limit=1,
    initial_limit=4,
    max_limit=32,  # twice the calls in flight at capacity with latency at the tolerance's edge
    # latency up to 3.5x the baseline before the limit shrinks: the service's own latency (its
    # in-process rerank on shared cores, the dependency's queue) reaches 2-3x the unloaded one
    # below the dependency's capacity, where nothing should be shed
    tolerance=2.5,
    percentile=0.5,
    window_s=0.1,
    min_samples=5,
    smoothing=0.5,
    probe_interval_s=60.0,  # each probe pins the limit at 2 for 10 calls: it costs a queue
    probe_samples=10,
    probe_limit=2,
    max_queue=6.0,
    early_queue=2.0,
    # half the deadline, the other half for the call: when the capacity halves, the well-behaved
    # tenants alone use about 60% of it, and a quarter-second wait shed 3-8% of their calls behind a
    # moment's stall of the service (issue 32)
    max_wait_s=0.5,
)
"""The adaptive contender's limit on its ``retrieve`` stage."""


class RagguardPipeline:
    """embed -> search -> rerank, each a ragguard stage of ``guard`` (no fallbacks)."""

    def __init__(
        self,
        clients: BackendClients,
        reranker: Reranker,
        passages: Sequence[Passage],
        settings: PipelineSettings,
        guard: Guard,
    ) -> None:
        from ragguard import remaining

        self._settings = settings
        self._passages = passages
        self._reranker = reranker

        async def embed(texts: list[str]) -> Any:
            return await clients.embed(texts, timeout_s=remaining())

        async def search(vector: Any, k: int) -> list[Hit]:
            return await clients.search(vector, k, timeout_s=remaining())

        async def rerank(query: str, hits: list[Hit]) -> tuple[Hit, ...]:
            return await rerank_hits(reranker, passages, query, hits, settings.top_k)

        self._embed = guard.guard("embed")(embed)
        self._search = guard.guard("search")(search)
        self._rerank = guard.guard("rank")(rerank)
        # the service itself: a stage around the whole pipeline (only the adaptive contender's
        # policy configures it; elsewhere it has only its attempt timer, which the deadline bounds)
        self.retrieve = guard.guard("retrieve")(self._retrieve)  # type: ignore[method-assign]

    async def retrieve(self, query: str) -> Retrieval:
        return await self._retrieve(query)

    async def _retrieve(self, query: str) -> Retrieval:
        vectors = await self._embed([query])
        hits = await self._search(vectors[0], self._settings.candidates)
        top = await self._rerank(query, hits)
        return Retrieval(hits=tuple(top))


def tenant_plans(capacity_rps: float) -> list[TenantPlan]:
    """The bench's tenants and their quotas, sized to the dependency's nominal capacity: four
    well-behaved interactive tenants (each sends 7.5% of capacity; its quota: 8 in flight and 20%
    of capacity a second, room for its bursts), a heavy interactive tenant and a batch job, their
    quotas together overcommitting the capacity as shared services' quotas do."""
    out = [
        TenantPlan(n, "interactive", 8, round(0.2 * capacity_rps, 2), True)
        for n in ("acme", "globex", "initech", "umbrella")
    ]
    out.append(TenantPlan("hoarder", "interactive", 8, round(0.6 * capacity_rps, 2), False))
    out.append(TenantPlan("nightly", "batch", 8, round(0.5 * capacity_rps, 2), False))
    return out


def by_name(plans: Sequence[TenantPlan]) -> Mapping[str, TenantPlan]:
    return {p.name: p for p in plans}
