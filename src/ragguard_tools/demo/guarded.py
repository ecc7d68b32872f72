"""The demo's RAG pipeline guarded by ragguard: a file to copy into your own service.

Six guarded stages and two model groups, one :class:`ragguard.Guard` (an independent registry)
for all of them::

    answer(query)            retrieve, then stream the answer:
      candidates(query, k)   "retrieval": embed + vector search as one step; no breaker of its own;
                             fallback: keyword_search(query, k), BM25 over the same passages
        embed(texts)         "embedding": slow-call breaker, 0.5 s attempts; its preset answers a
                             failure from the embedding cache it fills on success (embedding_cache)
        search(vector, k)    "vector_store": connection breaker, one retry on a refused connection
      rerank(query, hits)    "rerank": on out-of-memory, every hit is scored in chunks under a
                             learnt batch limit (chunked_rerank); then skip_rerank
      generate(q, passages)  "generation": the answer's stream, from the model group "model":
        model a, model b     "model", keyed by deployment: each word within 0.4 s, a breaker
                             each; the group tries a, then b, before the first word only
                             before the first word: extractive_answer when both are out;
                             after it, a cut answer is continued: finish_on_model (the group
                             "model_continue": b first, given the words sent), then
                             finish_extractive (the rest of the answer without the model)

The fallback chain runs inside out. A failed embedding is answered from the cache; when the cache
misses, the embedding error (or an open breaker's fast failure) leaves ``candidates``, whose own
fallback answers by keyword search. A failed vector search takes the same way out. A fallback is
called with the arguments of the stage it serves, which is why the retrieval step exists:
``(query, k)`` is what keyword search needs, while ``embed`` only has the texts and ``search``
only the vector.

The answer's stream has a commit point. Until its first word reaches the caller, the group fails
over from a deployment that is down, stalls or whose breaker is open to the other, and the
extractive answer serves when both are out. After it, a stream that stalls or breaks is continued
from the words the caller has: by the other deployment, told the answer so far (it starts again at
the last word, a repeat ragguard trims), and if that one fails too, by the rest of the answer
computed without the model. Every stream ends typed (completed, continued, incomplete): the gRPC
front door says which in the trailing metadata. The greedy tenant's words are delayed to its
``tokens_per_s``, never refused.

Call :meth:`GuardedPipeline.retrieve` or :meth:`GuardedPipeline.answer` inside a tenant block
(``ragguard.grpc.GuardServerInterceptor`` opens one per RPC; elsewhere ``async with
guard.tenant("acme"):``): the tenant's quota and deadline apply, and :func:`ragguard.degraded` then
names the fallbacks, failovers and continuations that served this request alone.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import aclosing
from typing import Any

import numpy as np
import numpy.typing as npt

import ragguard
from ragguard import (
    BreakerPolicy,
    ConfigError,
    GenerationPolicy,
    Guard,
    Policy,
    RetryPolicy,
    StagePolicy,
    TenantQuota,
)
from ragguard.options import DeploymentPolicy, GroupPolicy
from ragguard.rag import Partial

from .backends import DEPLOYMENTS
from .corpus import Passage
from .generator import extractive_answer, extractive_rest
from .keyword import KeywordIndex
from .pipeline import Answer, BackendClients, Hit, PipelineSettings, Retrieval, rerank_hits
from .rerank import Reranker

__all__ = ["GuardedPipeline", "demo_policy"]


def demo_policy(
    *,
    open_for_s: float = 2.0,
    tenant_timeout_s: float = 2.0,
    greedy: Mapping[str, TenantQuota] | None = None,
    default_quota: TenantQuota | None = None,
    known: Iterable[str] = (),
) -> Policy:
    """The demo's policy: short attempt timeouts and quick-to-trip breakers that stay open
    ``open_for_s`` seconds (scaled to the run), a ``tenant_timeout_s`` deadline per request, the
    given tenants' quotas (the greedy one), ``default_quota`` for each ``known`` tenant (listed, so
    each keeps its own) and for everyone else (who share one, as tenants not listed do).

    Raises ConfigError for an ``open_for_s`` that is not a positive number of seconds."""
    if not (open_for_s > 0 and math.isfinite(open_for_s)):
        raise ConfigError(f"open_for_s must be > 0 seconds, got {open_for_s}")
    trip: dict[str, Any] = {"open_for_s": open_for_s, "window_size": 20, "half_open_permits": 3}
    stages = {
        "embedding": StagePolicy(
            timeout_s=0.5,
            breaker=BreakerPolicy(
                kind="embedding_timeout", slow_call_duration_s=0.3, slow_call_rate_threshold=30.0,
                minimum_calls=5, **trip,
            ),
            retry=RetryPolicy(attempts=1),
        ),
        "vector_store": StagePolicy(
            timeout_s=0.5,
            breaker=BreakerPolicy(kind="vector_store_unavailable", minimum_calls=5, **trip),
            retry=RetryPolicy(attempts=2, retry_on=("connection",), initial_backoff_s=0.02),
        ),
        "rerank": StagePolicy(
            breaker=BreakerPolicy(
                kind="rerank_oom", consecutive_failures_threshold=3, minimum_calls=3, **trip
            ),
            rerank_min_batch=4,  # the floor of the learnt batch limit: only an OOM there counts
        ),
        # the answer: its first word within 0.6 s, failover included (then the extractive
        # answer), a breaker per deployment below it (none of its own), no retry (the group
        # fails over)
        "generation": StagePolicy(
            generation=GenerationPolicy(first_item_s=0.6, idle_s=0.5, total_s=5.0, estimate_tokens=64),
            retry=RetryPolicy(attempts=1),
        ),
        # each deployment of the model: a key of its own, each word within 0.4 s
        "model": StagePolicy(
            timeout_s=0.4,
            breaker=BreakerPolicy(kind="generic", failure_rate_threshold=50.0, minimum_calls=5, **trip),
            retry=RetryPolicy(attempts=1),
        ),
    }
    a, b = DEPLOYMENTS
    groups = {  # the same two deployments (keys of "model"): a first, and b first for continuations
        "model": GroupPolicy(stage="model", deployments=[
            DeploymentPolicy(name=a), DeploymentPolicy(name=b, priority=1)]),
        "model_continue": GroupPolicy(stage="model", deployments=[
            DeploymentPolicy(name=b), DeploymentPolicy(name=a, priority=1)]),
    }  # fmt: skip
    base = default_quota or TenantQuota(max_concurrency=8, timeout_s=tenant_timeout_s)
    tenants = {**{t: base for t in known}, **dict(greedy or {})}
    return Policy(stages=stages, tenants=tenants, default_quota=base, groups=groups)


class GuardedPipeline:
    """embed -> search -> rerank -> generate, the same calls as the unguarded pipeline, guarded by
    ``guard``.

    ``clients`` should carry :func:`ragguard.grpc.client_interceptors` (the tenant and the
    remaining deadline go out with each backend call; failures come back classified).
    """

    def __init__(
        self,
        clients: BackendClients,
        reranker: Reranker,
        passages: Sequence[Passage],
        keyword: KeywordIndex,
        guard: Guard,
        settings: PipelineSettings | None = None,
    ) -> None:
        self._clients = clients
        self._reranker = reranker
        self._passages = passages
        self._keyword = keyword
        self._settings = settings or PipelineSettings()
        self.guard = guard
        # guard.guard(...) rather than @ragguard.guard on the methods: each pipeline has its own Guard
        self._embed = guard.guard("embedding", texts="texts")(self._embed_remote)
        self._search = guard.guard("vector_store")(self._search_remote)
        # embed + search as one step: its two stages have the breakers; the step adds the fallback
        self._candidates = guard.guard("retrieval", fallback=self.keyword_search, breaker=False)(
            self._vector_candidates
        )
        self._rerank = guard.guard("rerank", candidates="hits")(self._rerank_local)
        deployments = {d: self._deployment(d) for d in DEPLOYMENTS}
        self._model = guard.group("model", deployments)
        self._model_continue = guard.group("model_continue", deployments)
        # no breaker on the answer itself: each deployment has its own (a second one here would
        # count the same failures again)
        self._generate = guard.guard(
            "generation",
            fallback=self.extractive_answer,
            continuation=[self.finish_on_model, self.finish_extractive],
            breaker=False,
        )(self._generate_remote)

    async def retrieve(self, query: str) -> Retrieval:
        """The ``top_k`` passages for ``query``, best first, and the fallbacks that served it.

        Every failure of a dependency is served by a fallback (keyword search, skip rerank), so
        what is left to raise is a caller's mistake (InvalidInput) or a cancellation."""
        s = self._settings
        hits = await self._candidates(query, s.candidates)
        ranked = await self._rerank(query, hits)
        return Retrieval(hits=tuple(ranked[: s.top_k]), fallbacks=ragguard.degraded())

    async def answer(self, query: str, *, tenant: str | None = None) -> Answer:
        """Retrieve, then the model's answer from the top passages, word by word. The tenant
        block's tenant goes out with the call (``tenant`` is not needed: the client interceptors
        send it); ``fallbacks()`` is :func:`ragguard.degraded`. A stream that no continuation
        could finish raises (StreamTimeout, DeadlineExceeded...) after the words already sent."""
        retrieval = await self.retrieve(query)
        passages = [self._passages[h.pid].text for h in retrieval.hits]
        return Answer(retrieval, self._generate(query, passages), ragguard.degraded)

    def extractive_answer(self, question: str, passages: list[str]) -> list[str]:
        """The generation step's fallback, before the first word only: the top passage's first
        sentence, without the model."""
        return extractive_answer(question, passages, self._settings.answer_words)

    async def finish_on_model(
        self, question: str, passages: list[str], *, partial: Partial
    ) -> AsyncIterator[str]:
        """The first continuation of a cut answer: the model group, deployment b first, given the
        answer so far (``partial.text``) to go on from."""
        words = self._model_continue.stream(question, passages, prefix=partial.text or "")
        async with aclosing(words):
            async for word in words:
                yield word

    def finish_extractive(self, question: str, passages: list[str], *, partial: Partial) -> list[str]:
        """The last continuation: the rest of the answer after ``partial``, without the model."""
        return extractive_rest(passages, partial.text or "", self._settings.answer_words)

    def keyword_search(self, query: str, k: int) -> list[Hit]:
        """The retrieval step's fallback: BM25 over the same passages (about 0.2 ms, inline)."""
        return self._keyword.search(query, k)

    async def _vector_candidates(self, query: str, k: int) -> list[Hit]:
        vector = (await self._embed([query]))[0]
        return await self._search(vector, k)

    async def _embed_remote(self, texts: list[str]) -> npt.NDArray[np.float32]:
        return await self._clients.embed(texts)

    async def _search_remote(self, vector: npt.NDArray[np.float32], k: int) -> list[Hit]:
        return await self._clients.search(vector, k)

    async def _generate_remote(self, question: str, passages: list[str]) -> AsyncIterator[str]:
        # aclosing: when the guard cuts the stream, the deployment's call is cancelled at once
        words = self._model.stream(question, passages)
        async with aclosing(words):
            async for word in words:
                yield word

    def _deployment(self, name: str) -> Callable[..., AsyncIterator[str]]:
        """Deployment ``name`` of the model: its generator server's answer (``prefix``: the
        answer so far, for a continuation)."""
        clients, words = self._clients, self._settings.answer_words

        async def generate(question: str, passages: list[str], prefix: str = "") -> AsyncIterator[str]:
            stream = clients.generate(question, passages, max_words=words, deployment=name, prefix=prefix)
            async with aclosing(stream):
                async for word in stream:
                    yield word

        generate.__name__ = f"model_{name}"
        return generate

    async def _rerank_local(self, query: str, hits: list[Hit]) -> list[Hit]:
        # every hit comes back scored (top_k = all of them): the rerank stage merges chunks by score
        return list(await rerank_hits(self._reranker, self._passages, query, hits, len(hits)))
