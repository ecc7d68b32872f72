"""LlamaIndex (``llama-index-core``), guarded: ``pip install '/path/to/ragguard[llama-index]'``.

::

    from ragguard.integrations.llama_index import (
        GuardedEmbedding, GuardedPostprocessor, GuardedRetriever)

    Settings.embed_model = GuardedEmbedding(OpenAIEmbedding(max_retries=0))
    engine = index.as_query_engine()               # or build one from the pieces:
    retriever = GuardedRetriever(index.as_retriever(similarity_top_k=20), fallback=bm25.aretrieve)
    reranker = GuardedPostprocessor(SentenceTransformerRerank(top_n=5))
    engine = RetrieverQueryEngine.from_args(retriever, node_postprocessors=[reranker])
    answer = await engine.aquery(question)

- :class:`GuardedEmbedding` wraps an embedding model: its async query and text embeddings run as
  the embedding stage (``embedding``), the stage's cache keyed by the model's name, the kind
  (query or text: some models embed them differently) and the text;
- :class:`GuardedRetriever` wraps a retriever: ``aretrieve`` runs as the vector-store stage
  (``vector_store``), ``fallback`` (a retriever, or a callable of the ``QueryBundle``, e.g. a
  BM25 retriever's) serving when the store fails or its breaker is open;
- :class:`GuardedPostprocessor` wraps a node postprocessor (a reranker): ``apostprocess_nodes``
  runs as the rerank stage (``rerank``): the nodes scored in chunks under a learnt batch limit
  after an out-of-memory error, then the nodes unreranked (``skip_rerank``); the result is cut to
  the reranker's ``top_n`` either way.

Each runs async (``aquery``, ``aretrieve``, ``aget_query_embedding``...); the sync methods raise
TypeError, since a guarded call runs on the event loop. The current tenant goes out in the Guard's
``tenant_header`` (or the one the wrapper names) from the clients that read the call's context:
qdrant-client's (a Qdrant retriever's searches, REST and gRPC), and any httpx client given
:func:`~ragguard.integrations.send_tenant_header` as a request hook (an embedding model's own SDK
client: ``OpenAIEmbedding(async_http_client=httpx.AsyncClient(event_hooks=...))``); fallbacks
included.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ragguard import Guard

from .._extras import install_hint
from ._common import Stages, fallback_name, header_option, sending_tenant

try:
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from llama_index.core.bridge.pydantic import PrivateAttr
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise ImportError(
        f"ragguard's llama-index integration needs llama-index-core: {install_hint('llama-index')}"
    ) from exc

__all__ = ["GuardedEmbedding", "GuardedPostprocessor", "GuardedRetriever"]


def _sync(name: str) -> TypeError:
    return TypeError(f"{name} runs async only (the a... methods): ragguard guards the event loop's calls")


class GuardedEmbedding(BaseEmbedding):
    """``embed_model``'s async embeddings as stage ``stage`` of ``guard`` (None: the default
    registry at each call); ``tenant_header`` the header the tenant travels in (None: the
    Guard's); see the module docstring."""

    _inner: Any = PrivateAttr()
    _embed: Any = PrivateAttr()
    _prefix: str = PrivateAttr()

    def __init__(
        self,
        embed_model: Any,
        stage: str = "embedding",
        *,
        guard: Guard | None = None,
        tenant_header: str | None = None,
    ) -> None:
        super().__init__(model_name=embed_model.model_name, embed_batch_size=embed_model.embed_batch_size)
        self._inner = embed_model
        self._prefix = f"{embed_model.model_name!r}|"
        stages, header = Stages(guard), header_option(tenant_header)

        async def embed(keys: list[str], texts: list[str], query: bool) -> list[Any]:
            with sending_tenant(stages.tenant_header(header)):
                if query:
                    return [await embed_model.aget_query_embedding(texts[0])]
                return list(await embed_model.aget_text_embedding_batch(texts))

        self._embed = stages.decorate(stage, embed, texts="keys")

    def _key(self, kind: str, text: str) -> str:
        return f"{self._prefix}{kind}|{text}"

    @classmethod
    def class_name(cls) -> str:
        return "GuardedEmbedding"

    async def _aget_query_embedding(self, query: str) -> Any:
        return (await self._embed([self._key("query", query)], [query], True))[0]

    async def _aget_text_embedding(self, text: str) -> Any:
        return (await self._embed([self._key("text", text)], [text], False))[0]

    async def _aget_text_embeddings(self, texts: list[str]) -> Any:
        return list(await self._embed([self._key("text", t) for t in texts], texts, False))

    def _get_query_embedding(self, query: str) -> Any:
        raise _sync("GuardedEmbedding")

    def _get_text_embedding(self, text: str) -> Any:
        raise _sync("GuardedEmbedding")


class GuardedRetriever(BaseRetriever):
    """``retriever.aretrieve`` as stage ``stage`` (default ``vector_store``) of ``guard``;
    ``fallback`` a retriever or a callable of the ``QueryBundle`` (or a sequence of them);
    ``tenant_header`` the header the tenant travels in (None: the Guard's)."""

    def __init__(
        self,
        retriever: Any,
        stage: str = "vector_store",
        *,
        guard: Guard | None = None,
        fallback: Any = None,
        tenant_header: str | None = None,
    ) -> None:
        super().__init__(callback_manager=getattr(retriever, "callback_manager", None))
        self.retriever = retriever
        stages, header = Stages(guard), header_option(tenant_header)

        def sending() -> Any:
            return sending_tenant(stages.tenant_header(header))

        async def retrieve(query_bundle: Any) -> Any:
            with sending():
                return await retriever.aretrieve(query_bundle)

        chain = fallback if isinstance(fallback, (list, tuple)) else (fallback,) if fallback else ()
        served = tuple(_retrieving(f, sending) for f in chain) or None
        self._guarded = stages.decorate(stage, retrieve, fallback=served)

    async def _aretrieve(self, query_bundle: Any) -> Any:
        return await self._guarded(query_bundle)

    def _retrieve(self, query_bundle: Any) -> Any:
        raise _sync("GuardedRetriever")


def _retrieving(fallback: Any, sending: Callable[[], Any]) -> Callable[..., Any]:
    """``fallback`` (a retriever, or a callable of the ``QueryBundle``) as a fallback of the
    retrieve call, sending the tenant header as the retriever does."""
    method = fallback.aretrieve if isinstance(fallback, BaseRetriever) else fallback

    async def serve(query_bundle: Any) -> Any:
        with sending():
            produced = method(query_bundle)
            return await produced if inspect.isawaitable(produced) else produced

    serve.__name__ = fallback_name(fallback)
    return serve


class GuardedPostprocessor(BaseNodePostprocessor):
    """``postprocessor.apostprocess_nodes`` as stage ``stage`` (default ``rerank``) of ``guard``;
    see the module docstring."""

    _inner: Any = PrivateAttr()
    _rerank: Any = PrivateAttr()

    def __init__(
        self,
        postprocessor: Any,
        stage: str = "rerank",
        *,
        guard: Guard | None = None,
        tenant_header: str | None = None,
    ) -> None:
        super().__init__()
        self._inner = postprocessor
        stages, header = Stages(guard), header_option(tenant_header)

        async def rerank(query_bundle: Any, nodes: list[Any]) -> list[Any]:
            with sending_tenant(stages.tenant_header(header)):
                return list(await postprocessor.apostprocess_nodes(nodes, query_bundle))

        self._rerank = stages.decorate(stage, rerank)

    @classmethod
    def class_name(cls) -> str:
        return "GuardedPostprocessor"

    async def _apostprocess_nodes(self, nodes: list[Any], query_bundle: Any = None) -> list[Any]:
        ranked: list[Any] = await self._rerank(query_bundle, nodes)
        top_n = getattr(self._inner, "top_n", None)
        return ranked[:top_n] if isinstance(top_n, int) and top_n > 0 else ranked

    def _postprocess_nodes(self, nodes: list[Any], query_bundle: Any = None) -> list[Any]:
        raise _sync("GuardedPostprocessor")
