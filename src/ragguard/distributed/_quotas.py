"""Tenant quotas shared by every replica through Redis (the ``QuotaBackend`` of many replicas).

Concurrency is a lease per in-flight call: a member ``<holder>:<n>`` of the tenant's ZSET scored by
its expiry. The replica renews the leases it holds every ``lease_s / 3`` seconds, so a live call
keeps its slot however long it runs, and a crashed replica's slots come back ``lease_s`` after
its last renewal. Rate is GCRA (one ``tat`` number per tenant). One Lua script checks both and
takes both, atomically: a call refused for concurrency spends no rate, one refused for rate
holds no slot.

Waiting: a rate reservation within ``max_wait_s`` is made at once and slept off (exact, like
``LocalQuotas``); a full bulkhead is polled with jittered backoff until ``max_wait_s`` (so across
replicas, waiters are not served strictly first come, first served).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import os
import random
from collections.abc import Callable
from typing import Any, cast

from .._clock import Clock, monotonic
from .._context import validate_tenant_id
from .._errors import ConfigError, QuotaExceeded
from ..deadline import remaining
from ..events import QuotaRejected, bus
from ..policy import TenantQuota
from ..quotas import WAIT, Lease, LocalQuotas
from ._link import RedisLink, SharedStateUnavailable
from ._scripts import QUOTA_ACQUIRE, QUOTA_RELEASE, QUOTA_RENEW

__all__ = ["RedisQuotas", "SharedLease", "quota_keys"]


def quota_keys(tenant: str, key_prefix: str = "ragguard") -> list[str]:
    """The Redis keys of ``tenant``'s quota: ``{<prefix>:quota:<tenant>}:leases|tat``."""
    tag = f"{{{key_prefix}:quota:{tenant}}}"
    return [f"{tag}:leases", f"{tag}:tat"]


class SharedLease(Lease):
    """A slot admitted through Redis: its lease id in the tenant's ZSET (``None`` when the tenant
    has no concurrency limit) and the seconds of rate to refund if it never ran."""

    __slots__ = ("keys", "lease_id", "refund_s", "tenant")

    def __init__(self, tenant: str, keys: list[str], lease_id: str | None, refund_s: float,
                 started: float) -> None:
        super().__init__(cast(Any, None), started)
        self.tenant = tenant
        self.keys = keys
        self.lease_id = lease_id
        self.refund_s = refund_s


