"""The services a Guard's layers are built with, assembled from its options: one
:class:`~ragguard.pipeline.BuildContext` per Guard (see :class:`ragguard.Guard` for the options)."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

from . import _inject
from ._clock import Clock, sleep_of
from ._context import DEFAULT_TENANT
from .options import Policy
from .outcomes._classify import OutcomeClassifier, classify_with
from .pipeline import Backend, BuildContext
from .pipeline._build import check_services
from .quotas import LocalQuotas, QuotaBackend

__all__ = ["services"]


def services(
    policy: Policy,
    *,
    clock: Clock,
    rng: random.Random | None,
    sleep: Callable[[float], Awaitable[Any]] | None,
    quotas: QuotaBackend | None,
    backend: Backend | None,
    chaos: _inject.Injector | None,
    classifier: OutcomeClassifier | None = None,
) -> BuildContext:
    """The build context of a Guard with these options; ConfigError naming a bad one. With a
    ``backend``, the quotas (unless given) and the layers' shared state come from it
    (:class:`~ragguard.pipeline.Backend`), and the context closes what it made. With a
    ``classifier``, the context classifies with :func:`ragguard.outcomes.classify_with` it."""
    check_services(clock=clock, sleep=sleep, rng=rng, quotas=quotas, chaos=chaos, backend=backend)
    classify = None if classifier is None else classify_with(classifier)  # ConfigError if not callable
    rng = rng if rng is not None else random.Random()
    sleep = sleep if sleep is not None else sleep_of(clock)
    closers = []
    if quotas is None and backend is not None:
        quotas = backend.quotas(policy, clock=clock, sleep=sleep, rng=rng)
        close = getattr(quotas, "aclose", None)
        if close is not None:
            closers.append(close)
    elif quotas is None:
        quotas = LocalQuotas(policy.quota, clock=clock, sleep=sleep)
    default = policy.default_quota
    unbounded = default.max_concurrency is None and default.rate_per_s is None
    context = BuildContext(
        clock=clock, sleep=sleep, rng=rng, quotas=quotas, quota_of=policy.quota,
        # calls outside a request are admitted when the default tenant, or the pool it is in, has a bound
        per_call_quota=not (unbounded and policy.pool(DEFAULT_TENANT) is None),
        backend=backend, chaos=chaos, classify=classify,
    )
    for close in closers:
        context.on_close(close)
    return context
