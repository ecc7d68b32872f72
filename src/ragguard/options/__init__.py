"""Configuration as data: one :class:`Policy` describes every stage and every tenant.

Pydantic models, frozen and validated once (:class:`Options` is their base); they import no layer.
"""

from ._base import MAX_ERRORS_SHOWN, Options
from ._policy import (
    IDEMPOTENT_PRESETS,
    MAX_POLICY_VALUES,
    STANDARD_STAGES,
    GenerationPolicy,
    Policy,
    PoolQuota,
    StagePolicy,
    TenantQuota,
    TokenLimits,
    policy_of,
)

__all__ = [
    "IDEMPOTENT_PRESETS",
    "MAX_ERRORS_SHOWN",
    "MAX_POLICY_VALUES",
    "STANDARD_STAGES",
    "GenerationPolicy",
    "Options",
    "Policy",
    "PoolQuota",
    "StagePolicy",
    "TenantQuota",
    "TokenLimits",
    "policy_of",
]
