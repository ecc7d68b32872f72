"""ragguard: resilience middleware for retrieval-augmented generation pipelines.

One flat public namespace, this module: the package's face. Behind it,

- the core, which imports no wing and no tool: ``ragguard.options`` (the policy and each layer's
  options, data only), ``ragguard.outcomes``, ``ragguard.breakers``, ``ragguard.quotas``,
  ``ragguard.overload``, ``ragguard.pipeline`` (the layer contract, the drivers, the build context
  and the :class:`~ragguard.pipeline.Backend` protocol), ``ragguard.layers``,
  ``ragguard.testing`` and the Guard (:mod:`ragguard._guard`);
- the wings, which import the core and register into it: ``ragguard.rag`` (the RAG presets,
  imported here so that ``@guard("embedding")`` finds its preset), ``ragguard.redis``
  (``Guard(backend=RedisBackend(client))``), the front doors ``ragguard.asgi``, ``ragguard.grpc``
  and ``ragguard.httpx``, ``ragguard.buffers``, ``ragguard.integrations``, ``ragguard.chaos``,
  ``ragguard.metrics`` and ``ragguard.monitors``;
- the tools, in the package ``ragguard_tools`` beside this one: the ``ragguard`` command line,
  ``top``, ``doctor``, the status server, the policy reference, the demo and the bench.

tests/packaging/test_layout.py holds the core to it.
"""

from . import rag  # noqa: F401 - the RAG wing: its presets register themselves into the core
from ._clock import FakeClock
from ._context import current_tenant, degraded
from ._deadline import deadline, remaining
from ._endings import StreamEnding, stream_endings
from ._errors import (
    BreakerOpen,
    ConfigError,
    CorruptPayload,
    DeadlineExceeded,
    EmbeddingUnavailable,
    InvalidInput,
    NoDeploymentAvailable,
    Overloaded,
    QuotaExceeded,
    RagguardError,
    RerankOutOfMemory,
    StageTimeout,
    StreamTimeout,
    VectorStoreUnavailable,
)
from ._guard import Guard, configure, default_guard, guard, tenant
from ._naming import named
from .breakers import (
    BreakerState,
    CircuitBreaker,
    EmbeddingTimeoutBreaker,
    RerankOOMBreaker,
    VectorStoreUnavailableBreaker,
)
from .options import (
    AdaptivePolicy,
    BreakerPolicy,
    GenerationPolicy,
    HedgePolicy,
    Policy,
    PoolQuota,
    ReservePolicy,
    RetryPolicy,
    StagePolicy,
    TenantQuota,
    ThrottlePolicy,
    TokenLimits,
)
from .outcomes import register_classifier
from .overload import priority
from .pipeline._chain import GuardedStream

__version__ = "0.1.0"

# The errors' public home is this namespace: tracebacks and reprs say ragguard.ConfigError, not
# ragguard._errors.ConfigError, and pickle finds each class here.
for _error in (BreakerOpen, ConfigError, CorruptPayload, DeadlineExceeded, EmbeddingUnavailable, InvalidInput,
               NoDeploymentAvailable, Overloaded, QuotaExceeded, RagguardError, RerankOutOfMemory,
               StageTimeout, StreamTimeout, VectorStoreUnavailable):  # fmt: skip
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
    "GuardedStream",
    "HedgePolicy",
    "InvalidInput",
    "NoDeploymentAvailable",
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
    "StreamEnding",
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
    "named",
    "priority",
    "register_classifier",
    "remaining",
    "stream_endings",
    "tenant",
]
