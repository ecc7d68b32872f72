"""The RAG presets, apart from the generic core: what the embedding, vector-store, rerank and
generation stages add to their layers (see :mod:`ragguard.rag._presets` for the table).

``EmbeddingCache`` is the embedding stage's cache, ``BatchLimiter`` the rerank stage's learnt batch
limit, :func:`token_accounts` a Guard's per-tenant token accounts (the generation stage's pacing and
token quota), :func:`count_tokens` the default token counter; :class:`Partial` what a generation
stage's continuation is given (``partial=``), :class:`Overlap` the trim of what it repeats,
:class:`FallbackMiss` what a fallback or continuation raises when it has no answer;
:func:`register_preset` adds a preset of your own; :func:`release_memory_on_oom` empties an ML
framework's cached memory after an out-of-memory error (the CrossEncoder recipe of docs/sync.md).
"""

from ..layers import PRESETS, preset, register_preset
from ..layers._fallback import FallbackMiss
from ..quotas import TokenAccounts
from ._args import ArgRef
from ._cache import EmbeddingCache, normalise_text
from ._continuation import MAX_OVERLAP_CHARS, Overlap, Partial
from ._counting import Usage, count_tokens, token_accounts
from ._memory import empty_framework_cache, release_memory_on_oom
from ._presets import EmbeddingPreset, GenerationPreset, RerankPreset, VectorStorePreset
from ._rerank import BatchLimiter, score_of

__all__ = [
    "MAX_OVERLAP_CHARS",
    "PRESETS",
    "ArgRef",
    "BatchLimiter",
    "EmbeddingCache",
    "EmbeddingPreset",
    "FallbackMiss",
    "GenerationPreset",
    "Overlap",
    "Partial",
    "RerankPreset",
    "TokenAccounts",
    "Usage",
    "VectorStorePreset",
    "count_tokens",
    "empty_framework_cache",
    "normalise_text",
    "preset",
    "register_preset",
    "release_memory_on_oom",
    "score_of",
    "token_accounts",
]
