"""The three typed breakers of a RAG pipeline, with the defaults of ragguard's incident table.

| breaker | counts as failure | trips on | open | min calls |
|---|---|---|---|---|
| EmbeddingTimeoutBreaker | outages; timeouts, calls over 3 s: slow | slow/failure rate >= 50 % | 60 s | 10 |
| VectorStoreUnavailableBreaker | outages and timeouts | failure rate >= 50 % | 120 s | 5 |
| RerankOOMBreaker | outages (out of memory among them) and timeouts | 3 consecutive failures | 300 s | 3 |

Every kind counts outages (:func:`~ragguard.breakers.counts_outages`: refused, reset, 5xx,
``UNAVAILABLE``, out of memory, and timeouts, the stage's own ``timeout_s`` included): an
embedding provider that is down opens the embedding breaker as surely as one that is slow. What
distinguishes the kinds is what else they count (the embedding breaker slow calls) and their
defaults. Every kind also counts the dependency's rejections that are not rate limits (a 503
stating a wait, 529: :func:`~ragguard.breakers.counts_overloads`) apart, and opens when they make
``rejection_rate_threshold`` (90 %) of its window. None counts a caller's error, a rate limit
(429: the throttle's business), ragguard's own refusals or a spent deadline (see
:mod:`ragguard.outcomes`).

Every option of :class:`CircuitBreaker` can be overridden by keyword.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .._errors import EmbeddingUnavailable, RerankOutOfMemory, VectorStoreUnavailable
from ._breaker import CircuitBreaker
from ._classify import counts_outages, is_timeout
from ._options import BreakerOptions

if TYPE_CHECKING:
    from typing import Unpack

__all__ = [
    "BreakerOptions",
    "EmbeddingTimeoutBreaker",
    "RerankOOMBreaker",
    "VectorStoreUnavailableBreaker",
]


class _TypedBreaker(CircuitBreaker):
    __slots__ = ()
    defaults: ClassVar[dict[str, Any]] = {}
    default_name: ClassVar[str] = ""

    def __init__(self, name: str | None = None, **options: Unpack[BreakerOptions]) -> None:
        # a config given is complete already (its defaults were this kind's when it was made)
        merged: dict[str, Any] = {**options} if "config" in options else {**self.defaults, **options}
        super().__init__(self.default_name if name is None else name, **merged)


class EmbeddingTimeoutBreaker(_TypedBreaker):
    """Opens when embedding calls get slow or fail: slow-call or failure rate >= 50 % of the last
    20 calls.

    Defaults: a call slower than ``slow_call_duration_s=3.0`` s is slow; outages count as
    failures (:func:`~ragguard.breakers.counts_outages`), a timeout as a slow failure whatever its
    duration; other errors pass through uncounted; ``minimum_calls=10``, ``window_size=20`` calls,
    ``open_for_s=60.0``, ``half_open_permits=5``. Rejects with
    :class:`ragguard.EmbeddingUnavailable`. Name defaults to ``"embedding"``.
    """

    __slots__ = ()
    default_name = "embedding"
    defaults: ClassVar[dict[str, Any]] = {
        "slow_call_duration_s": 3.0,
        "slow_call_rate_threshold": 50.0,
        "failure_rate_threshold": 50.0,
        "minimum_calls": 10,
        "window_size": 20,
        "open_for_s": 60.0,
        "half_open_permits": 5,
        "classifier": counts_outages,
        "slow_classifier": is_timeout,
        "error_class": EmbeddingUnavailable,
    }


class VectorStoreUnavailableBreaker(_TypedBreaker):
    """Opens when the vector store cannot be reached: failure rate >= 50 % of the last 10 calls.

    Defaults: failures are outages (:func:`~ragguard.breakers.counts_outages`: refused, reset,
    5xx, ``UNAVAILABLE``, timeouts), other errors pass through uncounted; ``minimum_calls=5``,
    ``window_size=10`` calls, ``open_for_s=120.0``, ``half_open_permits=3``. Rejects with
    :class:`ragguard.VectorStoreUnavailable`. Name defaults to ``"vector_store"``.
    """

    __slots__ = ()
    default_name = "vector_store"
    defaults: ClassVar[dict[str, Any]] = {
        "failure_rate_threshold": 50.0,
        "minimum_calls": 5,
        "window_size": 10,
        "open_for_s": 120.0,
        "half_open_permits": 3,
        "classifier": counts_outages,
        "error_class": VectorStoreUnavailable,
    }


class RerankOOMBreaker(_TypedBreaker):
    """Opens after 3 failures in a row (out of memory, the reranker down, timeouts).

    Defaults: failures are outages (:func:`~ragguard.breakers.counts_outages`), out-of-memory
    errors among them, and timeouts; other errors pass through uncounted;
    ``consecutive_failures_threshold=3``, ``minimum_calls=3``, ``window_size=10`` calls, the
    failure-rate rule at 100 %, ``open_for_s=300.0``, and one trial call when half-open
    (``half_open_permits=1``: a trial on a GPU is expensive). Rejects with
    :class:`ragguard.RerankOutOfMemory`. Name defaults to ``"rerank"``.
    """

    __slots__ = ()
    default_name = "rerank"
    defaults: ClassVar[dict[str, Any]] = {
        "consecutive_failures_threshold": 3,
        "failure_rate_threshold": 100.0,
        "minimum_calls": 3,
        "window_size": 10,
        "open_for_s": 300.0,
        "half_open_permits": 1,
        "classifier": counts_outages,
        "error_class": RerankOutOfMemory,
    }
