"""The RAG service: a grpc.aio server with two RPCs, and its client.

- ``Retrieval/Retrieve``: ``{"query": str}`` -> ``{"hits": [{"pid", "score", "topics", "title"}],
  "fallbacks": [str]}``.
- ``Retrieval/Answer`` (server streaming): ``{"query": str}`` -> ``{"text": str}`` messages, one
  word of the generated answer each, then one last message shaped like Retrieve's reply (the
  passages answered from, and every fallback that served the request, generation's included).

The caller's tenant travels in the ``x-tenant-id`` metadata key (:data:`ragguard.grpc.TENANT_KEY`),
where :class:`ragguard.grpc.GuardServerInterceptor` reads it.

Errors become gRPC statuses: a query that is not a non-empty str of at most
:data:`MAX_QUERY_CHARS` characters INVALID_ARGUMENT; ragguard's errors (a quota rejection, an open
breaker with no fallback left, a spent deadline, a bad tenant id, a stream cut by its budget)
whatever the interceptor maps them to (:func:`ragguard.grpc.status_for`), a backend's deadline as
ragguard's client interceptors classify it too; a dependency's own
UNAVAILABLE or DEADLINE_EXCEEDED passes through (the unguarded service meets those); anything else
is INTERNAL. An Answer that fails after its first word ends with that status after the words
sent. The RPCs in flight are capped like any real service's: the unguarded service by gRPC's
``maximum_concurrent_rpcs`` (rejecting the excess with RESOURCE_EXHAUSTED before the tenant is
known), the guarded one by the interceptor's ``max_concurrent_rpcs`` alone (the tenant holding the
most gives way first).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, NoReturn

import grpc

from ragguard import InvalidInput, RagguardError
from ragguard.grpc import TENANT_KEY, RemoteDeadlineExceeded, snappy_channel

from . import _wire
from .corpus import Passage
from .pipeline import Pipeline, Retrieval

__all__ = ["MAX_QUERY_CHARS", "RetrievalClient", "RetrievalServer"]

MAX_QUERY_CHARS = 2000
_PASSED_THROUGH = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)


class RetrievalServer:
    """Serves ``pipeline`` on 127.0.0.1; ``interceptors`` (the guarded service:
    ``GuardServerInterceptor``) and ``compression`` are passed to ``grpc.aio.server``, and
    ``capacity`` as its ``maximum_concurrent_rpcs``. None: no limit of gRPC's own, for the guarded
    service, whose interceptor bounds its RPCs by tenant (gRPC's limit, tenant-blind, would count
    the refusals it sends and refuse the other tenants' calls)."""

    def __init__(
        self,
        pipeline: Pipeline,
        passages: Sequence[Passage],
        *,
        capacity: int | None,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        compression: grpc.Compression | None = None,
    ) -> None:
        if capacity is not None and capacity < 1:
            raise InvalidInput(f"RetrievalServer: capacity must be >= 1 or None, got {capacity}")
        self._pipeline = pipeline
        self._passages = passages
        self._server = grpc.aio.server(
            maximum_concurrent_rpcs=capacity,
            interceptors=list(interceptors) or None,
            compression=compression,
        )
        self._server.add_generic_rpc_handlers(
            (_wire.handler(_wire.RETRIEVAL, {"Retrieve": self._retrieve}, {"Answer": self._answer}),)
        )
        self.address = ""

    async def start(self) -> str:
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.address = f"127.0.0.1:{port}"
        return self.address

    async def stop(self, grace_s: float | None = None) -> None:
        await self._server.stop(grace_s)

    async def _retrieve(self, request: dict[str, Any], context: grpc.aio.ServicerContext) -> dict[str, Any]:
        query = _query(request)
        try:
            result = await self._pipeline.retrieve(query)
        except _DOOR_ERRORS:
            raise  # the GuardServerInterceptor turns these into statuses
        except Exception as exc:
            await _abort(context, exc)
        return self._reply(result, result.fallbacks)

    async def _answer(
        self, request: dict[str, Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[dict[str, Any]]:
        query = _query(request)
        try:
            answer = await self._pipeline.answer(query, tenant=_wire.tenant_of(context))
            try:
                async for word in answer.words:
                    yield {"text": word}
            finally:
                await _aclose(answer.words)  # closed here, in this task, when the call ends early
        except _DOOR_ERRORS:
            raise  # the GuardServerInterceptor turns these into statuses
        except Exception as exc:
            await _abort(context, exc)
        yield self._reply(answer.retrieval, answer.fallbacks())

    def _reply(self, result: Retrieval, fallbacks: Sequence[str]) -> dict[str, Any]:
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
            "fallbacks": list(fallbacks),
        }


def _query(request: dict[str, Any]) -> str:
    query = request.get("query")
    if not isinstance(query, str) or not query.strip() or len(query) > MAX_QUERY_CHARS:
        raise InvalidInput(f"query must be a non-empty str of at most {MAX_QUERY_CHARS} characters")
    return query


async def _aclose(words: AsyncIterator[str]) -> None:
    aclose = getattr(words, "aclose", None)
    if aclose is not None:
        await aclose()


_DOOR_ERRORS = (RagguardError, RemoteDeadlineExceeded)
"""What the guarded service leaves to its GuardServerInterceptor: ragguard's errors, and a
backend's DEADLINE_EXCEEDED as ragguard's client interceptors classify it (the request's own
deadline, propagated to the backend, ran out there: the request's DEADLINE_EXCEEDED). The door
answers them and tells how the answer's stream ended (``ragguard-stream-ending``)."""


async def _abort(context: grpc.aio.ServicerContext, exc: Exception) -> NoReturn:
    """End the call for ``exc``: a dependency's UNAVAILABLE or DEADLINE_EXCEEDED passes through
    (nothing served instead), anything else is INTERNAL."""
    if isinstance(exc, grpc.aio.AioRpcError):
        code = exc.code() if exc.code() in _PASSED_THROUGH else grpc.StatusCode.INTERNAL
        await context.abort(code, f"{exc.code().name}: {exc.details()}")
    await context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
    raise AssertionError("unreachable: abort raises")


class RetrievalClient:
    """A caller of the retrieval service. :meth:`retrieve` returns the decoded reply,
    :meth:`answer` the streamed messages; both raise grpc.aio.AioRpcError. ``tenant`` goes out as
    ``x-tenant-id`` metadata. ``snappy=True`` asks for Snappy-compressed responses (the server
    must run :class:`ragguard.grpc.SnappyServerInterceptor`)."""

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
        self._answer = _wire.stream(target, _wire.RETRIEVAL, "Answer")

    async def retrieve(self, tenant: str, query: str, *, timeout_s: float | None) -> dict[str, Any]:
        reply: dict[str, Any] = await self._call(
            {"query": query},
            timeout=timeout_s,
            metadata=((TENANT_KEY, tenant),),
        )
        return reply

    async def answer(
        self, tenant: str, query: str, *, timeout_s: float | None, trailers: dict[str, str] | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The Answer stream's messages (``{"text": word}``..., then the hits and fallbacks);
        ``timeout_s`` bounds the whole stream. Closing the generator early cancels the call.
        ``trailers``, when given, receives the stream's trailing metadata once it has ended
        (the guarded service's ``ragguard-stream-ending``...), on success as on a failure."""
        call = self._answer({"query": query}, timeout=timeout_s, metadata=((TENANT_KEY, tenant),))
        try:
            async for message in call:
                yield message
        finally:
            call.cancel()
            if trailers is not None and call.done() and not call.cancelled():
                said = await call.trailing_metadata() or ()
                trailers.update((k, v) for k, v in said if isinstance(v, str))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._channel.close()
