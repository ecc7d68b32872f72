"""The RAG retrieval service: a grpc.aio server with one RPC, and its client.

``Retrieval/Retrieve``: ``{"tenant": str, "query": str}`` -> ``{"hits": [{"pid", "score", "topics",
"title"}], "fallbacks": [str]}``. The tenant also travels in the ``x-tenant-id`` metadata key, where
ragguard's :class:`~ragguard.grpc.GuardServerInterceptor` reads it.

Errors become gRPC statuses: a bad request INVALID_ARGUMENT, a quota rejection RESOURCE_EXHAUSTED
(with ``retry-after`` trailing metadata), a spent deadline DEADLINE_EXCEEDED, an open breaker or an
unreachable dependency UNAVAILABLE, anything else INTERNAL. The server's ``capacity`` caps the RPCs in
flight (gRPC rejects the excess with RESOURCE_EXHAUSTED), like any real service's limit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc

from .._context import validate_tenant_id
from .._errors import BreakerOpen, DeadlineExceeded, InvalidInput, QuotaExceeded
from ..grpc import TENANT_KEY, snappy_channel, status_for
from . import _wire
from .corpus import Passage
from .pipeline import Pipeline

__all__ = ["MAX_QUERY_CHARS", "TENANT_METADATA_KEY", "RetrievalClient", "RetrievalServer", "status_of"]

MAX_QUERY_CHARS = 2000
TENANT_METADATA_KEY = "x-tenant"

Admit = Callable[[str], AbstractAsyncContextManager[Any]]


def status_of(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status a failed request ends with (see the module docstring)."""
    if isinstance(exc, InvalidInput):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, QuotaExceeded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, DeadlineExceeded | TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(exc, BreakerOpen | ConnectionError):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(exc, grpc.aio.AioRpcError):
        code = exc.code()
        if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
            return code
    return grpc.StatusCode.INTERNAL


class RetrievalServer:
    """Serves ``pipeline`` on 127.0.0.1. ``admit(tenant)`` (e.g. ``ragguard.tenant``) wraps each
    request when given; ``interceptors`` and ``compression`` are passed to ``grpc.aio.server``."""

    def __init__(
        self,
        pipeline: Pipeline,
        passages: Sequence[Passage],
        *,
        capacity: int,
        admit: Admit | None = None,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        compression: grpc.Compression | None = None,
    ) -> None:
        if capacity < 1:
            raise InvalidInput(f"RetrievalServer: capacity must be >= 1, got {capacity}")
        self._pipeline = pipeline
        self._passages = passages
        self._admit = admit
        self._server = grpc.aio.server(
            maximum_concurrent_rpcs=capacity,
            interceptors=list(interceptors) or None,
            compression=compression,
        )
        self._server.add_generic_rpc_handlers((_wire.handler(_wire.RETRIEVAL, {"Retrieve": self._retrieve}),))
        self.address = ""

    async def start(self) -> str:
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.address = f"127.0.0.1:{port}"
        return self.address

    async def stop(self, grace_s: float | None = None) -> None:
        await self._server.stop(grace_s)

    async def _retrieve(self, request: dict[str, Any], context: grpc.aio.ServicerContext) -> dict[str, Any]:
        tenant = validate_tenant_id(request.get("tenant"))
        query = request.get("query")
        if not isinstance(query, str) or not query.strip() or len(query) > MAX_QUERY_CHARS:
            raise InvalidInput(f"query must be a non-empty str of at most {MAX_QUERY_CHARS} characters")
        try:
            if self._admit is None:
                result = await self._pipeline.retrieve(query)
            else:
                async with self._admit(tenant):
                    result = await self._pipeline.retrieve(query)
        except InvalidInput:
            raise
        except Exception as exc:
            mapped = status_for(exc)
            if mapped is not None:
                await context.abort(mapped[0], mapped[1], trailing_metadata=mapped[2])
            await context.abort(status_of(exc), f"{type(exc).__name__}: {exc}")
            raise  # unreachable: abort raises
        return {
            "hits": [
                {
                    "pid": h.pid,
                    "score": round(h.score, 5),
                    "topics": list(self._passages[h.pid].topics),
                    "title": self._passages[h.pid].title,
                }
                for h in result.hits
            ],
            "fallbacks": list(result.fallbacks),
        }


class RetrievalClient:
    """A caller of the retrieval service. :meth:`retrieve` returns the decoded reply or raises
    grpc.aio.AioRpcError. ``snappy=True`` asks for Snappy-compressed responses (the server must run
    :class:`~ragguard.grpc.SnappyServerInterceptor`)."""

    def __init__(
        self,
        address: str,
        *,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
        snappy: bool = False,
    ) -> None:
        self._channel = grpc.aio.insecure_channel(
            address, options=_wire.CHANNEL_OPTIONS, interceptors=list(interceptors) or None
        )
        target: Any = snappy_channel(self._channel) if snappy else self._channel
        self._call = _wire.unary(target, _wire.RETRIEVAL, "Retrieve")

    async def retrieve(self, tenant: str, query: str, *, timeout_s: float | None) -> dict[str, Any]:
        reply: dict[str, Any] = await self._call(
            {"tenant": tenant, "query": query},
            timeout=timeout_s,
            metadata=((TENANT_KEY, tenant),),
        )
        return reply

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._channel.close()