def _seconds(option: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{option} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


class RedisQuotas:
    """Per-tenant concurrency and rate quotas held in Redis, for ``Guard(policy, quotas=...)``.

    ``quota_for(tenant)`` gives each tenant's :class:`~ragguard.TenantQuota` (e.g.
    ``policy.quota``); ``redis`` is a ``redis.asyncio.Redis`` client.

    Options (keyword-only, seconds): ``key_prefix`` (default ``"ragguard"``); ``lease_s``
    (default 10): how long a crashed replica's slots stay taken; ``redis_timeout_s`` (0.25) and
    ``probe_every_s`` (1.0): see :class:`RedisLink`; ``fallback``: the :class:`LocalQuotas` used while
    Redis is unreachable (default: ``LocalQuotas(quota_for)``; each replica then admits a whole
    quota, so pass one built on a share of it when over-admission matters); ``holder_id``:
    this replica's name in lease ids (default: pid and a random suffix from ``rng``); ``clock``:
    seconds shared by every replica for leases and rate (default None: the Redis server's TIME,
    which needs no synchronised hosts; tests pass a ``FakeClock``); ``max_poll_s`` (0.05): the
    longest pause between two tries for a full bulkhead.

    Raises ConfigError for an out-of-range option.
    """

    def __init__(
        self,
        quota_for: Callable[[str], TenantQuota],
        redis: Any,
        *,
        key_prefix: str = "ragguard",
        lease_s: float = 10.0,
        redis_timeout_s: float = 0.25,
        probe_every_s: float = 1.0,
        fallback: LocalQuotas | None = None,
        holder_id: str | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        max_poll_s: float = 0.05,
        link_clock: Clock = monotonic,
    ) -> None:
        if not callable(quota_for):
            raise ConfigError(f"quota_for must be a callable tenant -> TenantQuota, got {quota_for!r}")
        if not isinstance(key_prefix, str) or not key_prefix or "{" in key_prefix or "}" in key_prefix:
            raise ConfigError(f"key_prefix must be a non-empty str without braces, got {key_prefix!r}")
        if fallback is not None and not isinstance(fallback, LocalQuotas):
            raise ConfigError(f"fallback must be a ragguard LocalQuotas, got {type(fallback).__name__}")
        if clock is not None and not callable(clock):
            raise ConfigError(f"clock must be None or a callable returning seconds, got {clock!r}")
        if rng is not None and not callable(getattr(rng, "random", None)):
            raise ConfigError(f"rng must be a random.Random, got {rng!r}")
        self._rng = rng if rng is not None else random.Random()
        if holder_id is None:
            holder_id = f"{os.getpid()}-{self._rng.getrandbits(32):08x}"
        if not isinstance(holder_id, str) or not holder_id or "{" in holder_id or "}" in holder_id:
            raise ConfigError(f"holder_id must be a non-empty str without braces, got {holder_id!r}")
        self._quota_for = quota_for
        self._prefix = key_prefix
        self.lease_s = _seconds("lease_s", lease_s)
        self._max_poll_s = _seconds("max_poll_s", max_poll_s)
        self.holder_id = holder_id
        self.clock = clock
        self.fallback = fallback if fallback is not None else LocalQuotas(quota_for)
        self._link = RedisLink(redis, "quotas", timeout_s=redis_timeout_s, probe_every_s=probe_every_s,
                               clock=link_clock)
        self._acquire_script = redis.register_script(QUOTA_ACQUIRE)
        self._release_script = redis.register_script(QUOTA_RELEASE)
        self._renew_script = redis.register_script(QUOTA_RENEW)
        self._ids = itertools.count()
        self._held: dict[str, SharedLease] = {}
        self._hold_ewma_s: dict[str, float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._renewer: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def shared(self) -> bool:
        """True while admissions go through Redis; False while on the local fallback."""
        return not self._link.degraded

    def held(self) -> int:
        """Redis leases this replica holds now (in-flight calls admitted through Redis)."""
        return len(self._held)

    # -- admission ------------------------------------------------------------------------

    def admit_now(self, tenant: str) -> Any:
        """The synchronous fast path of ``QuotaBackend``: None for an unlimited tenant; otherwise
        :data:`ragguard.quotas.WAIT` (admission goes through Redis in :meth:`acquire`), or, while
        Redis is unreachable, the local fallback's answer."""
        quota = self._quota_for(tenant)
        if quota.max_concurrency is None and quota.rate_per_s is None:
            return None
        if self._link.degraded:
            return self.fallback.admit_now(tenant)
        return WAIT

    async def acquire(self, tenant: str) -> Lease | None:
        """Admit one request of ``tenant`` across all replicas; returns a lease for
        :meth:`release` (None when the tenant is unlimited).

        Waits up to the quota's ``max_wait_s`` (cut to the request's deadline). Raises
        :class:`~ragguard.QuotaExceeded` (``reason`` ``rate``, ``concurrency`` or ``deadline``),
        :class:`~ragguard.InvalidInput` for a bad tenant id. Never fails because Redis is down:
        the local fallback admits instead.
        """
        validate_tenant_id(tenant)
        quota = self._quota_for(tenant)
        if quota.max_concurrency is None and quota.rate_per_s is None:
            return None
        if self._link.degraded:
            return await self.fallback.acquire(tenant)
        budget = quota.max_wait_s
        left = remaining()
        by_deadline = left is not None and left < budget
        if by_deadline:
            budget = max(0.0, cast(float, left))
        loop = asyncio.get_running_loop()
        give_up = loop.time() + budget
        keys = quota_keys(tenant, self._prefix)
        maxc = quota.max_concurrency or 0
        rate = quota.rate_per_s or 0.0
        burst = (quota.burst or max(1, math.ceil(rate))) if rate else 1
        backoff = 0.005
        while True:
            lease_id = f"{self.holder_id}:{next(self._ids)}" if maxc else ""
            args = ["" if self.clock is None else repr(float(self.clock())), lease_id, repr(self.lease_s),
                    maxc, repr(float(rate)), burst, repr(max(0.0, give_up - loop.time()))]
            try:
                ok, reason, seconds_s = await self._link.call(
                    functools.partial(self._acquire_script, keys=keys, args=args))
            except SharedStateUnavailable:
                return await self.fallback.acquire(tenant)
            except BaseException:
                if lease_id:
                    self._spawn_release(keys, lease_id, 0.0)  # the script may have run
                raise
            seconds = float(seconds_s)
            if int(ok):
                return await self._admitted(tenant, keys, lease_id or None, 1.0 / rate if rate else 0.0,
                                            seconds)
            reason_s = reason.decode() if isinstance(reason, bytes) else str(reason)
            if reason_s == "rate":
                raise self._reject(tenant, seconds, "deadline" if by_deadline else "rate")
            wait_left = give_up - loop.time()
            if wait_left <= 0:
                raise self._reject(tenant, self._slot_eta(tenant, maxc),
                                   "deadline" if by_deadline else "concurrency")
            await asyncio.sleep(min(wait_left, backoff * (0.5 + self._rng.random())))
            backoff = min(2 * backoff, self._max_poll_s)

    async def _admitted(self, tenant: str, keys: list[str], lease_id: str | None, interval: float,
                        delay: float) -> SharedLease:
        loop = asyncio.get_running_loop()
        lease = SharedLease(tenant, keys, lease_id, interval, loop.time())
        if lease_id is not None:
            self._held[lease_id] = lease
            if self._renewer is None or self._renewer.done():
                self._renewer = loop.create_task(self._renew_forever(), name="ragguard-quota-leases")
        if delay > 0:
            try:
                await asyncio.sleep(delay)
            except BaseException:
                self._give_back(lease, refund=True)
                raise
            lease.started = loop.time()
        return lease

    def release(self, lease: Lease | None) -> None:
        """Give back ``lease`` (idempotent). Never waits: the Redis update runs in the background
        (if it cannot reach Redis, the lease expires after ``lease_s``)."""
        if lease is None or lease._released:
            return
        if not isinstance(lease, SharedLease):
            self.fallback.release(lease)
            return
        try:
            held = asyncio.get_running_loop().time() - lease.started
        except RuntimeError:
            held = 0.0
        old = self._hold_ewma_s.get(lease.tenant)
        if old is None and len(self._hold_ewma_s) >= 10_000:
            self._hold_ewma_s.clear()
        self._hold_ewma_s[lease.tenant] = held if not old else 0.8 * old + 0.2 * held
        self._give_back(lease, refund=False)

    # -- lifecycle ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop the lease renewal, wait (bounded) for pending releases, stop the Redis probe."""
        self._closed = True
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2 * self._link.timeout_s)
        await self._link.aclose()

    async def __aenter__(self) -> RedisQuotas:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- internals ------------------------------------------------------------------------

    def _give_back(self, lease: SharedLease, *, refund: bool) -> None:
        lease._released = True
        if lease.lease_id is not None:
            self._held.pop(lease.lease_id, None)
        refund_s = lease.refund_s if refund else 0.0
        if lease.lease_id is not None or refund_s:
            self._spawn_release(lease.keys, lease.lease_id or "", refund_s)

    def _spawn_release(self, keys: list[str], lease_id: str, refund_s: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop to send it on: the lease expires after lease_s
        task = loop.create_task(self._release_now(keys, lease_id, refund_s))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release_now(self, keys: list[str], lease_id: str, refund_s: float) -> None:
        if self._link.degraded:
            return
        with contextlib.suppress(SharedStateUnavailable):
            await self._link.call(functools.partial(
                self._release_script, keys=keys, args=[lease_id, repr(refund_s)]))

    async def _renew_forever(self) -> None:
        every = self.lease_s / 3
        while self._held and not self._closed:
            await asyncio.sleep(every)
            if self._link.degraded:
                continue
            by_key: dict[str, list[str]] = {}
            for lease_id, lease in list(self._held.items()):
                by_key.setdefault(lease.keys[0], []).append(lease_id)
            now = "" if self.clock is None else repr(float(self.clock()))
            for key, ids in by_key.items():
                with contextlib.suppress(SharedStateUnavailable):
                    await self._link.call(functools.partial(
                        self._renew_script, keys=[key], args=[now, repr(self.lease_s), *ids]))

    def _slot_eta(self, tenant: str, max_concurrency: int) -> float:
        hold = self._hold_ewma_s.get(tenant) or 0.01
        return max(0.001, hold / max(1, max_concurrency))

    @staticmethod
    def _reject(tenant: str, retry_after_s: float, reason: str) -> QuotaExceeded:
        if bus.active:
            bus.emit(QuotaRejected(tenant, reason, retry_after_s))
        return QuotaExceeded(tenant, retry_after_s, reason)
