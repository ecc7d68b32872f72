"""ragguard: resilience middleware for retrieval-augmented generation pipelines.

One flat public namespace; everything else lives in private modules or the sub-packages
(``ragguard.breakers``, ``ragguard.outcomes``, ``ragguard.quotas``, ``ragguard.fallbacks``,
``ragguard.chaos``, ``ragguard.grpc``, ``ragguard.asgi``, ``ragguard.httpx``, ``ragguard.buffers``,
``ragguard.monitors``, ``ragguard.metrics``, ``ragguard.overload``).
"""

from ._clock import FakeClock
from ._context import current_tenant, degraded
from ._errors import (
    BreakerOpen,
    ConfigError,
    CorruptPayload,
    DeadlineExceeded,
    EmbeddingUnavailable,
    InvalidInput,
    Overloaded,
    QuotaExceeded,
    RagguardError,
    RerankOutOfMemory,
    StageTimeout,
    StreamTimeout,
    VectorStoreUnavailable,
)
from .breakers import (
    BreakerState,
    CircuitBreaker,
    EmbeddingTimeoutBreaker,
    RerankOOMBreaker,
    VectorStoreUnavailableBreaker,
)
from .deadline import deadline, remaining
from .guard import Guard, configure, default_guard, guard, tenant
from .layers.adaptive import AdaptivePolicy
from .layers.breaker import BreakerPolicy
from .layers.hedge import HedgePolicy
from .layers.retry import RetryPolicy
from .layers.throttle import ThrottlePolicy
from .outcomes import Kind as OutcomeKind
from .outcomes import Outcome, register_classifier
from .overload import priority
from .policy import GenerationPolicy, Policy, PoolQuota, ReservePolicy, StagePolicy, TenantQuota, TokenLimits

__version__ = "0.1.0"

# The errors' public home is this namespace: tracebacks and reprs say ragguard.ConfigError, not
# ragguard._errors.ConfigError, and pickle finds each class here.
for _error in (BreakerOpen, ConfigError, CorruptPayload, DeadlineExceeded, EmbeddingUnavailable, InvalidInput,
               Overloaded, QuotaExceeded, RagguardError, RerankOutOfMemory, StageTimeout, StreamTimeout,
               VectorStoreUnavailable):  # fmt: skip
    _error.__module__ = __name__
del _error

__all__ = [
    "AdaptivePolicy",
    "BreakerOpen",
    "BreakerPolicy",
    "BreakerState",
    "CircuitBreaker",
    "ConfigError",
    "CorruptPayload",
    "DeadlineExceeded",
    "EmbeddingTimeoutBreaker",
    "EmbeddingUnavailable",
    "FakeClock",
    "GenerationPolicy",
    "Guard",
    "HedgePolicy",
    "InvalidInput",
    "Outcome",
    "OutcomeKind",
    "Overloaded",
    "Policy",
    "PoolQuota",
    "QuotaExceeded",
    "RagguardError",
    "RerankOOMBreaker",
    "RerankOutOfMemory",
    "ReservePolicy",
    "RetryPolicy",
    "StagePolicy",
    "StageTimeout",
    "StreamTimeout",
    "TenantQuota",
    "ThrottlePolicy",
    "TokenLimits",
    "VectorStoreUnavailable",
    "VectorStoreUnavailableBreaker",
    "configure",
    "current_tenant",
    "deadline",
    "default_guard",
    "degraded",
    "guard",
    "priority",
    "register_classifier",
    "remaining",
    "tenant",
]
