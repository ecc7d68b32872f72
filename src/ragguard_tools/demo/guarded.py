"""The demo's RAG pipeline guarded by ragguard: a file to copy into your own service.

Six guarded stages and two model groups, one :class:`ragguard.Guard` (an independent registry)::

    answer(query)            retrieve, then stream the answer:
      candidates(query, k)   "retrieval": embed + vector search as one step; no breaker of its own;
                             fallback: keyword_search(query, k), BM25 over the same passages
        embed(texts)         "embedding": slow-call breaker, 0.5 s attempts; its preset answers a
                             failure from the embedding cache it fills on success (embedding_cache)
        search(vector, k)    "vector_store": connection breaker, one retry on a refused connection
      rerank(query, hits)    "rerank": on out-of-memory, every hit is scored in chunks under a
                             learnt batch limit (chunked_rerank); then skip_rerank
      generate(q, passages)  "generation": the stream of the model group "model" (deployment a,
                             then b); extractive_answer when both are out before the first word;
                             after it, continued: finish_on_model (group "model_continue": b
                             first), then finish_extractive (the rest, without the model)
        model a, model b     "model", keyed by deployment: a breaker each, each word within 0.4 s

A fallback is called with the arguments of the stage it serves, hence the retrieval step:
``(query, k)`` is what keyword search needs (``embed`` has the texts, ``search`` the vector).

The answer's stream has a commit point. Until its first word reaches the caller, the group fails
over from a deployment that is down, stalls or whose breaker is open to the other. After it, a
stream that stalls or breaks is continued from the words the caller has: by the other deployment,
told the answer so far (it starts again at the last word, a repeat ragguard trims), then by the
rest of the answer without the model. Every stream ends typed (completed, continued, incomplete),
told by the gRPC front door in trailing metadata. The greedy tenant's words are paced, never refused.

Call :meth:`GuardedPipeline.answer` (or ``retrieve``) in a tenant block (the
``GuardServerInterceptor`` opens one per RPC; elsewhere ``async with guard.tenant("acme"):``): its
quota and deadline apply, and :func:`ragguard.degraded` names what served this request alone.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

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
    each keeps its own) and for everyone else (who share one). ConfigError for a bad ``open_for_s``."""
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
        # the answer: its first word within 0.6 s, failover included; no retry (the group fails
        # over) and no breaker (each deployment has its own)
        "generation": StagePolicy(
            generation=GenerationPolicy(first_item_s=0.6, idle_s=0.5, total_s=5.0, estimate_tokens=64),
            retry=RetryPolicy(attempts=1),
        ),
        "model": StagePolicy(  # each deployment of the model: a key of its own
            timeout_s=0.4,
            breaker=BreakerPolicy(kind="generic", failure_rate_threshold=50.0, minimum_calls=5, **trip),
            retry=RetryPolicy(attempts=1),
        ),
    }
    # the same two deployments (keys of "model"), tried in order: a first, and b first for continuations
    groups = {
        name: GroupPolicy(stage="model", deployments=[DeploymentPolicy(name=d) for d in order])
        for name, order in (("model", DEPLOYMENTS), ("model_continue", DEPLOYMENTS[::-1]))
    }
    base = default_quota or TenantQuota(max_concurrency=8, timeout_s=tenant_timeout_s)
    tenants = {**{t: base for t in known}, **dict(greedy or {})}
    return Policy(stages=stages, tenants=tenants, default_quota=base, groups=groups)


class GuardedPipeline:
    """embed -> search -> rerank -> generate, the unguarded pipeline's calls guarded by ``guard``.
    ``clients`` should carry :func:`ragguard.grpc.client_interceptors` (the tenant and the
    remaining deadline go out with each backend call; failures come back classified)."""

    def __init__(
        self,
        clients: BackendClients,
        reranker: Reranker,
        passages: Sequence[Passage],
        keyword: KeywordIndex,
        guard: Guard,
        settings: PipelineSettings | None = None,
    ) -> None:
        self._reranker = reranker
        self._passages = passages
        self._keyword = keyword
        self._settings = settings or PipelineSettings()
        self.guard = guard
        # guard.guard(...) rather than @ragguard.guard on the methods: each pipeline has its own Guard
        self._embed = guard.guard("embedding", texts="texts")(clients.embed)
        self._search = guard.guard("vector_store")(clients.search)
        # embed + search as one step: its two stages have the breakers; the step adds the fallback
        self._candidates = guard.guard("retrieval", fallback=self.keyword_search, breaker=False)(
            self._vector_candidates
        )
        self._rerank = guard.guard("rerank", candidates="hits")(self._rerank_local)
        deployments = {d: clients.model(d, self._settings.answer_words) for d in DEPLOYMENTS}
        self._model = guard.group("model", deployments)
        self._model_continue = guard.group("model_continue", deployments)
        answer: Callable[[str, list[str]], AsyncIterator[str]] = self._model.stream
        # no breaker on the answer: each deployment has its own (this one would count twice)
        then = [self.finish_on_model, self.finish_extractive]
        self._generate = guard.guard(
            "generation", fallback=self.extractive_answer, continuation=then, breaker=False
        )(answer)

    async def retrieve(self, query: str) -> Retrieval:
        """The ``top_k`` passages for ``query``, best first, and the fallbacks that served it; a
        dependency's failure is served by a fallback: raises only InvalidInput (or is cancelled)."""
        s = self._settings
        hits = await self._candidates(query, s.candidates)
        ranked = await self._rerank(query, hits)
        return Retrieval(hits=tuple(ranked[: s.top_k]), fallbacks=ragguard.degraded())

    async def answer(self, query: str, *, tenant: str | None = None) -> Answer:
        """Retrieve, then the model's answer from the top passages, word by word (``tenant``: not
        needed, the client interceptors send the block's). A stream that no continuation could
        finish raises (DeadlineExceeded...) after the words sent."""
        retrieval = await self.retrieve(query)
        passages = [self._passages[h.pid].text for h in retrieval.hits]
        return Answer(retrieval, self._generate(query, passages), ragguard.degraded)

    def extractive_answer(self, question: str, passages: list[str]) -> list[str]:
        """The answer's fallback before its first word: the top passage's first sentence."""
        return extractive_answer(question, passages, self._settings.answer_words)

    def finish_on_model(self, question: str, passages: list[str], *, partial: Partial) -> AsyncIterator[str]:
        """A cut answer's first continuation: the model, b first, told the answer so far."""
        return self._model_continue.stream(question, passages, prefix=partial.text or "")

    def finish_extractive(self, question: str, passages: list[str], *, partial: Partial) -> list[str]:
        """The last continuation: the rest of the answer after ``partial``, without the model."""
        return extractive_rest(passages, partial.text or "", self._settings.answer_words)

    def keyword_search(self, query: str, k: int) -> list[Hit]:
        """The retrieval step's fallback: BM25 over the same passages (about 0.2 ms, inline)."""
        return self._keyword.search(query, k)

    async def _vector_candidates(self, query: str, k: int) -> list[Hit]:
        vector = (await self._embed([query]))[0]
        return await self._search(vector, k)

    async def _rerank_local(self, query: str, hits: list[Hit]) -> list[Hit]:
        # every hit comes back scored (top_k = all of them): the rerank stage merges chunks by score
        return list(await rerank_hits(self._reranker, self._passages, query, hits, len(hits)))
