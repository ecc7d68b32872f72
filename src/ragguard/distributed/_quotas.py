"""Tenant quotas shared by every replica through Redis (the ``QuotaBackend`` of many replicas).

A request costs one round trip::

    acquire()   one EVALSHA: the releases of the tenant this replica made that Redis has not
                acknowledged, then the admission (a concurrency lease and a GCRA rate token),
                atomically
    release()   no I/O: the release joins the tenant's outbox; the next admission of the tenant
                carries it, or the background sends it ``release_delay_s`` later

A release is never dropped: it stays in the outbox until Redis has it, or until the lease it gives
back would have expired in Redis anyway (``lease_s`` after it was queued). Releases are idempotent
in Redis, so one sent again after a lost reply changes nothing.

Concurrency is a lease per in-flight call: a member ``<holder>:<n>`` of the tenant's ZSET scored by
its expiry. The replica renews the leases it holds every ``lease_s / 3`` seconds, so a live call
keeps its slot however long it runs, and a crashed replica's slots come back ``lease_s`` after
its last renewal. Rate is GCRA (one ``tat`` number per tenant). One Lua script checks both and
takes both: a call refused for concurrency spends no rate, one refused for rate holds no slot.

Waiting (``max_wait_s`` > 0): a rate reservation within the wait is made at once and slept off
(exact, like ``LocalQuotas``). A full bulkhead queues the request in Redis, first come first served
across replicas: a freed slot goes to the oldest waiter, which takes it at its next poll (polls are
spaced by its place in the queue, at most ``max_poll_s`` apart; a release on this replica wakes its
waiters at once).

When Redis is unreachable, the ``fallback`` :class:`~ragguard.quotas.LocalQuotas` admits. Every
request Redis admitted also holds a slot there (``_fallback``), so the fallback counts the requests
still running. When Redis answers again, the replica puts every lease it runs back into Redis
(those admitted locally too) before it admits through Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from .._clock import Clock, monotonic
from .._context import validate_tenant_id
from .._errors import ConfigError, QuotaExceeded
from ..deadline import remaining
from ..events import QuotaRejected, bus
from ..policy import TenantQuota
from ..quotas import WAIT, Lease, LocalQuotas
from ._link import LinkBusy, RedisLink, Script, SharedStateUnavailable
from ._outbox import Outbox
from ._scripts import QUOTA_ADMIT, QUOTA_SYNC

if TYPE_CHECKING:
    from ._borrow import LocalLease

__all__ = ["RedisQuotas", "SharedLease", "quota_keys"]

_BUSY_PAUSE_S = 0.002


def quota_keys(tenant: str, key_prefix: str = "ragguard") -> list[str]:
    """The Redis keys of ``tenant``'s quota: ``{<prefix>:quota:<tenant>}:`` then ``leases``, ``tat``,
    ``queue``, ``qexp``, ``grants``, ``share`` (tenant ids cannot contain braces)."""
    tag = f"{{{key_prefix}:quota:{tenant}}}"
    return [f"{tag}:{part}" for part in ("leases", "tat", "queue", "qexp", "grants", "share")]


class SharedLease(Lease):
    """One request admitted by :class:`RedisQuotas`.

    ``shared``: admitted through Redis (False: by the local fallback while Redis was unreachable);
    ``lease_id``: its id in the tenant's lease ZSET; ``counted``: it takes a concurrency slot.
    """

    __slots__ = ("counted", "in_redis", "keys", "lease_id", "local", "refund_s", "shared", "tenant")

    def __init__(self, tenant: str, keys: list[str], lease_id: str, refund_s: float, started: float,
                 *, shared: bool, counted: bool, local: Lease | None = None) -> None:
        super().__init__(None, started)  # type: ignore[arg-type]  # no local bucket
        self.tenant = tenant
        self.keys = keys
        self.lease_id = lease_id
        self.refund_s = refund_s
        self.shared = shared
        self.counted = counted
        self.in_redis = shared and counted
        self.local = local


class _Plan:
    """What every admission of one tenant sends, worked out once per tenant and quota."""

    __slots__ = ("keys", "maxc", "may_queue", "quota", "refund_s", "script_args", "unlimited")

    def __init__(self, quota: TenantQuota, keys: list[str], lease_s: float, queue_ttl_s: float) -> None:
        rate = quota.rate_per_s or 0.0
        burst = (quota.burst or max(1, math.ceil(rate))) if rate else 1
        self.quota = quota
        self.keys = keys
        self.unlimited = quota.max_concurrency is None and quota.rate_per_s is None
        self.maxc = quota.max_concurrency or 0
        self.may_queue = 1 if self.maxc else 0
        self.refund_s = 1.0 / rate if rate else 0.0
        # the admission script's keys (all but the local-lease share) and its plan argument, encoded
        # once: redis-py passes bytes through as they are
        plan = f"{self.maxc} {float(rate)!r} {burst} {lease_s!r} {queue_ttl_s!r}"
        self.script_args = (*(key.encode() for key in keys[:5]), plan.encode())


def _seconds(option: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{option} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


class RedisQuotas:
    """Per-tenant concurrency and rate quotas held in Redis, for ``Guard(policy, quotas=...)``.

    ``quota_for(tenant)`` gives each tenant's :class:`~ragguard.TenantQuota` (e.g.
    ``policy.quota``); ``redis`` is a ``redis.asyncio.Redis`` or ``RedisCluster`` client.

    Options (keyword-only, seconds): ``key_prefix`` (default ``"ragguard"``); ``lease_s``
    (default 10): how long a crashed replica's slots stay taken; ``redis_timeout_s`` (0.25),
    ``probe_every_s`` (1.0) and ``max_in_flight``: see :class:`RedisLink`; ``fallback``: the
    :class:`LocalQuotas` used while Redis is unreachable (default: ``LocalQuotas(quota_for)``; each
    replica then admits a whole quota, so pass one built on a share of it when over-admission
    matters); ``holder_id``: this replica's name in lease ids (default: pid and a random suffix
    from ``rng``); ``clock``: seconds shared by every replica for leases and rate (default None:
    the Redis server's TIME, which needs no synchronised hosts; tests pass a ``FakeClock``);
    ``max_poll_s`` (0.05): the longest pause between two polls of a queued request;
    ``release_delay_s`` (0.005): how long a release may wait to ride on the tenant's next admission
    before it is sent on its own; ``local_lease``: a :class:`LocalLease` for tenants that accept a
    small error in exchange for admissions without a round trip (see ``docs/distributed.md``).

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
        max_in_flight: int | None = None,
        fallback: LocalQuotas | None = None,
        holder_id: str | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        max_poll_s: float = 0.05,
        release_delay_s: float = 0.005,
        local_lease: LocalLease | None = None,
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
        if not isinstance(holder_id, str) or not holder_id or any(c in holder_id for c in "{} \t\r\n"):
            raise ConfigError(f"holder_id must be a non-empty str, no braces or spaces, got {holder_id!r}")
        self._quota_for = quota_for
        self._prefix = key_prefix
        self.lease_s = _seconds("lease_s", lease_s)
        self._max_poll_s = _seconds("max_poll_s", max_poll_s)
        self._release_delay_s = _seconds("release_delay_s", release_delay_s)
        self.holder_id = holder_id
        self.clock = clock
        self.fallback = fallback if fallback is not None else LocalQuotas(quota_for)
        self._link = RedisLink(redis, "quotas", timeout_s=redis_timeout_s, probe_every_s=probe_every_s,
                               max_in_flight=max_in_flight, clock=link_clock)
        self._link.on_restored.append(self._on_restored)
        self._queue_ttl_s = 4 * self._max_poll_s + 2 * self._link.timeout_s
        self._plans: dict[str, _Plan] = {}
        self._admit = Script(redis, QUOTA_ADMIT, 5)
        self._sync = Script(redis, QUOTA_SYNC, 5)
        self._ids = itertools.count()
        self._running: dict[str, SharedLease] = {}
        self._outbox = Outbox(expire_s=self.lease_s)
        self._adopting: dict[str, asyncio.Event] = {}  # tenant -> set when its leases are back in Redis
        self._restores = 0  # link restorations so far: an adoption gives way to a newer one
        self._freed: dict[str, asyncio.Event] = {}
        self._hold_ewma_s: dict[str, float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._renewer: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._flush_timer: asyncio.TimerHandle | None = None
        self._closed = False
        self.local_lease = local_lease
        if local_lease is not None:
            local_lease._bind(self, redis)

    @property
    def shared(self) -> bool:
        """True while admissions go through Redis; False while on the local fallback."""
        return not self._link.degraded

    def held(self) -> int:
        """Redis leases this replica holds now (in-flight calls counted in Redis)."""
        return sum(1 for lease in self._running.values() if lease.in_redis)

    def pending_releases(self) -> int:
        """Releases waiting in the outbox (sent with the next admission, or in the background)."""
        return len(self._outbox)

    # -- admission ------------------------------------------------------------------------

    def admit_now(self, tenant: str) -> Any:
        """The synchronous fast path of ``QuotaBackend``: None for an unlimited tenant; otherwise
        :data:`ragguard.quotas.WAIT` (admission goes through Redis in :meth:`acquire`), or, while
        Redis is unreachable or for a tenant in local-lease mode, the local answer."""
        quota = self._quota_for(tenant)
        if quota.max_concurrency is None and quota.rate_per_s is None:
            return None
        borrowed = self.local_lease
        if borrowed is not None and borrowed.covers(tenant):
            return borrowed.admit_now(tenant, quota)
        if self._link.degraded:
            local = self.fallback.admit_now(tenant)
            if local is WAIT or local is None:
                return local
            return self._local_lease(tenant, quota, local)
        return WAIT

    async def acquire(self, tenant: str) -> Lease | None:
        """Admit one request of ``tenant`` across all replicas; returns a lease for
        :meth:`release` (None when the tenant is unlimited).

        Waits up to the quota's ``max_wait_s`` (cut to the request's deadline). Raises
        :class:`~ragguard.QuotaExceeded` (``reason`` ``rate``, ``concurrency`` or ``deadline``),
        :class:`~ragguard.InvalidInput` for a bad tenant id. Never fails because Redis is down:
        the local fallback admits instead.
        """
        quota = self._quota_for(tenant)
        plan = self._plans.get(tenant)
        if plan is None or plan.quota is not quota:
            plan = self._plan(tenant, quota)
        if plan.unlimited:
            return None
        borrowed = self.local_lease
        if borrowed is not None and borrowed.covers(tenant):
            return await borrowed.acquire(tenant, quota)
        if self._link.degraded:
            return await self._acquire_local(tenant, quota)
        adopting = self._adopting.get(tenant)
        if adopting is not None:  # Redis must count the leases run here before it admits more
            await adopting.wait()
        budget = quota.max_wait_s
        left = remaining()
        by_deadline = left is not None and left < budget
        if by_deadline:
            budget = max(0.0, cast(float, left))
        loop = asyncio.get_running_loop()
        give_up = loop.time() + budget if budget else 0.0
        keys, maxc, refund = plan.keys, plan.maxc, plan.refund_s
        lease_id = f"{self.holder_id}:{next(self._ids)}"
        busy_since: float | None = None
        while True:
            wait_left = give_up - loop.time() if budget else 0.0
            ops, releases = self._carry(tenant)
            # the script's request argument: 'now id wait_s may_queue' then the releases carried
            request = (f"{'-' if self.clock is None else repr(float(self.clock()))} {lease_id} "
                       f"{f'{wait_left!r} {plan.may_queue}' if wait_left > 0 else '0 0'}{releases}")
            try:
                reply = await self._link.call(self._admit, *plan.script_args, request)
            except LinkBusy:
                # Nothing was sent: the client's pool is empty (backpressure, not an outage).
                self._outbox.unsent(tenant, ops)
                now = loop.time()
                busy_since = now if busy_since is None else busy_since
                if now - busy_since < self._link.timeout_s:
                    await asyncio.sleep(_BUSY_PAUSE_S)
                    continue
                return await self._acquire_local(tenant, quota)
            except SharedStateUnavailable:
                self._outbox.unsent(tenant, ops)
                self._queue_release(tenant, lease_id, refund)  # it may have been admitted
                return await self._acquire_local(tenant, quota)
            except BaseException:
                self._outbox.unsent(tenant, ops)
                self._queue_release(tenant, lease_id, refund)  # the script may have run
                raise
            self._outbox.acked(tenant, ops)
            if reply == b"ok 0" or reply == "ok 0":  # admitted, to start now: the common case
                return self._admitted(tenant, keys, lease_id, refund, maxc > 0, loop)
            verdict, number = (reply.decode() if isinstance(reply, bytes) else str(reply)).split()
            if verdict == "ok":
                lease = self._admitted(tenant, keys, lease_id, refund, maxc > 0, loop)
                await self._start_after(lease, float(number), loop)
                return lease
            if verdict == "rate":
                raise self._reject(tenant, float(number), "deadline" if by_deadline else "rate")
            if verdict != "queued":
                raise self._reject(tenant, self._slot_eta(tenant, maxc),
                                   "deadline" if by_deadline else "concurrency")
            pause = min(self._max_poll_s, 0.002 * (1 + int(number))) * (0.5 + self._rng.random())
            try:
                await self._wait_turn(tenant, max(0.0, min(pause, give_up - loop.time())))
            except BaseException:
                self._queue_release(tenant, lease_id, 0.0)  # leave the queue
                raise

    def release(self, lease: Lease | None) -> None:
        """Give back ``lease`` (idempotent). Never waits: Redis learns it with the tenant's next
        admission, or from the background within ``release_delay_s``; kept until it lands."""
        if lease is None or lease._released:
            return
        if not isinstance(lease, SharedLease):
            borrowed = self.local_lease
            if borrowed is not None and borrowed.owns(lease):
                borrowed.release(lease)
            else:
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
        """Send pending releases (bounded wait), stop the background work and the Redis probe."""
        self._closed = True
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        for task in (self._renewer, self._flusher):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._renewer = self._flusher = None
        if self.local_lease is not None:
            await self.local_lease.aclose()
        if len(self._outbox) and not self._link.degraded:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2 * self._link.timeout_s):
                    await self._flush_all()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=2 * self._link.timeout_s)
            for task in pending:  # an adoption still trying (or waiting to try again)
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self._link.aclose()

    async def __aenter__(self) -> RedisQuotas:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- internals: leases ------------------------------------------------------------------

    def _plan(self, tenant: str, quota: TenantQuota) -> _Plan:
        validate_tenant_id(tenant)  # once per tenant: its plan is kept
        if len(self._plans) >= 10_000:
            self._plans.clear()  # a flood of tenant ids cannot grow this without bound
        plan = self._plans[tenant] = _Plan(quota, quota_keys(tenant, self._prefix), self.lease_s,
                                           self._queue_ttl_s)
        return plan

    def _admitted(self, tenant: str, keys: list[str], lease_id: str, refund: float, counted: bool,
                  loop: asyncio.AbstractEventLoop) -> SharedLease:
        lease = SharedLease(tenant, keys, lease_id, refund, loop.time(), shared=True, counted=counted)
        if counted:
            lease.local = self.fallback.take_slot(tenant)
            if self._renewer is None or self._renewer.done():
                self._renewer = loop.create_task(self._renew_forever(), name="ragguard-quota-leases")
        self._running[lease_id] = lease
        return lease

    async def _start_after(self, lease: SharedLease, delay: float, loop: asyncio.AbstractEventLoop) -> None:
        """Sleep off a rate reservation; a cancelled wait gives the lease and its token back."""
        try:
            await asyncio.sleep(delay)
        except BaseException:
            self._give_back(lease, refund=True)
            raise
        lease.started = loop.time()

    async def _acquire_local(self, tenant: str, quota: TenantQuota) -> Lease | None:
        local = self.fallback.admit_now(tenant)
        if local is WAIT:
            local = await self.fallback.acquire(tenant)
        if local is None:
            return None
        return self._local_lease(tenant, quota, local)

    def _local_lease(self, tenant: str, quota: TenantQuota, local: Lease) -> SharedLease:
        lease = SharedLease(tenant, quota_keys(tenant, self._prefix), f"{self.holder_id}:{next(self._ids)}",
                            0.0, local.started, shared=False, counted=quota.max_concurrency is not None,
                            local=local)
        self._running[lease.lease_id] = lease
        return lease

    def _give_back(self, lease: SharedLease, *, refund: bool) -> None:
        lease._released = True
        self._running.pop(lease.lease_id, None)
        local, lease.local = lease.local, None
        if local is not None:
            if lease.shared:
                self.fallback.give_slot(local)
            else:
                self.fallback.release(local)
        refund_s = lease.refund_s if refund else 0.0
        if lease.in_redis or refund_s or lease.tenant in self._adopting:
            self._queue_release(lease.tenant, lease.lease_id, refund_s)
        freed = self._freed.pop(lease.tenant, None)
        if freed is not None:
            freed.set()  # this replica's waiters poll now: the release rides on their poll

    async def _wait_turn(self, tenant: str, seconds: float) -> None:
        freed = self._freed.get(tenant)
        if freed is None:
            freed = self._freed[tenant] = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await freed.wait()

    def _slot_eta(self, tenant: str, max_concurrency: int) -> float:
        hold = self._hold_ewma_s.get(tenant) or 0.01
        return max(0.001, hold / max(1, max_concurrency))

    @staticmethod
    def _reject(tenant: str, retry_after_s: float, reason: str) -> QuotaExceeded:
        if bus.active:
            bus.emit(QuotaRejected(tenant, reason, retry_after_s))
        return QuotaExceeded(tenant, retry_after_s, reason)

    # -- internals: the outbox of releases ------------------------------------------------------

    def _queue_release(self, tenant: str, lease_id: str, refund_s: float) -> None:
        self._outbox.add(tenant, lease_id, refund_s, monotonic())
        if self._flush_timer is None:
            self._arm_flush(self._release_delay_s)

    def _arm_flush(self, after_s: float) -> None:
        if self._closed or self._flush_timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # sent with the tenant's next admission, or at aclose
        self._flush_timer = loop.call_later(after_s, self._flush_due)

    def _flush_due(self) -> None:
        """Timer: send the releases no admission carried within ``release_delay_s``."""
        self._flush_timer = None
        if self._closed or self._link.degraded or not len(self._outbox):
            return  # after an outage, the restore sends them
        delay = self._release_delay_s
        wait = self._outbox.oldest() + delay - monotonic()
        if wait > 0 or (self._flusher is not None and not self._flusher.done()):
            self._arm_flush(max(wait, 0.001) if wait < math.inf else delay)
            return
        self._flusher = asyncio.get_running_loop().create_task(self._flush_once(),
                                                               name="ragguard-quota-releases")

    async def _flush_once(self) -> None:
        ok = await self._flush_all(before=monotonic() - self._release_delay_s)
        if len(self._outbox):
            self._arm_flush(self._release_delay_s if ok else max(self._release_delay_s, 0.05))

    def _carry(self, tenant: str) -> tuple[list[str], str]:
        if tenant in self._adopting:
            return [], ""  # after the adoption: a release must reach Redis after the lease it removes
        return self._outbox.carry(tenant, monotonic())

    async def _flush_all(self, before: float = math.inf) -> bool:
        due = [t for t in self._outbox.due(before) if t not in self._adopting]
        results = await asyncio.gather(*(self._sync_tenant(t, [], "renew") for t in due))
        return all(results)

    async def _sync_tenant(self, tenant: str, lease_ids: list[str], mode: str) -> bool:
        ops, releases = self._outbox.carry(tenant, monotonic()) if mode == "adopt" else self._carry(tenant)
        if not ops and not lease_ids:
            return True
        args = ["" if self.clock is None else repr(float(self.clock())), repr(self.lease_s), mode,
                len(lease_ids), *lease_ids, releases]
        try:
            await self._link.call(self._sync, *quota_keys(tenant, self._prefix)[:5], *args)
        except BaseException as exc:
            self._outbox.unsent(tenant, ops)
            if isinstance(exc, SharedStateUnavailable):
                return False
            raise
        self._outbox.acked(tenant, ops)
        return True

    # -- internals: renewal and recovery -----------------------------------------------------------

    async def _renew_forever(self) -> None:
        every = self.lease_s / 3
        while not self._closed:
            await asyncio.sleep(every)
            if not self._running:
                return  # the next admission starts it again (checked after the sleep: a task per
                #         period at most, not one per request when calls are shorter than a turn)
            if self._link.degraded:
                continue
            by_tenant: dict[str, list[str]] = {}
            for lease_id, lease in list(self._running.items()):
                if lease.in_redis:
                    by_tenant.setdefault(lease.tenant, []).append(lease_id)
            for tenant, ids in by_tenant.items():
                if tenant not in self._adopting:
                    await self._sync_tenant(tenant, ids, "renew")

    def _on_restored(self) -> None:
        if self._closed:
            return
        self._restores += 1
        for lease in self._running.values():
            if lease.counted:
                self._adopting.setdefault(lease.tenant, asyncio.Event())
        task = asyncio.get_running_loop().create_task(self._adopt_all(), name="ragguard-quota-adopt")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _adopt_all(self) -> None:
        """Put every lease this replica runs back into Redis (renewals stopped while it was away,
        and the fallback admitted some), together with the releases made meanwhile.

        A tenant whose adoption fails while the link stays up (one timeout, or on a cluster a
        master not back yet when another answered the probe) is tried again every
        ``probe_every_s``: left out, its running calls would hold no slot in Redis, and the other
        replicas would admit past the limit. A degraded link, a newer restoration or close ends it.
        """
        loop = asyncio.get_running_loop()
        round_ = self._restores
        while True:
            failed: list[str] = []
            for tenant in list(self._adopting):
                leases = [lease for lease in self._running.values()
                          if lease.counted and lease.tenant == tenant]
                try:
                    if await self._sync_tenant(tenant, [lease.lease_id for lease in leases], "adopt"):
                        for lease in leases:
                            lease.in_redis = True
                    else:
                        failed.append(tenant)
                finally:
                    event = self._adopting.pop(tenant, None)
                    if event is not None:
                        event.set()
            if failed:
                await asyncio.sleep(self._link.probe_every_s)
            if not failed or self._closed or self._link.degraded or round_ != self._restores:
                break
            for tenant in failed:
                self._adopting.setdefault(tenant, asyncio.Event())
        if any(lease.in_redis for lease in self._running.values()) and (
            self._renewer is None or self._renewer.done()
        ):
            self._renewer = loop.create_task(self._renew_forever(), name="ragguard-quota-leases")
        self._arm_flush(0.0)
