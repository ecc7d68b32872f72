"""The named stage presets of a RAG pipeline, in a registry.

A preset is what makes a stage more than its generic layers: where its arguments live, what state
its functions share, the layers and fallbacks it adds. A stage takes a preset by name from its
policy (``StagePolicy.preset``); the standard stages ``embedding``, ``vector_store`` and
``rerank`` take the preset of the same name, and any stage may name one (``preset: rerank`` for a
stage called ``rerank_v2``). Arguments are declared, never guessed from keyword names:

- ``embedding``: ``texts=`` (a position or a name, default 0) says where the texts are. Adds a
  cache filled on every success and served first on failure (``embedding_cache``).
- ``vector_store``: no options; its typed breaker, and the user's ``fallback=`` (keyword search).
- ``rerank``: ``candidates=`` (default 1, the parameter after the query) says where the candidate
  list is, ``score=`` (item -> float; default the item's ``score`` attribute or key) how to merge
  chunks. Adds chunked rerank under a learnt batch limit, then ``skip_rerank`` as the last fallback.

:func:`register_preset` adds one (see :class:`ragguard.layers.StagePreset` for the contract).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._errors import ConfigError
from ..layers import Bound, Stage, StagePreset
from ..layers.fallback import Fallback
from ..pipeline import Layer
from ._args import ArgRef
from ._cache import EmbeddingCache
from ._embedding import CacheFallback, CacheTap
from ._rerank import BatchLimiter, ChunkedRerank, SkipRerank, score_of

__all__ = ["PRESETS", "EmbeddingPreset", "RerankPreset", "VectorStorePreset", "preset", "register_preset"]


class EmbeddingPreset:
    """``embedding``: the texts' embeddings are cached on success and served from the cache first
    when the embedding call fails (``cache_size``, ``cache_ttl_s`` in the stage policy)."""

    name = "embedding"
    streams = False
    option_names = frozenset({"texts", "texts_arg"})

    def resolve(self, fn: Callable[..., Any], given: Mapping[str, Any]) -> ArgRef:
        which = given.get("texts", given.get("texts_arg"))
        return ArgRef.resolve(fn, 0 if which is None else which, "texts")

    def state(self, stage: Stage) -> EmbeddingCache | None:
        policy = stage.policy
        if policy.cache_size <= 0:
            return None
        return EmbeddingCache(max_entries=policy.cache_size, ttl_s=policy.cache_ttl_s, clock=stage.clock)

    def layers(self, stage: Stage, bound: Bound) -> Sequence[Layer]:
        cache = stage.preset_state
        return () if cache is None else (CacheTap(cache, bound.resolved(self)),)

    def fallbacks(self, stage: Stage, bound: Bound, users: Sequence[Fallback]) -> Sequence[Fallback]:
        cache = stage.preset_state
        return tuple(users) if cache is None else (CacheFallback(cache, bound.resolved(self)), *users)


class VectorStorePreset:
    """``vector_store``: the typed breaker of its policy; fallbacks are the user's."""

    name = "vector_store"
    streams = True
    option_names: frozenset[str] = frozenset()

    def resolve(self, fn: Callable[..., Any], given: Mapping[str, Any]) -> None:
        return None

    def state(self, stage: Stage) -> None:
        return None

    def layers(self, stage: Stage, bound: Bound) -> Sequence[Layer]:
        return ()

    def fallbacks(self, stage: Stage, bound: Bound, users: Sequence[Fallback]) -> Sequence[Fallback]:
        return tuple(users)


class _RerankOptions:
    __slots__ = ("candidates", "score")

    def __init__(self, candidates: ArgRef, score: Callable[[Any], float]) -> None:
        self.candidates = candidates
        self.score = score


class RerankPreset:
    """``rerank``: chunked rerank under a learnt batch limit (floor ``rerank_min_batch``), then
    the user's fallbacks, then ``skip_rerank``."""

    name = "rerank"
    streams = False
    option_names = frozenset({"candidates", "batch_arg", "score"})

    def resolve(self, fn: Callable[..., Any], given: Mapping[str, Any]) -> _RerankOptions:
        which = given.get("candidates", given.get("batch_arg"))
        score = given.get("score")
        if score is not None and not callable(score):
            raise ConfigError(f"score must be a function item -> float, got {type(score).__name__}")
        return _RerankOptions(
            ArgRef.resolve(fn, 1 if which is None else which, "candidates"), score or score_of
        )

    def state(self, stage: Stage) -> BatchLimiter:
        return BatchLimiter(floor=stage.policy.rerank_min_batch, clock=stage.clock)

    def layers(self, stage: Stage, bound: Bound) -> Sequence[Layer]:
        options: _RerankOptions = bound.resolved(self)
        return (ChunkedRerank(stage.name, stage.preset_state, options.candidates, options.score),)

    def fallbacks(self, stage: Stage, bound: Bound, users: Sequence[Fallback]) -> Sequence[Fallback]:
        options: _RerankOptions = bound.resolved(self)
        return (*users, SkipRerank(options.candidates))


PRESETS: dict[str, StagePreset] = {
    p.name: p for p in (EmbeddingPreset(), VectorStorePreset(), RerankPreset())
}


def preset(name: str | None) -> StagePreset | None:
    """The preset called ``name`` (None for None); ConfigError naming the known ones otherwise."""
    if name is None:
        return None
    found = PRESETS.get(name)
    if found is None:
        raise ConfigError(f"unknown stage preset {name!r:.60}; known: {', '.join(sorted(PRESETS))}")
    return found


def register_preset(new: StagePreset) -> None:
    """Add ``new`` to the registry under ``new.name`` (replacing one of that name)."""
    for attr in ("name", "streams", "option_names", "resolve", "state", "layers", "fallbacks"):
        if not hasattr(new, attr):
            raise ConfigError(f"register_preset: {type(new).__name__} has no {attr!r} (see StagePreset)")
    if not isinstance(new.name, str) or not new.name:
        raise ConfigError(f"register_preset: name must be a non-empty str, got {new.name!r:.40}")
    PRESETS[new.name] = new
