"""Counting requests admitted through Redis in the local fallback's bulkhead.

While Redis answers, every request it admits also takes a slot in the fallback
:class:`~ragguard.quotas.LocalQuotas` (no waiting, no rate). So when Redis goes away, the fallback
already counts the requests still running and admits only what is left of the tenant's
concurrency, first come first served behind them: one replica never runs more than its limit
across the switch.

``LocalQuotas`` has no public way to count a slot taken elsewhere; these two functions are the one
place that reaches into its buckets (the natural home is a ``LocalQuotas.take_slot`` method).
"""

from __future__ import annotations

from typing import Any

from ..quotas import Lease, LocalQuotas

__all__ = ["give_slot", "take_slot"]


def take_slot(quotas: LocalQuotas, tenant: str) -> Lease | None:
    """Count one running request of ``tenant`` admitted elsewhere; None when the fallback has no
    concurrency limit for it. May take the bucket past its limit: new requests then wait."""
    q: Any = quotas
    quota = q._quota_for(tenant)
    if quota.max_concurrency is None:
        return None
    now = q._clock()
    bucket = q._buckets.get(tenant)
    if bucket is None or bucket.quota is not quota:
        bucket = q._bucket(tenant, quota, now)
    bucket.in_flight += 1
    return Lease(bucket, now)


def give_slot(quotas: LocalQuotas, lease: Lease) -> None:
    """Give back a slot from :func:`take_slot`: to the oldest local waiter, unless the bucket is
    over its limit (then the count just drops)."""
    if lease._released:
        return
    bucket: Any = lease.bucket
    if bucket.limit is not None and bucket.in_flight > bucket.limit:
        lease._released = True
        bucket.in_flight -= 1
        return
    quotas.release(lease)
