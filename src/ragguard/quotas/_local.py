"""In-process tenant quotas: a FIFO bulkhead and a GCRA rate limiter per tenant.

Concurrency is a counting semaphore whose waiters are served strictly first come, first served: a
released slot is handed to the oldest waiter directly, so a stream of new arrivals cannot overtake
it, and only while the slots in flight are below the tenant's *current* limit (a lowered limit is
not over-granted; a raised one wakes as many waiters as it frees). Rate is the Generic Cell Rate
Algorithm (:mod:`ragguard.quotas._gcra`: a token bucket of ``burst`` tokens refilled at
``rate_per_s``): one number per tenant, the theoretical arrival time.

Tenants may share a pool (``pool_for``; from a :class:`~ragguard.Policy`, the tenants it does not
list share ``unlisted_pool``): a member's request takes a slot and a token of its own quota and of
the pool's, so that new tenant ids cannot multiply the default quota. A pool at least as strict as
the member's own quota (the default pool is the default quota) is the only check made.

A refusal's ``retry_after_s`` is an estimate, not a guess: for rate, exactly when the next token is
due; for concurrency, when the refused caller's turn would come if every call in flight is held
for the usual time (see :meth:`LocalQuotas._slot_eta`).
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
from anyio.lowlevel import checkpoint_if_cancelled

from .. import _validate as v
from .._admission import WAIT  # a quota backend's admit_now answers as a gate's enter does
from .._clock import Clock, monotonic, move_on_after, sleep_of
from .._deadline import remaining
from ..options import Policy, PoolQuota, TenantQuota
from ..options._policy import burst_of
from ._gcra import EPSILON_S, Rate
from ._refusal import refusal

__all__ = ["WAIT", "Lease", "LocalQuotas", "QuotaBackend"]


class Lease:
    """What one admitted request holds: give it back with ``QuotaBackend.release``.

    ``started``: when it was admitted (the quotas' clock, seconds); ``slot``: whether it holds a
    concurrency slot (the tenant had a concurrency limit when it was admitted); ``pool``: the
    pool whose concurrency slot it holds too, if any."""

    __slots__ = ("_released", "bucket", "pool", "slot", "started")

    def __init__(self, bucket: _Bucket, started: float, slot: bool = False) -> None:
        self.bucket = bucket
        self.started = started
        self.slot = slot
        self.pool: _Bucket | None = None
        self._released = False


_UNKNOWN_HOLD_S = 0.01  # the hold time assumed before any call has released a slot
_ETA_SCAN = 10_000  # at most this many calls in flight are looked at per refusal

POOL_NAME = "*unlisted"
"""The name of the pool the unlisted tenants share (not a valid tenant id: no tenant is named so)."""



class QuotaBackend(Protocol):
    """Admits requests of a tenant; implemented in memory here and over Redis in
    ``ragguard.redis``.

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


_NO_HOLD_S = 0.0  # one shared float: a tenant that never held a slot stores no float of its own


class _Bucket:
    """One tenant's quota state. Kept small, since many tenants sit idle: the holders list and the
    waiter queue exist only while something is held or queued (an empty deque alone is 600 bytes),
    and the quota's derived limits are shared by every tenant of the quota."""

    __slots__ = (
        "hold_ewma_s",
        "holders",
        "in_flight",
        "limit",
        "pool",
        "prune_at",
        "quota",
        "rate",
        "tat",
        "tenant",
        "used",
        "waiters",
    )

    def __init__(self, tenant: str, quota: TenantQuota | PoolQuota, now: float,
                 pool: _Bucket | None = None) -> None:
        self.tenant = tenant
        self.pool = pool  # the bucket of the pool this tenant shares, if any
        self.in_flight = 0
        # Leases that took a slot, oldest first; released ones are dropped lazily (see hold()),
        # and the whole list once nothing is held. None: nothing held.
        self.holders: list[Lease] | None = None
        self.prune_at = 32
        self.waiters: deque[_Waiter] | None = None  # None: nobody queued
        self.tat = now
        self.hold_ewma_s = _NO_HOLD_S
        self.used = True  # admitted since the last eviction sweep (see LocalQuotas._evict)
        self.adopt(quota)

    def adopt(self, quota: TenantQuota | PoolQuota) -> None:
        """Take ``quota``'s limits (precomputed for the admission fast path)."""
        self.quota = quota
        self.limit, self.rate = _limits(quota)

    def hold(self, started: float) -> Lease:
        """A lease on one of this bucket's slots (``in_flight`` already counts it)."""
        lease = Lease(self, started, True)
        self.keep(lease)
        return lease

    def keep(self, lease: Lease) -> None:
        """Record ``lease`` among the holders of one of this bucket's slots."""
        holders = self.holders
        if holders is None:
            self.holders = [lease]
        else:
            holders.append(lease)
            if len(holders) > self.prune_at:
                self.prune()

    def prune(self) -> None:
        """Drop released leases; next time once ``in_flight + 32`` more were admitted (so the
        cost is amortised O(1) per admission and the list stays within twice what is held)."""
        holders = [h for h in self.holders or () if not h._released]
        self.holders = holders or None
        self.prune_at = len(holders) + self.in_flight + 32

    def idle(self, now: float) -> bool:
        return self.in_flight == 0 and not self.waiters and self.tat <= now

    def unused(self) -> bool:
        return self.in_flight == 0 and not self.waiters


_limits_of: dict[int, tuple[TenantQuota | PoolQuota, tuple[int | None, Rate | None]]] = {}


def _limits(quota: TenantQuota | PoolQuota) -> tuple[int | None, Rate | None]:
    """``(max_concurrency, rate)`` of ``quota``, computed once per quota object and shared (the
    100,000 tenants of one quota share one :class:`Rate`)."""
    got = _limits_of.get(id(quota))
    if got is not None and got[0] is quota:
        return got[1]
    per_s = quota.rate_per_s
    rate = None if per_s is None else Rate(per_s, burst_of(per_s, quota.burst))
    limits = (quota.max_concurrency, rate)
    if len(_limits_of) >= 1024:  # quota_for may build a quota per call: stay bounded
        _limits_of.clear()
    _limits_of[id(quota)] = (quota, limits)
    return limits


class LocalQuotas:
    """Per-tenant concurrency and rate quotas held in this process.

    ``quota_for(tenant)`` gives each tenant's :class:`~ragguard.TenantQuota` (read when a tenant is
    first seen, whenever a request has to queue, and whenever a slot is given back while requests
    queue, so a changed quota applies from then on: a raised limit admits the waiters it frees at
    once, a lowered one is not over-granted by the next hand-off); ``clock`` returns monotonic
    seconds: rates, hold times, ``retry_after_s`` and the queueing waits all follow it (a wait for
    a rate token sleeps with ``sleep``, default the clock's own, see :func:`ragguard._clock.sleep_of`;
    a wait for a slot is bounded on the clock's timers when it has them, e.g. a FakeClock).
    ``pool_for(tenant)`` gives the :class:`~ragguard.PoolQuota` the tenant shares with every other
    tenant it gives one for (None: none), read with its quota; default: when ``quota_for`` is a
    Policy's ``quota`` method, the policy's :meth:`~ragguard.Policy.pool` (the unlisted tenants
    share ``unlisted_pool``), else no pool. Raises ConfigError for ``max_tenants`` < 1.

    Idle tenants are forgotten once ``max_tenants`` are tracked, least recently used first, so a
    flood of tenant ids cannot grow memory without bound (an idle tenant holds about 250 bytes:
    100,000 of them about 25 MB; ``benchmarks/tenants.py`` measures it).
    """

    def __init__(
        self,
        quota_for: Callable[[str], TenantQuota],
        *,
        clock: Clock = monotonic,
        max_tenants: int = 100_000,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
        pool_for: Callable[[str], PoolQuota | None] | None = None,
    ) -> None:
        v.count("max_tenants", max_tenants, 1)
        self._quota_for = quota_for
        self._pool_for = pool_for if pool_for is not None else policy_pool_of(quota_for)
        self._clock = clock
        self._sleep = sleep if sleep is not None else sleep_of(clock)
        self._max_tenants = max_tenants
        self._buckets: dict[str, _Bucket] = {}
        self._pool: _Bucket | None = None  # the shared pool's bucket (one pool per backend)

    # -- inspection -----------------------------------------------------------------------

    def in_flight(self, tenant: str) -> int:
        """Requests of ``tenant`` holding a concurrency slot now."""
        b = self._buckets.get(tenant)
        return 0 if b is None else b.in_flight

    def waiting(self, tenant: str) -> int:
        """Requests of ``tenant`` queued for a slot now."""
        b = self._buckets.get(tenant)
        return 0 if b is None or not b.waiters else sum(1 for w in b.waiters if not w.event.is_set())

    def total_in_flight(self) -> int:
        """Requests of every tenant holding a concurrency slot now."""
        return sum(b.in_flight for b in self._buckets.values())

    def total_waiting(self) -> int:
        """Requests of every tenant queued for a slot now."""
        return sum(self.waiting(tenant) for tenant, b in self._buckets.items() if b.waiters)

    def pool_in_flight(self) -> int:
        """Requests holding a slot of the shared pool now (0 without a pool)."""
        return 0 if self._pool is None else self._pool.in_flight

    # -- admission ------------------------------------------------------------------------

    def admit_now(self, tenant: str) -> Lease | Any | None:
        """Admit one request of ``tenant`` if that needs no waiting: a Lease, None for an unlimited
        tenant, or :data:`WAIT` (then ``await acquire(tenant)`` queues or refuses it)."""
        bucket = self._buckets.get(tenant)
        if bucket is None:
            quota = self._quota_for(tenant)
            if quota.max_concurrency is None and quota.rate_per_s is None and not self._pooled(tenant):
                return None
            # a tenant seen for the first time (or again after it was forgotten) is admitted here
            # too: its fresh bucket has a free slot and a token
            bucket = self._bucket(tenant, quota, self._clock())
        limit = bucket.limit
        if limit is not None and (bucket.in_flight >= limit or bucket.waiters):
            return WAIT
        now = self._clock()
        rate = bucket.rate
        tat = 0.0
        if rate is not None:  # rate.take(bucket.tat, now), inlined: once per request
            tat = bucket.tat
            tat = (tat if tat > now else now) + rate.interval_s
            if tat - now - rate.tolerance_s > EPSILON_S:
                return WAIT
        pool = bucket.pool
        if pool is not None:
            if not self._pool_admits(pool, now):
                return WAIT
            if pool.limit is not None:
                pool.in_flight += 1
        if rate is not None:
            bucket.tat = tat
        bucket.used = True
        if limit is not None:  # bucket.hold(now), inlined: this is the hot path
            bucket.in_flight += 1
            lease = Lease(bucket, now, True)
            holders = bucket.holders
            if holders is None:
                bucket.holders = [lease]
            else:
                holders.append(lease)
                if len(holders) > bucket.prune_at:
                    bucket.prune()
        else:
            lease = Lease(bucket, now)
        if pool is not None and pool.limit is not None:
            lease.pool = pool
            pool.keep(lease)
        return lease

    @staticmethod
    def _pool_admits(pool: _Bucket, now: float) -> bool:
        """Take the pool's rate token now if it has a slot and a token (the caller takes the slot)."""
        limit = pool.limit
        if limit is not None and (pool.in_flight >= limit or pool.waiters):
            return False
        rate = pool.rate
        if rate is not None:
            tat = rate.take(pool.tat, now)
            if tat is None:
                return False
            pool.tat = tat
        return True

    async def acquire(self, tenant: str) -> Lease | None:
        """Admit one request of ``tenant``, waiting FIFO up to the quota's ``max_wait_s`` (cut to
        the request's deadline). Returns a lease (None when the tenant is unlimited and in no pool).

        Raises :class:`~ragguard.QuotaExceeded` with ``reason`` ``rate``, ``concurrency`` or
        ``deadline`` and the seconds after which a retry could be admitted.
        """
        quota = self._quota_for(tenant)
        now = self._clock()
        bucket = self._buckets.get(tenant)
        if bucket is None or bucket.quota is not quota:
            if quota.max_concurrency is None and quota.rate_per_s is None and not self._pooled(tenant):
                return None
            bucket = self._bucket(tenant, quota, now)
        elif bucket.limit is None and bucket.rate is None and bucket.pool is None:
            return None  # unlimited
        pool = bucket.pool
        pool_quota = None if pool is None else pool.quota
        wait_budget = quota.max_wait_s
        left = remaining()
        limited_by_deadline = left is not None and left < wait_budget
        if limited_by_deadline:
            wait_budget = left  # type: ignore[assignment]
        reserved = 0.0
        rated: list[tuple[_Bucket, Rate]] = []  # buckets whose token it took
        try:
            for b in (bucket, pool):
                if b is not None and b.rate is not None:
                    delay = self._reserve(b, b.rate, tenant, now, wait_budget, limited_by_deadline)
                    reserved = max(reserved, delay)
                    rated.append((b, b.rate))
            if reserved > 0.0:
                await self._sleep(reserved)
            start = self._clock()
            slots: list[_Bucket] = []  # buckets whose slot it took
            try:
                for b, q in ((bucket, quota), (pool, pool_quota)):
                    if b is None or q is None or q.max_concurrency is None:
                        continue
                    if b.in_flight < q.max_concurrency and not b.waiters:
                        b.in_flight += 1
                    else:
                        budget = wait_budget - reserved - (self._clock() - start)
                        await self._wait_for_slot(b, q, tenant, budget, limited_by_deadline)
                    slots.append(b)
            except BaseException:
                for b in slots:  # a refused request holds no slot
                    b.in_flight -= 1
                    self._hand_off(b)
                raise
        except BaseException:
            for b, rate in rated:
                b.tat = rate.give_back(b.tat)  # a refused request spends no rate
            raise
        bucket.used = True
        now = self._clock()
        lease = bucket.hold(now) if bucket in slots else Lease(bucket, now)
        if pool is not None and pool in slots:
            lease.pool = pool
            pool.keep(lease)
        return lease

    def release(self, lease: Lease | None) -> None:
        """Give back the slot ``lease`` holds (idempotent: a second release does nothing).

        The slot goes to the oldest waiter only while the slots in flight are below the tenant's
        current limit (the quota is read again when someone waits)."""
        if lease is None or lease._released:
            return
        lease._released = True
        pool = lease.pool
        if pool is None and not lease.slot:
            return
        held = self._clock() - lease.started
        if pool is not None:
            self._free(pool, held)
        if lease.slot:
            self._free(lease.bucket, held)

    def _free(self, bucket: _Bucket, held: float) -> None:
        bucket.hold_ewma_s = held if bucket.hold_ewma_s == 0.0 else 0.8 * bucket.hold_ewma_s + 0.2 * held
        bucket.in_flight -= 1
        if bucket.waiters:
            self._hand_off(bucket)
        elif bucket.in_flight == 0:
            bucket.holders = None  # every lease it held is released: drop the list

    def take_slot(self, tenant: str, *, free: bool = False) -> Lease | Any | None:
        """Count one running request of ``tenant`` that was admitted elsewhere (the Redis quotas,
        whose fallback this is), without waiting and without spending rate; None when neither the
        tenant nor its pool has a concurrency limit. It may take the tenant (or its pool) past its
        limit: new requests then wait. With ``free``, only a free slot is taken (the tenant and
        its pool below their limits, nobody queued): :data:`WAIT` when there is none. Give it back
        with :meth:`give_slot`."""
        quota = self._quota_for(tenant)
        now = self._clock()
        bucket = self._buckets.get(tenant)
        if bucket is None or bucket.quota is not quota:
            if quota.max_concurrency is None and not self._pooled(tenant):
                return None
            bucket = self._bucket(tenant, quota, now)
        if free and any(b is not None and b.limit is not None and (b.in_flight >= b.limit or b.waiters)
                        for b in (bucket, bucket.pool)):
            return WAIT
        pool = bucket.pool
        if pool is not None and pool.limit is not None:
            pool.in_flight += 1
        else:
            pool = None
        if bucket.limit is not None:
            bucket.in_flight += 1
            lease = bucket.hold(now)
        elif pool is None:
            return None
        else:
            lease = Lease(bucket, now)
        if pool is not None:
            lease.pool = pool
            pool.keep(lease)
        return lease

    def give_slot(self, lease: Lease | None) -> None:
        """Give back a slot from :meth:`take_slot` (idempotent): to the oldest waiter, unless the
        tenant (or its pool) is over its limit (then the count just drops)."""
        if lease is None or lease._released:
            return
        lease._released = True
        held = self._clock() - lease.started
        for b in (lease.bucket if lease.slot else None, lease.pool):
            if b is None:
                continue
            if b.limit is not None and b.in_flight > b.limit:
                b.in_flight -= 1  # over its limit: nobody may take this slot
            else:
                self._free(b, held)

    # -- internals ------------------------------------------------------------------------

    def _pooled(self, tenant: str) -> bool:
        return self._pool_for is not None and self._pool_for(tenant) is not None

    def _bucket(self, tenant: str, quota: TenantQuota, now: float) -> _Bucket:
        pool = self._pool_bucket(tenant, now)
        old = self._buckets.get(tenant)
        if old is not None:
            # the policy changed: keep the live counts, adopt the new limits (a raised
            # concurrency limit admits as many waiters as it frees, now)
            old.pool = pool
            old.adopt(quota)
            self._grant(old)
            return old
        if len(self._buckets) >= self._max_tenants:
            self._evict(now)
        bucket = self._buckets[tenant] = _Bucket(tenant, quota, now, pool)
        return bucket

    def _pool_bucket(self, tenant: str, now: float) -> _Bucket | None:
        """The bucket of the pool ``tenant`` shares (None: it shares none); one per backend, kept
        out of the tenants' map so that eviction never forgets it; a changed pool is adopted."""
        pool_quota = None if self._pool_for is None else self._pool_for(tenant)
        if pool_quota is None:
            return None
        pool = self._pool
        if pool is None:
            pool = self._pool = _Bucket(POOL_NAME, pool_quota, now)
        elif pool.quota is not pool_quota:
            pool.adopt(pool_quota)
            self._grant(pool)
        return pool

    def _evict(self, now: float) -> None:
        """Forget tenants down to 90% of ``max_tenants``, least recently used first: idle ones,
        then those whose only state is a future rate token (they may burst once more: the price
        of a bounded map). Tenants with requests in flight or queued are kept.

        Least recently used as CLOCK approximates it (the second-chance sweep of page caches): the
        map is swept in its order; a tenant admitted since the sweep last passed it (``used``) is
        spared once and moved to the end, one that was not is forgotten. An admission pays one
        flag store for it, and the sweep amortised O(1) per new tenant."""
        target = int(self._max_tenants * 0.9)
        buckets = self._buckets
        for fully_idle in (True, False):
            for _ in range(2):  # the second pass finds the tenants the first pass spared
                for key, bucket in list(buckets.items()):
                    if len(buckets) <= target:
                        return
                    if bucket.in_flight or bucket.waiters or (fully_idle and bucket.tat > now):
                        continue
                    if bucket.used:
                        bucket.used = False
                        del buckets[key]
                        buckets[key] = bucket  # to the end: swept last next time
                    else:
                        del buckets[key]

    def _reserve(
        self, bucket: _Bucket, rate: Rate, tenant: str, now: float, wait_budget: float, by_deadline: bool
    ) -> float:
        """Take ``bucket``'s next token, due in the seconds returned (0.0: now); raises QuotaExceeded
        when that is longer than ``wait_budget``."""
        tat, delay = rate.step(bucket.tat, now)
        if delay <= EPSILON_S:
            delay = 0.0
        elif delay > wait_budget:
            raise self._reject(tenant, delay, "deadline" if by_deadline else "rate")
        bucket.tat = tat
        return delay

    async def _wait_for_slot(
        self, bucket: _Bucket, quota: TenantQuota | PoolQuota, tenant: str, budget: float, by_deadline: bool
    ) -> None:
        if budget <= 0.0:
            raise self._reject(
                tenant, self._slot_eta(bucket, quota), "deadline" if by_deadline else "concurrency"
            )
        waiter = _Waiter()
        if bucket.waiters is None:
            bucket.waiters = deque()
        bucket.waiters.append(waiter)
        cancels = _cancel_requests()
        try:
            with move_on_after(self._clock, budget):
                await waiter.event.wait()
            if _cancel_requests() > cancels:
                # An outside Task.cancel() landed in the loop cycle in which the wait timed out (or
                # was granted), and the cancel scope took it for its own (anyio before the fix of
                # agronholm/anyio#1214, which ``anyio>=4.3`` still allows):
                # the caller was cancelled, so end cancelled, never with a refusal or a slot.
                raise asyncio.CancelledError("cancelled while waiting for a quota slot")
            if not waiter.granted:
                await checkpoint_if_cancelled()  # an enclosing scope was cancelled meanwhile
        except BaseException:
            if waiter.granted:
                bucket.in_flight -= 1
                self._hand_off(bucket)
            else:
                self._abandon(bucket, waiter)
            raise
        if waiter.granted:
            return
        self._abandon(bucket, waiter)
        raise self._reject(
            tenant, self._slot_eta(bucket, quota), "deadline" if by_deadline else "concurrency"
        )

    @staticmethod
    def _abandon(bucket: _Bucket, waiter: _Waiter) -> None:
        # Leave the queue now rather than as a marked entry skipped by the next release: behind a
        # slot held for long, every refused request would otherwise stay queued until then.
        waiter.event.set()
        waiters = bucket.waiters
        if waiters is None:  # pragma: no cover - already popped, and the queue dropped
            return
        try:
            waiters.remove(waiter)
        except ValueError:  # pragma: no cover - already popped
            pass
        if not waiters:
            bucket.waiters = None

    def _hand_off(self, bucket: _Bucket) -> None:
        """A slot was given back: re-read the tenant's quota (so a changed limit applies to this
        hand-off) and grant the waiters what the current limit allows. (A pool's limits are
        re-read whenever a member's quota is.)"""
        if bucket is not self._pool:
            quota = self._quota_for(bucket.tenant)
            if quota is not bucket.quota:
                bucket.adopt(quota)
        self._grant(bucket)

    @staticmethod
    def _grant(bucket: _Bucket) -> None:
        """Admit the oldest live waiters while the slots in flight are below the current limit."""
        waiters = bucket.waiters
        if waiters is None:
            return
        limit = bucket.limit
        while waiters and (limit is None or bucket.in_flight < limit):
            w = waiters.popleft()
            if not w.event.is_set():
                w.granted = True
                w.event.set()
                bucket.in_flight += 1
        if not waiters:
            bucket.waiters = None

    def _slot_eta(self, bucket: _Bucket, quota: TenantQuota | PoolQuota) -> float:
        """Seconds until a concurrency slot could be the refused caller's (at least 1 ms).

        Each call in flight is expected to hold its slot for the usual hold time ``H`` (a moving
        average of the holds seen, 10 ms before any), and a call already older than ``H`` to run
        as long again as it has so far (an overdue call tells nothing better). Slots free at
        those times, those over a lowered limit for good; each caller queued ahead takes the
        next free one for ``H``; the refused caller would be next.
        """
        now = self._clock()
        hold = bucket.hold_ewma_s if bucket.hold_ewma_s > 0.0 else _UNKNOWN_HOLD_S
        limit = quota.max_concurrency if quota.max_concurrency is not None else bucket.in_flight
        ahead = sum(1 for w in bucket.waiters or () if not w.event.is_set())
        need = max(0, bucket.in_flight - limit) + ahead + 1  # slot releases before our turn
        ends: list[float] = []
        young = 0
        for seen, lease in enumerate(bucket.holders or ()):  # oldest first
            if lease._released:
                continue
            age = now - lease.started
            if age > hold:
                ends.append(now + age)  # overdue
            else:
                ends.append(lease.started + hold)  # later holders are younger still: done soon
                young += 1
                if young >= need:
                    break
            if seen >= _ETA_SCAN:
                break
        heapq.heapify(ends)
        for _ in range(max(0, bucket.in_flight - limit)):  # slots over a lowered limit: gone
            if ends:
                heapq.heappop(ends)
        for _ in range(ahead):  # each caller ahead takes the next free slot for ``hold``
            free_at = heapq.heappop(ends) if ends else now + hold
            heapq.heappush(ends, max(free_at, now) + hold)
        eta = (ends[0] if ends else now + hold) - now
        return max(0.001, eta)

    _reject = staticmethod(refusal)


def policy_pool_of(quota_for: Callable[[str], TenantQuota]) -> Callable[[str], PoolQuota | None] | None:
    """The policy's :meth:`~ragguard.Policy.pool` when ``quota_for`` is a Policy's ``quota``
    method (the unlisted tenants then share its pool), else None."""
    owner = getattr(quota_for, "__self__", None)
    if isinstance(owner, Policy) and getattr(quota_for, "__func__", None) is Policy.quota:
        return owner.pool
    return None


def _cancel_requests() -> int:
    """How often the running asyncio task was asked to cancel (``Task.cancelling()``); 0 outside
    an asyncio task (trio cancels through scopes, which ``checkpoint_if_cancelled`` sees)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no asyncio loop in this thread: trio
        return 0
    return 0 if task is None else task.cancelling()
