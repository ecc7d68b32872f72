"""The RAG presets, apart from the generic core: what the embedding, vector-store and rerank
stages add to their layers (see :mod:`ragguard.rag._presets` for the table).

``EmbeddingCache`` is the embedding stage's cache, ``BatchLimiter`` the rerank stage's learnt batch
limit; :func:`register_preset` adds a preset of your own.
"""

from ._args import ArgRef
from ._cache import EmbeddingCache, normalise_text
from ._presets import PRESETS, EmbeddingPreset, RerankPreset, VectorStorePreset, preset, register_preset
from ._rerank import BatchLimiter, score_of

__all__ = [
    "PRESETS",
    "ArgRef",
    "BatchLimiter",
    "EmbeddingCache",
    "EmbeddingPreset",
    "RerankPreset",
    "VectorStorePreset",
    "normalise_text",
    "preset",
    "register_preset",
    "score_of",
]
