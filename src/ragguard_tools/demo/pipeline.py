"""The RAG pipeline: embed the query, search the vector store, rerank the candidates, and
answer from the top passages with the generator's stream.

:class:`BackendClients` calls the embedding, vector-store and generator services over gRPC.
:class:`UnguardedPipeline` is what a service looks like without ragguard: plain calls with plain
timeouts, any failure fails the request. The guarded version is in :mod:`ragguard_tools.demo.guarded`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

import anyio.to_thread
import grpc
import numpy as np
import numpy.typing as npt

from ragguard import ConfigError, InvalidInput
from ragguard.grpc import TENANT_KEY, snappy_channel

from . import _wire
from .backends import DEPLOYMENTS, BackendAddresses
from .corpus import Passage
from .rerank import Reranker

__all__ = [
    "Answer",
    "BackendClients",
    "Hit",
    "Pipeline",
    "PipelineSettings",
    "Retrieval",
    "UnguardedPipeline",
]


@dataclass(frozen=True, slots=True)
class Hit:
    """One returned passage (index ``pid`` in the corpus) with its ``score``."""

    pid: int
    score: float


@dataclass(frozen=True, slots=True)
class Retrieval:
    """A pipeline's answer: the top passages, best first, and the fallbacks that served it."""

    hits: tuple[Hit, ...]
    fallbacks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Answer:
    """A pipeline's streamed answer: ``words`` (an async generator: iterate once; ``aclose()``
    stops it early and cancels the generator's call), the ``retrieval`` it answers from, and
    ``fallbacks()``: every fallback that served the request, complete once the words are done."""

    retrieval: Retrieval
    words: AsyncIterator[str]
    fallbacks: Callable[[], tuple[str, ...]]


class Pipeline(Protocol):
    async def retrieve(self, query: str) -> Retrieval: ...

    async def answer(self, query: str, *, tenant: str) -> Answer: ...


@dataclass(frozen=True, slots=True)
class PipelineSettings:
    """``candidates`` passages are searched and reranked down to ``top_k``, and the answer is
    ``answer_words`` words generated from the ``top_k``; timeouts in seconds are the plain
    per-call timeouts of the unguarded pipeline (``generate_timeout_s``: the whole stream)."""

    top_k: int = 5
    candidates: int = 20
    answer_words: int = 30
    embed_timeout_s: float = 10.0
    search_timeout_s: float = 10.0
    generate_timeout_s: float = 10.0


