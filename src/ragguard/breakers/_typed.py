"""The three typed breakers of a RAG pipeline, with the defaults of ragguard's incident table.

| breaker | counts as failure | trips on | open | min calls |
|---|---|---|---|---|
| EmbeddingTimeoutBreaker | calls slower than 3 s, timeouts | slow-call rate >= 50 % | 60 s | 10 |
| VectorStoreUnavailableBreaker | connection-class errors, stage timeouts | failure rate >= 50 % | 120 s | 5 |
| RerankOOMBreaker | out-of-memory errors, stage timeouts | 3 consecutive failures | 300 s | 3 |

Every kind counts a :class:`ragguard.StageTimeout` (the stage's own ``timeout_s`` ran out: the
dependency did not answer in time, whatever else is wrong with it), so a hung vector store or a
hung reranker trips its breaker too; a caller's spent deadline is never counted.

Every option of :class:`CircuitBreaker` can be overridden by keyword.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .._errors import EmbeddingUnavailable, RerankOutOfMemory, StageTimeout, VectorStoreUnavailable
from ._breaker import CircuitBreaker
from ._classify import is_connection_error, is_out_of_memory, is_timeout
from ._options import BreakerOptions

if TYPE_CHECKING:
    from typing import Unpack

__all__ = [
    "BreakerOptions",
    "EmbeddingTimeoutBreaker",
    "RerankOOMBreaker",
    "VectorStoreUnavailableBreaker",
]


def is_connection_error_or_stage_timeout(exc: BaseException) -> bool:
    """:func:`is_connection_error`, or a :class:`ragguard.StageTimeout`."""
    return isinstance(exc, StageTimeout) or is_connection_error(exc)


def is_out_of_memory_or_stage_timeout(exc: BaseException) -> bool:
    """:func:`is_out_of_memory`, or a :class:`ragguard.StageTimeout`."""
    return isinstance(exc, StageTimeout) or is_out_of_memory(exc)


class _TypedBreaker(CircuitBreaker):
    __slots__ = ()
    defaults: ClassVar[dict[str, Any]] = {}
    default_name: ClassVar[str] = ""

    def __init__(self, name: str | None = None, **options: Unpack[BreakerOptions]) -> None:
        merged: dict[str, Any] = {**self.defaults, **options}
        super().__init__(self.default_name if name is None else name, **merged)


class EmbeddingTimeoutBreaker(_TypedBreaker):
    """Opens when embedding calls get slow: slow-call rate >= 50 % of the last 20 calls.

    Defaults: a call slower than ``slow_call_duration_s=3.0`` s is slow; an error
    :func:`is_timeout` recognises counts as a slow failure whatever its duration, other errors
    pass through uncounted; ``minimum_calls=10``, ``window_size=20`` calls,
    ``open_for_s=60.0``, ``half_open_permits=5``; the failure-rate rule is set to 100 % (only a
    window of nothing but timeouts trips it; those are slow calls too). Rejects with
    :class:`ragguard.EmbeddingUnavailable`. Name defaults to ``"embedding"``.
    """

    __slots__ = ()
    default_name = "embedding"
    defaults: ClassVar[dict[str, Any]] = {
        "slow_call_duration_s": 3.0,
        "slow_call_rate_threshold": 50.0,
        "failure_rate_threshold": 100.0,
        "minimum_calls": 10,
        "window_size": 20,
        "open_for_s": 60.0,
        "half_open_permits": 5,
        "classifier": is_timeout,
        "slow_classifier": is_timeout,
        "error_class": EmbeddingUnavailable,
    }


class VectorStoreUnavailableBreaker(_TypedBreaker):
    """Opens when the vector store cannot be reached: failure rate >= 50 % of the last 10 calls.

    Defaults: failures are the connection-class errors :func:`is_connection_error`
    recognises and stage timeouts, other errors pass through uncounted; ``minimum_calls=5``,
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
        "classifier": is_connection_error_or_stage_timeout,
        "error_class": VectorStoreUnavailable,
    }


class RerankOOMBreaker(_TypedBreaker):
    """Opens after 3 out-of-memory failures in a row.

    Defaults: failures are the errors :func:`is_out_of_memory` recognises and stage timeouts,
    other errors pass through uncounted; ``consecutive_failures_threshold=3``, ``minimum_calls=3``,
    ``window_size=10`` calls, the failure-rate rule at 100 %, ``open_for_s=300.0``, and one trial
    call when half-open (``half_open_permits=1``: a trial on a GPU is expensive). Rejects with
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
        "classifier": is_out_of_memory_or_stage_timeout,
        "error_class": RerankOutOfMemory,
    }
