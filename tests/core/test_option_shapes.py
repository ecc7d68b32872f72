"""One concept, one shape (issue 30): a mechanism's options are its options model's, read from it
in one place; where a mechanism keeps a view of its own (a settings dataclass, keyword defaults for
its direct users), that view holds the model's names and defaults, so the two cannot drift."""

from __future__ import annotations

import dataclasses
import inspect
import random

from ragguard import FakeClock
from ragguard.layers._retry import RetryBudget
from ragguard.options import (
    AdaptivePolicy,
    HedgePolicy,
    PoolQuota,
    RetryPolicy,
    TenantQuota,
    ThrottlePolicy,
    TokenLimits,
)
from ragguard.options._policy import burst_of
from ragguard.overload._gradient import LimitSettings
from ragguard.overload._hedge import LatencyTracker
from ragguard.overload._limiter import QueueSettings
from ragguard.overload._throttle import AdaptiveThrottle

_MECHANISM_ONLY = {"max_tenants"}  # the queue's bound on tracked tenants: no policy sets it


def _defaults(model: type) -> dict[str, object]:
    return {name: field.default for name, field in model.model_fields.items()}  # type: ignore[attr-defined]


def test_the_adaptive_limit_s_settings_are_fields_of_the_adaptive_policy_with_its_defaults() -> None:
    policy = _defaults(AdaptivePolicy)
    for settings in (LimitSettings, QueueSettings):
        for f in dataclasses.fields(settings):
            if f.name in _MECHANISM_ONLY:
                continue
            assert f.name in policy, (settings.__name__, f.name)
            assert f.default == policy[f.name], (settings.__name__, f.name)
    covered = {f.name for s in (LimitSettings, QueueSettings) for f in dataclasses.fields(s)}
    # the rest of the policy is the layer's (how long to queue, which signals press the limit)
    assert set(policy) - covered == {"signals", "loop_lag_s"}


def test_the_throttle_s_keywords_are_the_throttle_policy_s() -> None:
    keywords = inspect.signature(AdaptiveThrottle).parameters
    policy = _defaults(ThrottlePolicy)
    for name, default in policy.items():
        assert keywords[name].default == default, name
    built = AdaptiveThrottle(**ThrottlePolicy(k=3.0).model_dump(), clock=FakeClock(), rng=random.Random(1))
    assert built.k == 3.0


def test_the_latency_tracker_s_defaults_are_the_hedge_policy_s() -> None:
    keywords = inspect.signature(LatencyTracker).parameters
    policy = _defaults(HedgePolicy)
    assert keywords["quantile"].default == policy["quantile"]
    assert keywords["size"].default == policy["samples"]
    assert keywords["min_samples"].default == policy["min_samples"]


def test_a_budget_is_read_from_either_policy_the_same_way() -> None:
    clock = FakeClock()
    for policy in (RetryPolicy(budget_ratio=0.3, budget_min_per_s=2.0, budget_window_s=4.0),
                   HedgePolicy(budget_ratio=0.3, budget_min_per_s=2.0, budget_window_s=4.0)):  # fmt: skip
        budget = RetryBudget.of(policy, clock)
        assert (budget.ratio, budget.min_per_s, budget.window_s) == (0.3, 2.0, 4)


def test_the_quotas_share_their_fields_and_one_rule_for_a_default_burst() -> None:
    tenant = set(TenantQuota.model_fields)
    assert set(TokenLimits.model_fields) <= tenant  # a model's token limits are the tenant's own kind
    assert set(PoolQuota.model_fields) <= tenant  # a pool bounds what a tenant's quota bounds
    for name in ("max_concurrency", "rate_per_s", "burst"):
        assert repr(TenantQuota.model_fields[name]) == repr(PoolQuota.model_fields[name])
    for name in TokenLimits.model_fields:
        assert repr(TenantQuota.model_fields[name]) == repr(TokenLimits.model_fields[name])
    assert [burst_of(r, None) for r in (0.2, 1.0, 2.5, 100.0)] == [1, 1, 3, 100]
    assert burst_of(2.5, 7) == 7 and burst_of(None, 7) is None