class BackendClients:
    """gRPC clients of the embedding, vector-store and generator services (one channel each, and
    one per deployment of the generator: none without its address).

    ``interceptors`` go on both channels (the guarded service passes
    :func:`ragguard.grpc.client_interceptors`); ``snappy=True`` asks for Snappy responses.
    """

    def __init__(
        self,
        addresses: BackendAddresses,
        *,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
        snappy: bool = False,
    ) -> None:
        opts = _wire.CHANNEL_OPTIONS
        self._embed_channel = grpc.aio.insecure_channel(
            addresses.embedding, options=opts, interceptors=list(interceptors) or None
        )
        self._vector_channel = grpc.aio.insecure_channel(
            addresses.vector_store, options=opts, interceptors=list(interceptors) or None
        )
        embed_target: Any = snappy_channel(self._embed_channel) if snappy else self._embed_channel
        vector_target: Any = snappy_channel(self._vector_channel) if snappy else self._vector_channel
        self._embed = _wire.unary(embed_target, _wire.EMBEDDING, "Embed")
        self._search = _wire.unary(vector_target, _wire.VECTOR_STORE, "Search")
        self._generator_channels: list[grpc.aio.Channel] = []
        self._generate: dict[str, Any] = {}
        for deployment in DEPLOYMENTS:
            address = addresses.generator(deployment)
            if not address:
                continue
            channel = grpc.aio.insecure_channel(
                address, options=opts, interceptors=list(interceptors) or None
            )
            self._generator_channels.append(channel)
            target: Any = snappy_channel(channel) if snappy else channel
            self._generate[deployment] = _wire.stream(target, _wire.GENERATOR, "Generate")

    async def embed(self, texts: list[str], *, timeout_s: float | None = None) -> npt.NDArray[np.float32]:
        """Vectors (len(texts), 256); ``timeout_s`` is the gRPC timeout (None: none, or the ragguard
        deadline with client_interceptors). Raises grpc.aio.AioRpcError (DEADLINE_EXCEEDED,
        UNAVAILABLE...)."""
        reply = await self._embed({"texts": texts}, timeout=timeout_s)
        return _wire.decode_vectors(reply["vectors"])

    async def search(
        self, vector: npt.NDArray[np.float32], k: int, *, timeout_s: float | None = None
    ) -> list[Hit]:
        """The ``k`` nearest passages by inner product. Raises grpc.aio.AioRpcError."""
        reply = await self._search(
            {"vector": _wire.encode_vectors(vector.reshape(1, -1)), "k": k}, timeout=timeout_s
        )
        return [Hit(int(i), float(s)) for i, s in zip(reply["ids"], reply["scores"], strict=True)]

    async def generate(
        self,
        question: str,
        passages: list[str],
        *,
        max_words: int,
        deployment: str = DEPLOYMENTS[0],
        prefix: str = "",
        tenant: str | None = None,
        timeout_s: float | None = None,
    ) -> AsyncGenerator[str, None]:
        """The answer of the generator's ``deployment`` to ``question`` from ``passages``, word by
        word (at most ``max_words`` in all, unless a fault makes it run long); after ``prefix``
        (the start of an answer to continue) from the prefix's last word on. ``tenant`` goes out
        as ``x-tenant-id`` (with client_interceptors the tenant block's does); ``timeout_s`` bounds
        the whole stream. Raises grpc.aio.AioRpcError; closing the generator early cancels the
        call, and ConfigError without that deployment's address."""
        generate = self._generate.get(deployment)
        if generate is None:
            raise ConfigError(f"BackendClients: no address for the generator's deployment {deployment!r:.20}")
        metadata = None if tenant is None else ((TENANT_KEY, tenant),)
        request: dict[str, Any] = {"question": question, "passages": passages, "max_words": max_words}
        if prefix:
            request["prefix"] = prefix
        call = generate(request, timeout=timeout_s, metadata=metadata)
        try:
            async for message in call:
                text = message.get("text")
                if not isinstance(text, str):
                    raise InvalidInput("malformed generator message: expected a text field")
                yield text
        finally:
            call.cancel()  # a no-op once the stream ended; stops the generator when we stopped early

    def model(self, deployment: str, max_words: int) -> Callable[..., AsyncGenerator[str, None]]:
        """Deployment ``deployment`` of the model as an async generator function ``(question,
        passages, prefix="")``: :meth:`generate` of ``max_words`` words (what a model group binds;
        named ``model_<deployment>``)."""

        async def model(question: str, passages: list[str], prefix: str = "") -> AsyncGenerator[str, None]:
            words = self.generate(
                question, passages, max_words=max_words, deployment=deployment, prefix=prefix
            )
            async with aclosing(words):
                async for word in words:
                    yield word

        model.__name__ = f"model_{deployment}"
        return model

    async def close(self) -> None:
        await self._embed_channel.close()
        await self._vector_channel.close()
        for channel in self._generator_channels:
            await channel.close()


async def rerank_hits(
    reranker: Reranker, passages: Sequence[Passage], query: str, hits: Sequence[Hit], top_k: int
) -> tuple[Hit, ...]:
    """Rerank ``hits`` in a worker thread (CPU-bound); raises RerankOutOfMemoryError."""
    pids = [h.pid for h in hits]
    texts = [passages[p].text for p in pids]
    scored = await anyio.to_thread.run_sync(reranker.rerank, query, pids, texts, top_k)
    return tuple(Hit(s.pid, s.score) for s in scored)


class UnguardedPipeline:
    """embed -> search -> rerank with plain timeouts; the first failure fails the request."""

    def __init__(
        self,
        clients: BackendClients,
        reranker: Reranker,
        passages: Sequence[Passage],
        settings: PipelineSettings | None = None,
    ) -> None:
        self._clients = clients
        self._reranker = reranker
        self._passages = passages
        self._settings = settings or PipelineSettings()

    async def retrieve(self, query: str) -> Retrieval:
        s = self._settings
        vector = (await self._clients.embed([query], timeout_s=s.embed_timeout_s))[0]
        hits = await self._clients.search(vector, s.candidates, timeout_s=s.search_timeout_s)
        top = await rerank_hits(self._reranker, self._passages, query, hits, s.top_k)
        return Retrieval(hits=top)

    async def answer(self, query: str, *, tenant: str) -> Answer:
        """Retrieve, then stream the generator's answer from the top passages; ``tenant`` goes
        out with the generator call. Nothing bounds a slow start or a stall but the plain
        timeout of the whole stream."""
        s = self._settings
        retrieval = await self.retrieve(query)
        passages = [self._passages[h.pid].text for h in retrieval.hits]
        words = self._clients.generate(
            query, passages, max_words=s.answer_words, tenant=tenant, timeout_s=s.generate_timeout_s
        )
        return Answer(retrieval, words, _none)


def _none() -> tuple[str, ...]:
    return ()
