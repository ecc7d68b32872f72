"""Fallbacks of the standard stages: cached embeddings, keyword search, smaller rerank batches."""

from ._cache import EmbeddingCache, normalise_text
from ._shrink import BatchShrinker

__all__ = ["BatchShrinker", "EmbeddingCache", "normalise_text"]
