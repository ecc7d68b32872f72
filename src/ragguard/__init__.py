"""ragguard: resilience middleware for retrieval-augmented generation pipelines."""

from ._clock import FakeClock
from ._context import current_tenant, degraded
from ._errors import (
    BreakerOpen,
    ConfigError,
    CorruptPayload,
    DeadlineExceeded,
    EmbeddingUnavailable,
    InvalidInput,
    QuotaExceeded,
    RagguardError,
    RerankOutOfMemory,
    VectorStoreUnavailable,
)
from .deadline import deadline, remaining

__version__ = "0.1.0"

__all__ = [
    "BreakerOpen",
    "ConfigError",
    "CorruptPayload",
    "DeadlineExceeded",
    "EmbeddingUnavailable",
    "FakeClock",
    "InvalidInput",
    "QuotaExceeded",
    "RagguardError",
    "RerankOutOfMemory",
    "VectorStoreUnavailable",
    "current_tenant",
    "deadline",
    "degraded",
    "remaining",
]
