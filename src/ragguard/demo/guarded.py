"""The same pipeline, guarded by ragguard.

* ``embedding``: typed slow-call breaker, attempt timeout; fallback: the embedding cache that the
  stage fills on every success (questions repeat, so the cache answers most of them).
* ``vector_store``: typed connection breaker; fallback: BM25 keyword search over the same passages.
* ``rerank``: typed out-of-memory breaker; on OOM a smaller batch, then no rerank.
* requests are admitted per tenant (:meth:`ragguard.Guard.tenant`) with quotas and deadlines.

When the embedding fails with nothing cached, the request goes straight to keyword search (marked
``keyword_search``): a degraded answer beats none.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from typing import Any

import anyio.to_thread
import grpc
import numpy as np
import numpy.typing as npt

from .._context import current_scope, degraded
from .._errors import BreakerOpen
from ..deadline import remaining
from ..guard import Guard
from ..policy import BreakerPolicy, Policy, RetryPolicy, StagePolicy, TenantQuota
from .corpus import Passage
from .keyword import KeywordIndex
from .pipeline import BackendClients, Hit, PipelineSettings, Retrieval
from .rerank import Reranker

__all__ = ["GuardedPipeline", "demo_policy"]

KEYWORD_FALLBACK = "keyword_search"


def demo_policy(
    *,
    open_for_s: float = 2.0,
    tenant_timeout_s: float = 2.0,
    greedy: Mapping[str, TenantQuota] | None = None,
    default_quota: TenantQuota | None = None,
) -> Policy:
    """The demo's policy: short attempt timeouts and quick-to-trip breakers that stay open
    ``open_for_s`` seconds (scaled to the run), a ``tenant_timeout_s`` deadline per request, the
    given tenants' quotas (the greedy one) and ``default_quota`` for everyone else."""
    if not (open_for_s > 0 and math.isfinite(open_for_s)):
        raise ValueError(f"open_for_s must be > 0 seconds, got {open_for_s}")
    common: dict[str, Any] = {"open_for_s": open_for_s, "window_size": 20, "half_open_permits": 3}
    stages = {
        "embedding": StagePolicy(
            timeout_s=0.5,
            breaker=BreakerPolicy(
                kind="embedding_timeout", slow_call_duration_s=0.3, slow_call_rate_threshold=30.0,
                minimum_calls=5, **common,
            ),
            retry=RetryPolicy(attempts=1),
        ),
        "vector_store": StagePolicy(
            timeout_s=0.5,
            breaker=BreakerPolicy(kind="vector_store_unavailable", minimum_calls=5, **common),
            retry=RetryPolicy(attempts=2, retry_on=("connection",), initial_backoff_s=0.02),
        ),
        "rerank": StagePolicy(
            timeout_s=None,
            breaker=BreakerPolicy(
                kind="rerank_oom", consecutive_failures_threshold=3, minimum_calls=3, **common
            ),
            retry=RetryPolicy(attempts=1, retry_on=()),
            rerank_min_batch=4,
        ),
    }
    base = default_quota or TenantQuota(max_concurrency=8, timeout_s=tenant_timeout_s)
    return Policy(stages=stages, tenants=dict(greedy or {}), default_quota=base)


class GuardedPipeline:
    """embed -> search -> rerank, each stage guarded by ``guard`` (an independent registry)."""

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

        async def keyword_search(query: str, vector: Any, k: int) -> list[Hit]:
            return keyword.search(query, k)

        self._embed = guard.guard("embedding", texts_arg=0)(self._embed_remote)
        self._search = guard.guard("vector_store", fallback=keyword_search)(self._search_remote)
        self._rerank = guard.guard("rerank", batch_arg=1)(self._rerank_local)

    async def _embed_remote(self, texts: list[str]) -> npt.NDArray[np.float32]:
        return await self._clients.embed(texts, timeout_s=remaining())

    async def _search_remote(self, query: str, vector: npt.NDArray[np.float32], k: int) -> list[Hit]:
        return await self._clients.search(vector, k, timeout_s=remaining())

    async def _rerank_local(self, query: str, hits: list[Hit]) -> list[Hit]:
        pids = [h.pid for h in hits]
        texts = [self._passages[p].text for p in pids]
        scored = await anyio.to_thread.run_sync(self._reranker.rerank, query, pids, texts, len(hits))
        return [Hit(s.pid, s.score) for s in scored]

    async def retrieve(self, query: str) -> Retrieval:
        if current_scope() is None:
            # Outside a tenant(...) block degraded() keeps each fallback name once for the whole
            # context; a child task (a copy of this context) makes it report this request alone.
            return await asyncio.create_task(self._retrieve(query))
        return await self._retrieve(query)

    async def _retrieve(self, query: str) -> Retrieval:
        s = self._settings
        seen = len(degraded())
        extra: tuple[str, ...] = ()
        try:
            vector = (await self._embed([query]))[0]
        except (BreakerOpen, TimeoutError, ConnectionError, grpc.aio.AioRpcError):
            hits = self._keyword.search(query, s.candidates)
            extra = (KEYWORD_FALLBACK,)
        else:
            hits = await self._search(query, vector, s.candidates)
        ranked = await self._rerank(query, list(hits))
        fallbacks = (*degraded()[seen:], *extra)
        return Retrieval(hits=tuple(ranked[: s.top_k]), fallbacks=fallbacks)
