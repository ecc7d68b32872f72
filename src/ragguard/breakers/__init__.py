"""Circuit breakers: the state machine, sliding windows, classifiers and the typed breakers.

::

    breaker = VectorStoreUnavailableBreaker(clock=clock)
    hits = await breaker.call(store.search, vec, k=20)     # raises VectorStoreUnavailable when open

A plain :class:`CircuitBreaker` takes resilience4j's options in snake_case with units, validated
once into a frozen :class:`BreakerConfig` (``breaker.config``); :func:`classify_outcome` is the one
rule that turns a call's end into an outcome. The three typed breakers preset the options for a RAG
pipeline's embedding, vector-store and rerank stages.
"""

from ._aiobreaker import from_aiobreaker
from ._breaker import CircuitBreaker
from ._classify import (
    counts_by_default,
    counts_outages,
    counts_overloads,
    is_connection_error,
    is_out_of_memory,
    is_timeout,
)
from ._options import BreakerConfig
from ._outcome import classify_outcome
from ._protocol import AsyncBreaker, Breaker
from ._state import BreakerState
from ._typed import EmbeddingTimeoutBreaker, RerankOOMBreaker, VectorStoreUnavailableBreaker

__all__ = [
    "AsyncBreaker",
    "Breaker",
    "BreakerConfig",
    "BreakerState",
    "CircuitBreaker",
    "EmbeddingTimeoutBreaker",
    "RerankOOMBreaker",
    "VectorStoreUnavailableBreaker",
    "classify_outcome",
    "counts_by_default",
    "counts_outages",
    "counts_overloads",
    "from_aiobreaker",
    "is_connection_error",
    "is_out_of_memory",
    "is_timeout",
]
