"""In-process tenant quotas: a FIFO bulkhead and a GCRA rate limiter per tenant.

Concurrency is a counting semaphore whose waiters are served strictly first come, first served: a
released slot is handed to the oldest waiter directly, so a stream of new arrivals cannot overtake
it. Rate is the Generic Cell Rate Algorithm (ATM Forum TM 4.0; the same arithmetic as a token bucket
of ``burst`` tokens refilled at ``rate_per_s``): one number per tenant, the theoretical arrival time.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import anyio

from .. import _validate as v
from .._clock import Clock, monotonic
from .._errors import QuotaExceeded
from ..deadline import remaining
from ..events import QuotaRejected, bus
from ..policy import TenantQuota

__all__ = ["WAIT", "Lease", "LocalQuotas", "QuotaBackend"]


class Lease:
    """What one admitted request holds: give it back with ``QuotaBackend.release``."""

    __slots__ = ("_released", "bucket", "started")

    def __init__(self, bucket: _Bucket, started: float) -> None:
        self.bucket = bucket
        self.started = started
        self._released = False


WAIT: Any = object()
"""Returned by ``QuotaBackend.admit_now`` when admission needs ``await acquire()``."""


class QuotaBackend(Protocol):
    """Admits requests of a tenant; implemented in memory here and over Redis in
    ``ragguard.distributed``.

    ``admit_now`` is the synchronous fast path: a lease (or None for an unlimited tenant) when the
    request is admitted at once, :data:`WAIT` when it must queue or be refused through ``acquire``.
    """

    def admit_now(self, tenant: str) -> Any: ...

    async def acquire(self, tenant: str) -> Any: ...

    def release(self, lease: Any) -> None: ...


class _Waiter:
    __slots__ = ("event", "granted")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.granted = False


class _Bucket:
    __slots__ = (
        "burst_s",
        "hold_ewma_s",
        "in_flight",
        "interval_s",
        "limit",
        "quota",
        "tat",
        "tenant",
        "waiters",
    )

    def __init__(self, tenant: str, quota: TenantQuota, now: float) -> None:
        self.tenant = tenant
        self.in_flight = 0
        self.waiters: deque[_Waiter] = deque()
        self.tat = now
        self.hold_ewma_s = 0.0
        self.adopt(quota)

    def adopt(self, quota: TenantQuota) -> None:
        """Take ``quota``'s limits (precomputed for the admission fast path)."""
        self.quota = quota
        self.limit = quota.max_concurrency
        rate = quota.rate_per_s
        self.interval_s = 0.0 if rate is None else 1.0 / rate
        burst = quota.burst if quota.burst is not None else (1 if rate is None else max(1, math.ceil(rate)))
        self.burst_s = burst * self.interval_s

    def idle(self, now: float) -> bool:
        return self.in_flight == 0 and not self.waiters and self.tat <= now

    def unused(self) -> bool:
        return self.in_flight == 0 and not self.waiters


