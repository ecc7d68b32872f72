"""Configuration as data: one :class:`Policy` describes every stage and every tenant, and one
model per layer its options (:class:`RetryPolicy`, :class:`BreakerPolicy`, :class:`HedgePolicy`,
:class:`ThrottlePolicy`, :class:`AdaptivePolicy`, :class:`LimitsPolicy`); a model group's
:class:`GroupPolicy`.

Pydantic models, frozen and validated once (:class:`Options` is their base). They import no
layer: the layers read them (see :mod:`ragguard.options._layers` for the layers a stage's policy
may configure).
"""

from ._adaptive import AdaptivePolicy
from ._base import Options
from ._breaker import BreakerPolicy
from ._hedge import HedgePolicy
from ._keyed import DeploymentPolicy, GroupPolicy, LimitsPolicy, key_id
from ._policy import (
    GenerationPolicy,
    Policy,
    PoolQuota,
    ReservePolicy,
    StagePolicy,
    TenantQuota,
    TokenLimits,
)
from ._retry import RetryPolicy
from ._throttle import ThrottlePolicy

__all__ = [
    "AdaptivePolicy",
    "BreakerPolicy",
    "DeploymentPolicy",
    "GenerationPolicy",
    "GroupPolicy",
    "HedgePolicy",
    "LimitsPolicy",
    "Options",
    "Policy",
    "PoolQuota",
    "ReservePolicy",
    "RetryPolicy",
    "StagePolicy",
    "TenantQuota",
    "ThrottlePolicy",
    "TokenLimits",
    "key_id",
]
