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

from ..layers._fallback import FallbackMiss
from ..layers._presets import register_preset
from . import _presets  # noqa: F401 - the presets register themselves into the core
from ._continuation import MAX_OVERLAP_CHARS, Overlap, Partial
from ._counting import Usage, count_tokens, token_accounts
from ._memory import empty_framework_cache, release_memory_on_oom

__all__ = [
    "MAX_OVERLAP_CHARS",
    "FallbackMiss",
    "Overlap",
    "Partial",
    "Usage",
    "count_tokens",
    "empty_framework_cache",
    "register_preset",
    "release_memory_on_oom",
    "token_accounts",
]
