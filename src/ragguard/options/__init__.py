"""Configuration as data: one :class:`Policy` describes every stage and every tenant, and one
model per layer its options (:class:`RetryPolicy`, :class:`BreakerPolicy`, :class:`HedgePolicy`,
:class:`ThrottlePolicy`, :class:`AdaptivePolicy`, :class:`LimitsPolicy`); a model group's
:class:`GroupPolicy`.

Pydantic models, frozen and validated once (:class:`Options` is their base). They import no
layer: the layers read them (see :mod:`ragguard.options._layers` for the layers a stage's policy
may configure).
"""

from ._adaptive import AdaptivePolicy
from ._base import MAX_ERRORS_SHOWN, Options
from ._breaker import BREAKER_KINDS, BreakerPolicy
from ._hedge import HedgePolicy
from ._keyed import DeploymentPolicy, GroupPolicy, LimitsPolicy, key_id
from ._policy import (
    IDEMPOTENT_PRESETS,
    MAX_POLICY_VALUES,
    PROVIDER_STAGES,
    STANDARD_STAGES,
    GenerationPolicy,
    Policy,
    PoolQuota,
    ReservePolicy,
    StagePolicy,
    TenantQuota,
    TokenLimits,
    policy_of,
)
from ._retry import RetryPolicy
from ._throttle import ThrottlePolicy

__all__ = [
    "BREAKER_KINDS",
    "IDEMPOTENT_PRESETS",
    "MAX_ERRORS_SHOWN",
    "MAX_POLICY_VALUES",
    "PROVIDER_STAGES",
    "STANDARD_STAGES",
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
    "policy_of",
]
