"""Circuit breakers: the state machine, sliding windows, classifiers and the typed breakers.

::

    breaker = VectorStoreUnavailableBreaker(clock=clock)
    hits = await breaker.call(store.search, vec, k=20)     # raises VectorStoreUnavailable when open

A plain :class:`CircuitBreaker` takes resilience4j's options in snake_case with units, validated
once into a frozen :class:`BreakerConfig` (``breaker.config``); :func:`classify_outcome` is the one
rule that turns a call's end into an outcome. The three typed breakers preset the options for a RAG
pipeline's embedding, vector-store and rerank stages.
"""

from ._aiobreaker import AiobreakerBreaker, AiobreakerListenerAdapter, from_aiobreaker
from ._breaker import BreakerCallOutcome, BreakerMetrics, CircuitBreaker, Classifier
from ._classify import (
    counts_by_default,
    counts_outages,
    counts_overloads,
    is_connection_error,
    is_out_of_memory,
    is_timeout,
)
from ._live import live_breakers, register_breaker
from ._options import BreakerConfig
from ._outcome import IGNORED, OUTCOMES, classify_outcome, outcome_name
from ._protocol import AsyncBreaker, Breaker
from ._state import BreakerState
from ._typed import (
    BreakerOptions,
    EmbeddingTimeoutBreaker,
    RerankOOMBreaker,
    VectorStoreUnavailableBreaker,
)

__all__ = [
    "IGNORED",
    "OUTCOMES",
    "AiobreakerBreaker",
    "AiobreakerListenerAdapter",
    "AsyncBreaker",
    "Breaker",
    "BreakerCallOutcome",
    "BreakerConfig",
    "BreakerMetrics",
    "BreakerOptions",
    "BreakerState",
    "CircuitBreaker",
    "Classifier",
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
    "live_breakers",
    "outcome_name",
    "register_breaker",
]
