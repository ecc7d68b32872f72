"""Local-lease mode: admit a tenant's requests with no round trip, on a share borrowed from Redis.

After Google's Doorman and Envoy's global rate limit with local token buckets. Every ``period_s``
each replica reports its demand for the tenant (requests per second it saw) and borrows::

    rate          rate_per_s x share, but never more than the other replicas' grants leave: the
                  grants together never exceed rate_per_s; burst in proportion (at least 1)
    concurrency   slots that are real leases in the tenant's lease set: the replicas together
                  never hold more than max_concurrency
    share         its demand / the demand of every replica that renewed in the last two periods

Between renewals the replica admits locally, in a :class:`~ragguard.quotas.LocalQuotas` (FIFO
bulkhead, GCRA) set to its share. The price is accuracy on the low side: concurrency never exceeds
the limit and the granted rates never add up to more than the tenant's (bursts add up to at most
``burst`` plus one per replica); the tenant gets less while a replica holds a share it cannot use
(idle, or its event loop starved) or while shares move (a grown share waits for the others to
shrink, within a period). ``docs/distributed.md`` gives the error measured across 4 processes.

A replica whose renewals fail keeps its share for two periods (its slots stay valid in Redis that
long), then the tenant goes back to the ordinary path (and to the fallback while Redis is down).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
from collections.abc import Callable, Collection
from typing import Any, cast

from .._clock import Clock, monotonic
from .._errors import ConfigError, QuotaExceeded
from ..options import TenantQuota
from ..options._policy import burst_of
from ..quotas import LocalQuotas
from ..quotas._local import WAIT, Lease
from ._keys import quota_keys
from ._link import SharedStateUnavailable
from ._scripts import QUOTA_SHARE

__all__ = ["LocalLease"]

_MIN_DEMAND_PER_S = 0.1  # a replica that saw nothing still gets a sliver, so its next request can pass


class BorrowedLease(Lease):
    """A request admitted on a borrowed share (wraps the local lease)."""

    __slots__ = ("inner",)

    def __init__(self, inner: Lease) -> None:
        super().__init__(inner.bucket, inner.started)
        self.inner = inner


class _Share:
    __slots__ = ("demand_per_s", "no_rate", "quota", "ready", "refresh", "renewed_at", "seen", "short",
                 "slots")

    def __init__(self) -> None:
        self.quota: TenantQuota | None = None  # this replica's share, None until the first renewal
        self.slots: list[str] = []
        self.renewed_at = -math.inf
        self.seen = 0
        self.demand_per_s = 0.0
        self.ready = asyncio.Event()
        self.refresh = True  # the local bucket must adopt a new share before admit_now trusts it
        self.short = False  # refused a request for want of a slot since the last renewal
        self.no_rate = False  # granted no rate (the others hold it all until they renew)


class LocalLease:
    """Opt-in local-lease mode for :class:`RedisQuotas` (``RedisQuotas(..., local_lease=LocalLease())``).

    ``period_s`` (seconds, > 0, default 0.5): how often shares are renewed; a replica's slots stay
    valid for two periods. ``tenants``: which tenants use it: a collection of tenant ids, a
    predicate, or None (every tenant). Configure every replica alike. ``clock``: monotonic seconds
    for the local buckets. Raises ConfigError for a bad option.
    """

    def __init__(
        self,
        *,
        period_s: float = 0.5,
        tenants: Collection[str] | Callable[[str], bool] | None = None,
        clock: Clock = monotonic,
    ) -> None:
        if isinstance(period_s, bool) or not isinstance(period_s, (int, float)) or not 0 < period_s < 3600:
            raise ConfigError(f"period_s must be a number of seconds in (0, 3600), got {period_s!r}")
        if tenants is None:
            self._covers: Callable[[str], bool] = lambda tenant: True
        elif callable(tenants):
            self._covers = tenants
        elif isinstance(tenants, Collection) and not isinstance(tenants, str):
            chosen = frozenset(tenants)
            self._covers = chosen.__contains__
        else:
            raise ConfigError(f"tenants must be tenant ids, a predicate or None, got {tenants!r}")
        self.period_s = float(period_s)
        self._clock = clock
        self._shares: dict[str, _Share] = {}
        self._local = LocalQuotas(self._share_quota, clock=clock)
        self._owner: Any = None
        self._script: Any = None
        self._renewals = itertools.count()
        self._task: asyncio.Task[None] | None = None

    def _bind(self, owner: Any, redis: Any) -> None:
        if self._owner is not None:
            raise ConfigError("a LocalLease serves one RedisQuotas; create one per RedisQuotas")
        self._owner = owner
        self._script = redis.register_script(QUOTA_SHARE)

    # -- used by RedisQuotas ------------------------------------------------------------------

    def covers(self, tenant: str) -> bool:
        """True when ``tenant`` is admitted locally now: chosen, and its share not older than two
        periods (or not read yet: the first request waits for it)."""
        if not self._covers(tenant):
            return False
        share = self._shares.get(tenant)
        return share is None or share.quota is None or self._clock() - share.renewed_at <= 2 * self.period_s

    def owns(self, lease: Lease) -> bool:
        return isinstance(lease, BorrowedLease)

    def admit_now(self, tenant: str, quota: TenantQuota) -> Any:
        share = self._shares.get(tenant)
        if share is None or share.quota is None or share.refresh:
            return WAIT
        share.seen += 1
        if (quota.max_concurrency is not None and not share.slots) or share.no_rate:
            return WAIT
        lease = self._local.admit_now(tenant)
        return lease if lease is WAIT or lease is None else BorrowedLease(lease)

    async def acquire(self, tenant: str, quota: TenantQuota) -> Lease | None:
        share = self._shares.get(tenant)
        if share is None:
            share = self._shares[tenant] = _Share()
            self._start()
            await self._renew(tenant, share, quota)
        share.seen += 1
        if share.quota is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2 * self._owner._link.timeout_s):
                    await share.ready.wait()
        if share.quota is None:  # Redis did not answer: the fallback decides
            owner = self._owner
            return cast(Lease | None, await owner._acquire_local(
                tenant, owner._plan_of(tenant), asyncio.get_running_loop().time(), False, outage=False))
        if quota.max_concurrency is not None and not share.slots:
            share.short = True
            raise self._owner._reject(tenant, self.period_s, "concurrency")
        if share.no_rate:
            raise self._owner._reject(tenant, self.period_s, "rate")
        share.refresh = False
        try:
            lease = await self._local.acquire(tenant)
        except QuotaExceeded as exc:
            if exc.reason == "concurrency":
                share.short = True
            raise
        return None if lease is None else BorrowedLease(lease)

    def release(self, lease: Lease) -> None:
        if isinstance(lease, BorrowedLease):
            lease._released = True
            self._local.release(lease.inner)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        owner = self._owner
        for tenant, share in self._shares.items():  # give the slots back now rather than in 2 periods
            for slot in share.slots:
                owner._queue_release(tenant, slot, 0)
            share.slots = []

    # -- internals ------------------------------------------------------------------------------

    def _share_quota(self, tenant: str) -> TenantQuota:
        share = self._shares.get(tenant)
        if share is None or share.quota is None:
            return TenantQuota()
        return share.quota

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._renew_forever(),
                                                                name="ragguard-quota-shares")

    async def _renew_forever(self) -> None:
        owner = self._owner
        while self._shares and not owner._closed:
            await asyncio.sleep(self.period_s)
            for tenant, share in list(self._shares.items()):
                if share.seen == 0 and self._local.in_flight(tenant) == 0 and (
                    self._clock() - share.renewed_at > 4 * self.period_s
                ):
                    del self._shares[tenant]  # idle: its slots expire in Redis within 2 periods
                    continue
                await self._renew(tenant, share, owner._quota_for(tenant))

    async def _renew(self, tenant: str, share: _Share, quota: TenantQuota) -> None:
        owner = self._owner
        now = self._clock()
        elapsed = now - share.renewed_at if share.renewed_at > -math.inf else self.period_s
        measured = share.seen / max(elapsed, 1e-3)
        share.demand_per_s = max(_MIN_DEMAND_PER_S, measured if share.quota is None
                                 else 0.5 * share.demand_per_s + 0.5 * measured)
        share.seen = 0
        keys = quota_keys(tenant, owner._prefix)
        maxc = quota.max_concurrency or 0
        rate = quota.rate_per_s or 0.0
        prefix = f"{owner.holder_id}:s{next(self._renewals)}:"
        args: list[Any] = [
            "" if owner.clock is None else repr(float(owner.clock())), owner.holder_id, repr(self.period_s),
            repr(share.demand_per_s), repr(rate), maxc, self._local.in_flight(tenant), prefix,
            "1" if share.short else "0", len(share.slots), *share.slots,
        ]
        share.short = False
        try:
            _share, granted_rate, kept, granted = await owner._link.call(
                functools.partial(self._script, keys=[keys[0], keys[3]], args=args))
        except SharedStateUnavailable:
            return  # keep the current share; covers() lets it go after two periods
        share.slots = share.slots[: int(kept)] + [f"{prefix}{i}" for i in range(1, int(granted) + 1)]
        share_rate = float(granted_rate.decode() if isinstance(granted_rate, bytes) else granted_rate)
        burst = burst_of(rate, quota.burst) if rate else 0
        # no rate granted (the others hold it all until they renew): refuse until the next renewal,
        # rather than let the local bucket's clock run ahead at a near-zero rate
        share.no_rate = bool(rate) and share_rate < rate * 1e-3
        share.quota = TenantQuota(
            max_concurrency=max(1, len(share.slots)) if maxc else None,
            rate_per_s=max(share_rate, rate * 1e-3) if rate else None,
            burst=max(1, math.ceil(burst * share_rate / rate)) if rate else None,
            max_wait_s=quota.max_wait_s,
            timeout_s=quota.timeout_s,
        )
        share.renewed_at = self._clock()
        share.refresh = True
        share.ready.set()