class LocalQuotas:
    """Per-tenant concurrency and rate quotas held in this process.

    ``quota_for(tenant)`` gives each tenant's :class:`~ragguard.TenantQuota` (read when a tenant is
    first seen and again whenever a request has to queue, so a changed quota applies from then on);
    ``clock`` returns
    monotonic seconds (rates are computed on it; queueing waits use the event loop's real time).
    Idle tenants are forgotten once more than ``max_tenants`` are tracked, so a flood of tenant ids
    cannot grow memory without bound.
    """

    def __init__(
        self,
        quota_for: Callable[[str], TenantQuota],
        *,
        clock: Clock = monotonic,
        max_tenants: int = 10_000,
    ) -> None:
        v.count("max_tenants", max_tenants, 1)
        self._quota_for = quota_for
        self._clock = clock
        self._max_tenants = max_tenants
        self._buckets: dict[str, _Bucket] = {}

    # -- inspection -----------------------------------------------------------------------

    def in_flight(self, tenant: str) -> int:
        """Requests of ``tenant`` holding a concurrency slot now."""
        b = self._buckets.get(tenant)
        return 0 if b is None else b.in_flight

    def waiting(self, tenant: str) -> int:
        """Requests of ``tenant`` queued for a slot now."""
        b = self._buckets.get(tenant)
        return 0 if b is None else sum(1 for w in b.waiters if not w.event.is_set())

    def total_in_flight(self) -> int:
        return sum(b.in_flight for b in self._buckets.values())

    # -- admission ------------------------------------------------------------------------

    def admit_now(self, tenant: str) -> Lease | Any | None:
        """Admit one request of ``tenant`` if that needs no waiting: a Lease, None for an unlimited
        tenant, or :data:`WAIT` (then ``await acquire(tenant)`` queues or refuses it)."""
        bucket = self._buckets.get(tenant)
        if bucket is None:
            quota = self._quota_for(tenant)
            if quota.max_concurrency is None and quota.rate_per_s is None:
                return None
            return WAIT  # the first request of a tenant creates its bucket in acquire()
        limit = bucket.limit
        if limit is not None and (bucket.in_flight >= limit or bucket.waiters):
            return WAIT
        now = self._clock()
        interval = bucket.interval_s
        if interval:
            tat = (bucket.tat if bucket.tat > now else now) + interval
            if tat - now - bucket.burst_s > 1e-9:
                return WAIT
            bucket.tat = tat
        if limit is not None:
            bucket.in_flight += 1
        return Lease(bucket, now)

    async def acquire(self, tenant: str) -> Lease | None:
        """Admit one request of ``tenant``, waiting FIFO up to the quota's ``max_wait_s`` (cut to
        the request's deadline). Returns a lease (None when the tenant is unlimited).

        Raises :class:`~ragguard.QuotaExceeded` with ``reason`` ``rate``, ``concurrency`` or
        ``deadline`` and the seconds after which a retry could be admitted.
        """
        quota = self._quota_for(tenant)
        if quota.max_concurrency is None and quota.rate_per_s is None:
            return None
        now = self._clock()
        bucket = self._buckets.get(tenant)
        if bucket is None or bucket.quota is not quota:
            bucket = self._bucket(tenant, quota, now)
        wait_budget = quota.max_wait_s
        left = remaining()
        limited_by_deadline = left is not None and left < wait_budget
        if limited_by_deadline:
            wait_budget = left  # type: ignore[assignment]
        reserved = 0.0
        if quota.rate_per_s is not None:
            reserved = self._reserve(bucket, quota, now, wait_budget, limited_by_deadline)
            if reserved > 0.0:
                try:
                    await anyio.sleep(reserved)
                except BaseException:
                    self._refund(bucket, quota)
                    raise
        if quota.max_concurrency is not None:
            if bucket.in_flight < quota.max_concurrency and not bucket.waiters:
                bucket.in_flight += 1
            else:
                try:
                    await self._wait_for_slot(bucket, quota, wait_budget - reserved, limited_by_deadline)
                except BaseException:
                    if quota.rate_per_s is not None:
                        self._refund(bucket, quota)  # a refused request spends no rate
                    raise
        return Lease(bucket, self._clock())

    def release(self, lease: Lease | None) -> None:
        """Give back the slot ``lease`` holds (idempotent: a second release does nothing)."""
        if lease is None or lease._released:
            return
        lease._released = True
        bucket = lease.bucket
        if bucket.limit is None:
            return
        held = self._clock() - lease.started
        bucket.hold_ewma_s = held if bucket.hold_ewma_s == 0.0 else 0.8 * bucket.hold_ewma_s + 0.2 * held
        if bucket.waiters:
            self._pass_on(bucket)
        else:
            bucket.in_flight -= 1

    # -- internals ------------------------------------------------------------------------

    def _bucket(self, tenant: str, quota: TenantQuota, now: float) -> _Bucket:
        old = self._buckets.get(tenant)
        if old is not None:
            # the policy changed: keep the live counts, adopt the new limits
            old.adopt(quota)
            return old
        if len(self._buckets) >= self._max_tenants:
            self._evict(now)
        bucket = self._buckets[tenant] = _Bucket(tenant, quota, now)
        return bucket

    def _evict(self, now: float) -> None:
        """Forget tenants down to 90% of ``max_tenants``, oldest first: idle ones, then those whose
        only state is a future rate token (they may burst once more: the price of a bounded map).
        Tenants with requests in flight or queued are kept. Amortised O(1) per new tenant."""
        target = int(self._max_tenants * 0.9)
        buckets = self._buckets
        for fully_idle in (True, False):
            for key in [k for k, b in buckets.items() if (b.idle(now) if fully_idle else b.unused())]:
                if len(buckets) <= target:
                    return
                del buckets[key]

    def _reserve(
        self, bucket: _Bucket, quota: TenantQuota, now: float, wait_budget: float, by_deadline: bool
    ) -> float:
        rate = quota.rate_per_s
        assert rate is not None
        interval = 1.0 / rate
        burst = quota.burst if quota.burst is not None else max(1, math.ceil(rate))
        tat = max(bucket.tat, now) + interval
        delay = tat - now - burst * interval
        if delay <= 1e-9:
            bucket.tat = tat
            return 0.0
        if delay > wait_budget:
            raise self._reject(bucket.tenant, delay, "deadline" if by_deadline else "rate")
        bucket.tat = tat
        return delay

    def _refund(self, bucket: _Bucket, quota: TenantQuota) -> None:
        assert quota.rate_per_s is not None
        bucket.tat -= 1.0 / quota.rate_per_s

    async def _wait_for_slot(
        self, bucket: _Bucket, quota: TenantQuota, budget: float, by_deadline: bool
    ) -> None:
        if budget <= 0.0:
            raise self._reject(
                bucket.tenant, self._slot_eta(bucket, quota), "deadline" if by_deadline else "concurrency"
            )
        waiter = _Waiter()
        bucket.waiters.append(waiter)
        try:
            with anyio.move_on_after(budget):
                await waiter.event.wait()
        except BaseException:
            if waiter.granted:
                self._pass_on(bucket)
            else:
                self._abandon(bucket, waiter)
            raise
        if waiter.granted:
            return
        self._abandon(bucket, waiter)
        raise self._reject(
            bucket.tenant, self._slot_eta(bucket, quota), "deadline" if by_deadline else "concurrency"
        )

    @staticmethod
    def _abandon(bucket: _Bucket, waiter: _Waiter) -> None:
        # Leave the queue now rather than as a marked entry skipped by the next release: behind a
        # slot held for long, every refused request would otherwise stay queued until then.
        waiter.event.set()
        try:
            bucket.waiters.remove(waiter)
        except ValueError:  # pragma: no cover - already popped
            pass

    def _pass_on(self, bucket: _Bucket) -> None:
        """Hand the slot being released to the oldest live waiter, else free it."""
        waiters = bucket.waiters
        while waiters:
            w = waiters.popleft()
            if not w.event.is_set():
                w.granted = True
                w.event.set()
                return
        bucket.in_flight -= 1

    @staticmethod
    def _slot_eta(bucket: _Bucket, quota: TenantQuota) -> float:
        assert quota.max_concurrency is not None
        ahead = len(bucket.waiters) + 1
        hold = bucket.hold_ewma_s if bucket.hold_ewma_s > 0 else 0.01
        return max(0.001, hold * ahead / quota.max_concurrency)

    @staticmethod
    def _reject(tenant: str, retry_after_s: float, reason: str) -> QuotaExceeded:
        if bus.active:
            bus.emit(QuotaRejected(tenant, reason, retry_after_s))
        return QuotaExceeded(tenant, retry_after_s, reason)
