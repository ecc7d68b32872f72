"""qdrant-client's ``AsyncQdrantClient``, guarded: ``pip install '/path/to/ragguard[qdrant]'``.

::

    from qdrant_client import AsyncQdrantClient
    from ragguard.integrations.qdrant import guard_qdrant

    store = guard_qdrant(AsyncQdrantClient(url=url), fallback=keyword_search)  # or prefer_grpc=True
    hits = await store.query_points("docs", query=vector, limit=10)

:func:`guard_qdrant` returns a client whose searches (``query_points``, ``query_batch_points``,
``query_points_groups``, ``search_matrix_pairs``, ``search_matrix_offsets``, and ``search``,
``search_batch``, ``search_groups``, ``recommend``, ``discover`` where the installed client still
has them) run as the vector-store stage (``stage``, default ``vector_store``): its timeout, the
typed breaker (``VectorStoreUnavailable`` when it is open and no fallback serves), retries (a 429's
``Retry-After``, REST or gRPC, is waited for when the policy allows it), and ``fallback`` for
``query_points`` (called with its arguments; it returns what ``query_points`` returns, e.g. from a
keyword index). Over REST and gRPC alike: qdrant-client's errors of both are classified. Each
search's ``timeout`` (whole seconds, as qdrant-client takes it) is the attempt's bound rounded up,
unless the call gives its own; the current tenant goes out in the Guard's ``tenant_header`` (or
the one ``guard_qdrant`` names), through qdrant-client's own context headers (REST and gRPC);
everything else of the client is its own, unguarded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import ragguard
from ragguard import Guard

from ._common import Stages, header_option, needs, sending_tenant

__all__ = ["guard_qdrant"]

SEARCHES = (
    "query_points",
    "query_batch_points",
    "query_points_groups",
    "search_matrix_pairs",
    "search_matrix_offsets",
    "search",
    "search_batch",
    "search_groups",
    "recommend",
    "discover",
)
"""The methods of ``AsyncQdrantClient`` that run as the vector-store stage (those it has)."""


def guard_qdrant(
    client: Any,
    *,
    guard: Guard | None = None,
    stage: str = "vector_store",
    fallback: Callable[..., Any] | Sequence[Callable[..., Any]] | None = None,
    tenant_header: str | None = None,
) -> GuardedQdrant:
    """``client`` (a ``qdrant_client.AsyncQdrantClient``) with its searches guarded as ``stage``
    by ``guard`` (None: the default registry at each call); see the module docstring.
    ``tenant_header``: the header the tenant travels in (None: the Guard's ``tenant_header``).
    Raises ConfigError for a bad ``guard`` or ``tenant_header``; ImportError with the install
    command when qdrant-client is missing."""
    needs("qdrant_client", "qdrant")
    header = header_option(tenant_header)
    return GuardedQdrant(client, stages=Stages(guard), stage=stage, fallback=fallback, tenant_header=header)


class GuardedQdrant:
    """What :func:`guard_qdrant` returns: the searches guarded; ``client`` the one it calls."""

    def __init__(
        self,
        client: Any,
        *,
        stages: Stages,
        stage: str,
        fallback: Callable[..., Any] | Sequence[Callable[..., Any]] | None,
        tenant_header: str | None = None,
    ) -> None:
        self.client = client
        for name in SEARCHES:
            method = getattr(client, name, None)
            if method is not None:
                served = fallback if name == "query_points" else None
                search = _bounded(method, stages, stage, tenant_header)
                setattr(self, name, stages.decorate(stage, search, fallback=served))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def _bounded(
    method: Callable[..., Any], stages: Stages, stage: str, tenant_header: str | None
) -> Callable[..., Any]:
    async def search(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("timeout") is None:
            bounds = [b for b in (stages.timeout_s(stage), ragguard.remaining()) if b is not None]
            if bounds:
                kwargs["timeout"] = max(1, math.ceil(min(bounds)))
        with sending_tenant(stages.tenant_header(tenant_header)):
            return await method(*args, **kwargs)

    search.__name__ = search.__qualname__ = getattr(method, "__name__", "search")
    return search
