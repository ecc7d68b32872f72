"""Tenant quotas shared by every replica through Redis (the ``QuotaBackend`` of many replicas).

A request costs one round trip::

    acquire()   one EVALSHA: what this replica owes Redis for the tenant (releases not yet
                acknowledged, leases Redis may not count), then the admission (a concurrency
                lease and a GCRA rate token), atomically
    release()   no I/O: the release joins the tenant's outbox; the next admission of the tenant
                carries it (or takes over its slot: the lease id passes to the new request and
                nothing is removed), or the background sends it ``release_delay_s`` later

A release is never dropped: it stays in the outbox until Redis has it, or until the lease it gives
back would have expired in Redis anyway (``lease_s`` after it was queued). Releases are idempotent
in Redis, so one sent again after a lost reply changes nothing.

Concurrency is a lease per in-flight call: a member ``<holder>:<n>`` of the tenant's ZSET scored by
its expiry. The replica renews (puts back) the leases it runs every ``lease_s / 3`` seconds, so a
live call keeps its slot however long it runs, a crashed replica's slots come back ``lease_s``
after its last renewal, and a Redis that lost its data counts the calls again at the next renewal.
Rate is GCRA (one ``tat`` member of the same ZSET). One Lua script checks both and takes both: a
call refused for concurrency spends no rate, one refused for rate holds no slot.

Tenants may share a pool (``pool_for``; from a Policy: the unlisted tenants share
``unlisted_pool``): their keys live under the pool's hash tag, and the script counts a request
against the tenant and the pool at once (the tenant alone when the pool covers its quota).

Waiting (``max_wait_s`` > 0): a rate reservation within the wait is made at once and slept off
(exact, like ``LocalQuotas``). A full bulkhead queues the request in Redis, first come first served
across replicas: a freed slot goes to the oldest waiter, which takes it at its next poll (polls are
spaced by its place in the queue, at most ``max_poll_s`` apart; a release on this replica wakes its
waiters at once).

When Redis is unreachable, the ``fallback`` :class:`~ragguard.quotas.LocalQuotas` admits. Every
request Redis admitted that still runs then takes a slot there too, so the fallback counts them.
When Redis answers again, the replica puts every lease it runs back into Redis (those admitted
locally too) before it goes back to shared state; a request still waiting in the fallback then is
decided by Redis. A request admitted locally while Redis answers (after one command timed out) is
put into Redis with the replica's next command for the tenant, in the background within a
round trip.
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
from .._deadline import remaining
from .._errors import ConfigError
from ..options import PoolQuota, TenantQuota
from ..options._policy import burst_of
from ..quotas import LocalQuotas
from ..quotas._gcra import Rate
from ..quotas._local import WAIT, Lease, policy_pool_of
from ..quotas._refusal import refusal
from ._keys import pool_keys, quota_keys
from ._link import LinkBusy, Probe, RedisLink, Script, SharedStateUnavailable
from ._outbox import Outbox
from ._scripts import QUOTA, QUOTA_SHARE

if TYPE_CHECKING:
    from ._borrow import LocalLease

__all__ = ["RedisQuotas", "SharedLease"]

_BUSY_PAUSE_S = 0.002
# The flags of the script's request (see _scripts.QUOTA).
_MAY_QUEUE, _TAKES_OVER, _REFRESH, _OPS_ONLY = 1, 2, 4, 8
# Release codes of the outbox: + refund the rate token, + leave the queues.
_REFUND, _LEAVE_QUEUE = 1, 2


class SharedLease(Lease):
    """One request admitted by :class:`RedisQuotas`.

    ``shared``: admitted through Redis (False: by the local fallback); ``lease_id``: its id in the
    lease sets; ``counted``: it takes a concurrency slot; ``in_redis``: Redis may count it (so its
    release must be sent).
    """

    __slots__ = ("counted", "in_redis", "lease_id", "local", "rated", "shared", "tenant")

    def __init__(self, tenant: str, lease_id: str, started: float, *, shared: bool, counted: bool,
                 rated: bool, local: Lease | None = None) -> None:
        super().__init__(None, started)  # type: ignore[arg-type]  # no local bucket
        self.tenant = tenant
        self.lease_id = lease_id
        self.shared = shared
        self.counted = counted
        self.rated = rated
        self.in_redis = shared and counted
        self.local = local


class _Plan:
    """What every admission of one tenant sends, worked out once per tenant, quota and pool."""

    __slots__ = ("counted", "fresh_until", "keys", "maxc", "pool", "pooled", "quota", "rated", "refresh_s",
                 "script", "script_plan", "unlimited")

    def __init__(self, tenant: str, quota: TenantQuota, pool: PoolQuota | None, prefix: str, lease_s: float,
                 grant_s: float, queue_ttl_s: float) -> None:
        self.quota = quota
        self.pool = pool
        self.pooled = pool is not None
        levels: list[tuple[list[str], TenantQuota | PoolQuota]] = []
        limited = quota.max_concurrency is not None or quota.rate_per_s is not None
        if pool is None:
            if limited:
                levels.append((quota_keys(tenant, prefix)[:3], quota))
        else:
            if limited and not pool.covers(quota):  # else the pool alone decides: one level
                levels.append((pool_keys(prefix, tenant), quota))
            levels.append((pool_keys(prefix), pool))
        self.unlimited = not levels
        self.counted = any(q.max_concurrency is not None for _, q in levels)
        self.rated = any(q.rate_per_s is not None for _, q in levels)
        self.maxc = min((q.max_concurrency for _, q in levels if q.max_concurrency is not None), default=0)
        rate_only = any(q.max_concurrency is None for _, q in levels)
        # TTLs are refreshed by this replica every lease_s / 2 (grant_s for the grants of a rate-only
        # level, which are swept then)
        self.refresh_s = min(lease_s / 2, grant_s) if rate_only else lease_s / 2
        self.fresh_until = -math.inf
        spec = "".join(_level_spec(q) for _, q in levels)
        # the keys and the plan argument, encoded once: redis-py passes bytes through as they are
        self.keys = [key.encode() for keys, _ in levels for key in keys]
        self.script_plan = f"{lease_s!r} {grant_s!r} {queue_ttl_s!r}{spec}".encode()
        self.script: Script | None = None  # the script bound to this many keys (set by RedisQuotas)


def _level_spec(q: TenantQuota | PoolQuota) -> str:
    """``' maxc interval tolerance'`` of one level for the QUOTA script: its concurrency limit (0:
    none) and its rate's GCRA interval and tolerance (seconds; ``0 0``: no rate)."""
    per_s = q.rate_per_s
    if per_s is None:
        return f" {q.max_concurrency or 0} 0 0"
    rate = Rate(per_s, burst_of(per_s, q.burst))
    return f" {q.max_concurrency or 0} {rate.interval_s!r} {rate.tolerance_s!r}"


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
    matters); ``pool_for(tenant)``: the :class:`~ragguard.PoolQuota` the tenant shares with every
    other tenant it gives one for, across replicas (default: when ``quota_for`` is a Policy's
    ``quota`` method, its :meth:`~ragguard.Policy.pool`: the unlisted tenants share
    ``unlisted_pool``); ``holder_id``: this replica's name in lease ids (default: pid and a random
    suffix from ``rng``); ``clock``: seconds shared by every replica for leases and rate (default
    None: the Redis server's TIME, which needs no synchronised hosts; tests pass a ``FakeClock``);
    ``max_poll_s`` (0.05): the longest pause between two polls of a queued request;
    ``release_delay_s`` (0.005): how long a release may wait to ride on the tenant's next admission
    before it is sent on its own; ``local_lease``: a :class:`LocalLease` for tenants that accept a
    small error in exchange for admissions without a round trip (see ``docs/distributed.md``;
    never for tenants in a pool).

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
        pool_for: Callable[[str], PoolQuota | None] | None = None,
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
        if pool_for is not None and not callable(pool_for):
            raise ConfigError(f"pool_for must be a callable tenant -> PoolQuota | None, got {pool_for!r}")
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
        self._pool_for = pool_for if pool_for is not None else policy_pool_of(quota_for)
        self._prefix = key_prefix
        self.lease_s = _seconds("lease_s", lease_s)
        self._max_poll_s = _seconds("max_poll_s", max_poll_s)
        self._release_delay_s = _seconds("release_delay_s", release_delay_s)
        self.holder_id = holder_id
        self.clock = clock
        self.fallback = fallback if fallback is not None else LocalQuotas(quota_for, pool_for=self._pool_for)
        probe = Probe(redis, f"{{{key_prefix}:quota:*probe}}:leases", (QUOTA, QUOTA_SHARE))
        self._link = RedisLink(redis, "quotas", timeout_s=redis_timeout_s, probe_every_s=probe_every_s,
                               max_in_flight=max_in_flight, clock=link_clock, probe=probe,
                               restore=self._put_back)
        self._link.on_degraded.append(self._count_in_fallback)
        self._link.on_restored.append(self._on_restored)
        self._link.on_reconnect.append(self._recount)
        self._queue_ttl_s = 4 * self._max_poll_s + 2 * self._link.timeout_s
        self._plans: dict[str, _Plan] = {}
        # one script; a Script per number of keys (3: one level, 6: a tenant and its pool)
        self._scripts = {3: Script(redis, QUOTA, 3), 6: Script(redis, QUOTA, 6)}
        self._ids = itertools.count()
        # tenant -> lease id -> lease: every request this replica runs (through Redis or locally)
        self._running: dict[str, dict[str, SharedLease]] = {}
        # tenant -> lease id -> lease: counted leases this replica runs that Redis may not count
        # (admitted locally, or after an outage or a restart of Redis); every command for the
        # tenant carries them until one is acknowledged
        self._unadopted: dict[str, dict[str, SharedLease]] = {}
        self._outbox = Outbox(expire_s=self.lease_s)
        self._freed: dict[str, asyncio.Event] = {}
        self._hold_ewma_s: dict[str, float] = {}
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

    @property
    def problem(self) -> str | None:
        """Why Redis refused ragguard's configuration (credentials, ACL, TLS), while that keeps
        the quotas on the local fallback; None otherwise."""
        return self._link.problem

    def in_flight(self, tenant: str) -> int:
        """Requests of ``tenant`` with a concurrency slot this replica runs now (admitted through
        Redis or by the fallback): Redis counts every replica's."""
        running = self._running.get(tenant)
        return 0 if running is None else len(running)

    def total_in_flight(self) -> int:
        """Requests of every tenant with a concurrency slot this replica runs now."""
        return sum(len(running) for running in self._running.values())

    def held(self) -> int:
        """Redis leases this replica holds now (in-flight calls counted in Redis)."""
        return sum(1 for running in self._running.values() for lease in running.values() if lease.in_redis)

    def uncounted(self) -> int:
        """Calls this replica runs that Redis may not count yet (admitted by the fallback, or run
        across an outage, until they are put back)."""
        return sum(len(leases) for leases in self._unadopted.values())

    def pending_releases(self) -> int:
        """Releases waiting in the outbox (sent with the next admission, or in the background)."""
        return len(self._outbox)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, *, strict: bool = False) -> RedisQuotas:
        """Check Redis now with the health probe (the scripts load, the ACL user may run every
        command they run on the quota keys); returns self.

        Redis unreachable: the quotas start on the local fallback and keep probing. Redis refusing
        the configuration (a wrong password, a missing ACL permission, an untrusted TLS
        certificate): logged at ERROR, then the same, or with ``strict=True``
        :class:`~ragguard.ConfigError` naming the cause (never the secret)."""
        await self._link.start(strict=strict)
        return self

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
        await self._link.aclose()

    async def __aenter__(self) -> RedisQuotas:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- admission ------------------------------------------------------------------------

    def admit_now(self, tenant: str) -> Any:
        """The synchronous fast path of ``QuotaBackend``: None for an unlimited tenant; otherwise
        :data:`ragguard.quotas.WAIT` (admission goes through Redis in :meth:`acquire`), or, while
        Redis is unreachable or for a tenant in local-lease mode, the local answer."""
        plan = self._plan_of(tenant)
        quota = plan.quota
        if plan.unlimited:
            return None
        borrowed = self.local_lease
        if borrowed is not None and not plan.pooled and borrowed.covers(tenant):
            return borrowed.admit_now(tenant, quota)
        if self._link.degraded:
            local = self.fallback.admit_now(tenant)
            if local is WAIT or local is None:
                return local
            return self._local_lease(tenant, plan, local)
        return WAIT

    async def acquire(self, tenant: str) -> Lease | None:
        """Admit one request of ``tenant`` across all replicas; returns a lease for
        :meth:`release` (None when the tenant is unlimited).

        Waits up to the quota's ``max_wait_s`` (cut to the request's deadline). Raises
        :class:`~ragguard.QuotaExceeded` (``reason`` ``rate``, ``concurrency`` or ``deadline``),
        :class:`~ragguard.InvalidInput` for a bad tenant id. Never fails because Redis is down:
        the local fallback admits instead.
        """
        plan = self._plan_of(tenant)
        quota = plan.quota
        if plan.unlimited:
            return None
        borrowed = self.local_lease
        if borrowed is not None and not plan.pooled and borrowed.covers(tenant):
            return await borrowed.acquire(tenant, quota)
        budget = quota.max_wait_s
        left = remaining()
        by_deadline = left is not None and left < budget
        if by_deadline:
            budget = max(0.0, cast(float, left))
        loop = asyncio.get_running_loop()
        give_up = loop.time() + budget
        if self._link.degraded:
            return await self._acquire_local(tenant, plan, give_up, by_deadline, outage=True)
        return await self._acquire_shared(tenant, plan, give_up, by_deadline, loop)

    async def _acquire_shared(self, tenant: str, plan: _Plan, give_up: float, by_deadline: bool,
                              loop: asyncio.AbstractEventLoop) -> Lease | None:
        # The slot of a release not yet sent passes to this request: its lease id is reused, and
        # Redis removes nothing and adds nothing (a release sent in no command, so none can undo it).
        taken_over = self._outbox.take_fresh(tenant) if plan.counted else None
        lease_id = taken_over if taken_over is not None else f"{self.holder_id}:{next(self._ids)}"
        script = cast(Script, plan.script)
        busy_since: float | None = None
        while True:
            wait_left = give_up - loop.time()
            flags = (_TAKES_OVER if taken_over is not None else 0)
            if wait_left > 0:
                flags |= _MAY_QUEUE if plan.counted else 0
            else:
                wait_left = 0.0
            mono = monotonic()
            if mono >= plan.fresh_until:
                flags |= _REFRESH
                plan.fresh_until = mono + plan.refresh_s
            ops, adopted, carried = self._carry(tenant)
            now = "-" if self.clock is None else repr(float(self.clock()))
            request = f"{now} {lease_id} {wait_left!r} {flags}{carried}"
            try:
                reply = await self._link.call(script, *plan.keys, plan.script_plan, request)
            except BaseException as exc:
                self._unsent(tenant, ops, adopted, plan, flags)
                if isinstance(exc, LinkBusy):
                    # Nothing was sent: the client's pool is empty (backpressure, not an outage).
                    now_s = loop.time()
                    busy_since = now_s if busy_since is None else busy_since
                    if now_s - busy_since < self._link.timeout_s:
                        await asyncio.sleep(_BUSY_PAUSE_S)
                        continue
                    if taken_over is not None:
                        self._queue_release(tenant, lease_id, 0)  # its old lease is still there
                    return await self._acquire_local(tenant, plan, give_up, by_deadline, outage=False)
                # the script may have run: admitted (the rate token refunded only if so), queued
                code = (_LEAVE_QUEUE if flags & _MAY_QUEUE else 0) | (
                    _REFUND if plan.rated and taken_over is None else 0)
                self._queue_release(tenant, lease_id, code)
                if isinstance(exc, SharedStateUnavailable):
                    return await self._acquire_local(tenant, plan, give_up, by_deadline, outage=False)
                raise
            self._acked(tenant, ops, adopted)
            if reply == b"ok 0" or reply == "ok 0":  # admitted, to start now: the common case
                admitted = self._admitted(tenant, plan, lease_id, loop)
                if admitted is not None:
                    return admitted
                verdict, number = "over", "0"
            else:
                verdict, number = (reply.decode() if isinstance(reply, bytes) else str(reply)).split()
            taken_over = None  # the script gave its slot back, or this request holds it now
            if verdict == "ok":
                admitted = self._admitted(tenant, plan, lease_id, loop)
                if admitted is not None:
                    await self._start_after(admitted, float(number), loop)
                    return admitted
                verdict = "over"
            if verdict == "over":
                # Redis admitted without the requests the fallback admitted on this replica (after a
                # timed-out command, or across the switch to it): that slot is not free here
                self._queue_release(tenant, lease_id, _REFUND if plan.rated else 0)
                if self._link.degraded:
                    return await self._acquire_local(tenant, plan, give_up, by_deadline, outage=True)
                lease_id = f"{self.holder_id}:{next(self._ids)}"
                if give_up - loop.time() <= 0:
                    raise self._reject(tenant, self._slot_eta(tenant, plan.maxc),
                                       "deadline" if by_deadline else "concurrency")
                await self._wait_turn(tenant, min(self._max_poll_s, give_up - loop.time()))
                continue
            if verdict == "rate":
                raise self._reject(tenant, float(number), "deadline" if by_deadline else "rate")
            if verdict != "queued":
                raise self._reject(tenant, self._slot_eta(tenant, plan.maxc),
                                   "deadline" if by_deadline else "concurrency")
            pause = min(self._max_poll_s, 0.002 * (1 + int(number))) * (0.5 + self._rng.random())
            try:
                await self._wait_turn(tenant, max(0.0, min(pause, give_up - loop.time())))
            except BaseException:
                self._queue_release(tenant, lease_id, _LEAVE_QUEUE)  # leave the queue
                raise
            if self._link.degraded:  # Redis went away while this request waited its turn
                self._queue_release(tenant, lease_id, _LEAVE_QUEUE)
                return await self._acquire_local(tenant, plan, give_up, by_deadline, outage=True)

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
        held = monotonic() - lease.started
        old = self._hold_ewma_s.get(lease.tenant)
        if old is None and len(self._hold_ewma_s) >= 10_000:
            self._hold_ewma_s.clear()
        self._hold_ewma_s[lease.tenant] = held if not old else 0.8 * old + 0.2 * held
        self._give_back(lease, refund=False)

    # -- internals: leases ------------------------------------------------------------------

    def _plan(self, tenant: str, quota: TenantQuota) -> _Plan:
        validate_tenant_id(tenant)  # once per tenant: its plan is kept
        if len(self._plans) >= 10_000:
            self._plans.clear()  # a flood of tenant ids cannot grow this without bound
        pool = None if self._pool_for is None else self._pool_for(tenant)
        plan = self._plans[tenant] = _Plan(tenant, quota, pool, self._prefix, self.lease_s, self._queue_ttl_s,
                                           self._queue_ttl_s)
        plan.script = self._scripts.get(len(plan.keys), self._scripts[3])
        return plan

    def _plan_of(self, tenant: str) -> _Plan:
        quota = self._quota_for(tenant)
        plan = self._plans.get(tenant)
        return plan if plan is not None and plan.quota is quota else self._plan(tenant, quota)

    def _admitted(self, tenant: str, plan: _Plan, lease_id: str,
                  loop: asyncio.AbstractEventLoop) -> SharedLease | None:
        """The lease of a request Redis admitted; None when this replica may not run it: the
        fallback counts what the replica runs (Redis is away, or the fallback admitted some of the
        tenant's requests Redis may not have counted) and has no free slot."""
        lease = SharedLease(tenant, lease_id, monotonic(), shared=True, counted=plan.counted,
                            rated=plan.rated)
        if plan.counted:
            fallback = self.fallback
            counting = fallback.in_flight(tenant) or (plan.pooled and fallback.pool_in_flight())
            if self._link.degraded or counting:
                local = fallback.take_slot(tenant, free=True)
                if local is WAIT:
                    return None
                lease.local = local
            running = self._running.get(tenant)
            if running is None:
                running = self._running[tenant] = {}
            running[lease_id] = lease
            if self._renewer is None or self._renewer.done():
                self._renewer = loop.create_task(self._renew_forever(), name="ragguard-quota-leases")
        return lease

    async def _start_after(self, lease: SharedLease, delay: float, loop: asyncio.AbstractEventLoop) -> None:
        """Sleep off a rate reservation; a cancelled wait gives the lease and its token back."""
        try:
            await asyncio.sleep(delay)
        except BaseException:
            self._give_back(lease, refund=True)
            raise
        lease.started = monotonic()

    async def _acquire_local(self, tenant: str, plan: _Plan, give_up: float, by_deadline: bool, *,
                             outage: bool) -> Lease | None:
        if not outage:
            self._count_in_fallback()  # (done at the switch during an outage)
        local = self.fallback.admit_now(tenant)
        waited = local is WAIT
        if waited:
            local = await self.fallback.acquire(tenant)
        if local is None:
            return None
        if outage and waited and not self._link.degraded:
            # Redis came back while this request waited here: Redis decides it now, so that no
            # request admitted after the restore is missing from Redis
            self.fallback.release(local)
            loop = asyncio.get_running_loop()
            return await self._acquire_shared(tenant, plan, give_up, by_deadline, loop)
        return self._local_lease(tenant, plan, local)

    def _local_lease(self, tenant: str, plan: _Plan, local: Lease) -> SharedLease:
        lease = SharedLease(tenant, f"{self.holder_id}:{next(self._ids)}", monotonic(), shared=False,
                            counted=plan.counted, rated=False, local=local)
        if plan.counted:
            self._running.setdefault(tenant, {})[lease.lease_id] = lease
            self._unadopted.setdefault(tenant, {})[lease.lease_id] = lease  # Redis must learn it
            if not self._link.degraded:
                self._arm_flush(0.0)  # within a round trip, not at the tenant's next admission
        return lease

    def _give_back(self, lease: SharedLease, *, refund: bool) -> None:
        lease._released = True
        tenant, lease_id = lease.tenant, lease.lease_id
        for table in (self._running, self._unadopted):
            leases = table.get(tenant)
            if leases is not None and leases.pop(lease_id, None) is not None and not leases:
                del table[tenant]
        local, lease.local = lease.local, None
        if local is not None:
            if lease.shared:
                self.fallback.give_slot(local)
            else:
                self.fallback.release(local)
        code = _REFUND if refund and lease.rated else 0
        if lease.in_redis or code:
            self._queue_release(tenant, lease_id, code)
        freed = self._freed.pop(tenant, None)
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

    _reject = staticmethod(refusal)

    # -- internals: what a replica owes Redis ---------------------------------------------------

    def _carry(self, tenant: str, renew: bool = False) -> tuple[list[str], list[SharedLease] | None, str]:
        """What the next command for ``tenant`` carries: the releases of the outbox, then the leases
        to put (back) in Redis: those it may not count, or with ``renew`` every counted lease the
        replica runs. Returns the releases' ids, the leases put, and the script's operations."""
        ops, text = self._outbox.carry(tenant, monotonic())
        pending = (self._running if renew else self._unadopted).get(tenant)
        if not pending:
            return ops, None, text
        adopted = [lease for lease in pending.values() if lease.counted]
        for lease in adopted:
            lease.in_redis = True  # from now on its release must be sent: Redis may count it
        return ops, adopted, text + "".join(f" {lease.lease_id} +" for lease in adopted)

    def _acked(self, tenant: str, ops: list[str], adopted: list[SharedLease] | None) -> None:
        self._outbox.acked(tenant, ops)
        if adopted:
            pending = self._unadopted.get(tenant)
            if pending is not None:
                for lease in adopted:
                    pending.pop(lease.lease_id, None)
                if not pending:
                    del self._unadopted[tenant]

    def _unsent(self, tenant: str, ops: list[str], adopted: list[SharedLease] | None, plan: _Plan,
                flags: int) -> None:
        self._outbox.unsent(tenant, ops)
        if adopted:
            pending = self._unadopted.setdefault(tenant, {})
            for lease in adopted:
                if not lease._released:
                    pending[lease.lease_id] = lease  # still owed (the command may have run)
        if flags & _REFRESH:
            plan.fresh_until = -math.inf  # the TTL may not have been refreshed: next time

    def _queue_release(self, tenant: str, lease_id: str, code: int) -> None:
        self._outbox.add(tenant, lease_id, code, monotonic())
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
        """Timer: send the releases no admission carried within ``release_delay_s``, and the leases
        Redis may not count."""
        self._flush_timer = None
        if self._closed or self._link.degraded or not (len(self._outbox) or self._unadopted):
            return  # after an outage, the restore sends them
        delay = self._release_delay_s
        wait = 0.0 if self._unadopted else self._outbox.oldest() + delay - monotonic()
        if wait > 0 or (self._flusher is not None and not self._flusher.done()):
            self._arm_flush(max(wait, 0.001) if wait < math.inf else delay)
            return
        self._flusher = asyncio.get_running_loop().create_task(self._flush_once(),
                                                               name="ragguard-quota-releases")

    async def _flush_once(self) -> None:
        ok = await self._flush_all(before=monotonic() - self._release_delay_s)
        if len(self._outbox) or self._unadopted:
            self._arm_flush(self._release_delay_s if ok else max(self._release_delay_s, 0.05))

    async def _flush_all(self, before: float = math.inf) -> bool:
        """Send what the replica owes Redis; True once Redis acknowledged it all. ``before``: only
        releases queued before then that no command carries (the background's turn); without it,
        every release, those another command is carrying too (resent: Redis applies releases
        idempotently), so that on return Redis has applied each one, whatever is still in flight."""
        queued = self._outbox.tenants() if before == math.inf else self._outbox.due(before)
        due = set(queued) | set(self._unadopted)
        results = await asyncio.gather(*(self._sync_tenant(t) for t in due))
        return all(results)

    async def _sync_tenant(self, tenant: str, *, renew: bool = False, restoring: bool = False) -> bool:
        """Send what the replica owes Redis for ``tenant`` (ops only); False when Redis did not
        answer. ``renew``: every lease it runs is put back with a fresh expiry."""
        plan = self._plan_of(tenant)
        ops, adopted, carried = self._carry(tenant, renew)
        if not ops and not adopted:
            return True
        now = "-" if self.clock is None else repr(float(self.clock()))
        flags = _OPS_ONLY | (_REFRESH if adopted else 0)
        call = self._link.call_restoring if restoring else self._link.call
        try:
            await call(cast(Script, plan.script), *plan.keys, plan.script_plan, f"{now} - 0 {flags}{carried}")
        except BaseException as exc:
            self._unsent(tenant, ops, adopted, plan, 0)
            if isinstance(exc, SharedStateUnavailable):
                return False
            raise
        self._acked(tenant, ops, adopted)
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
            for tenant in list(self._running):  # each tenant's leases read when its command is sent
                if not self._link.degraded:
                    await self._sync_tenant(tenant, renew=True)

    def _recount(self) -> None:
        """A connection was found broken (Redis may have restarted, losing every lease): every
        counted lease this replica runs is owed again, carried by the next commands."""
        for tenant, running in self._running.items():
            pending = self._unadopted.setdefault(tenant, {})
            for lease_id, lease in running.items():
                if lease.counted:
                    pending[lease_id] = lease
        if self._unadopted and not self._link.degraded:
            self._arm_flush(0.0)

    async def _put_back(self) -> None:
        """The restore step (Redis answers the probe again; the link is still degraded): put every
        lease this replica runs into Redis (renewals stopped while it was away, Redis may have lost
        them, and the fallback admitted some), with the releases made meanwhile, before the replica
        admits through Redis again. Raises SharedStateUnavailable when Redis does not take them
        all; the probe then tries again."""
        self._recount()
        for _ in range(3):  # leases the fallback grants meanwhile go in the next round
            tenants = [t for t, pending in self._unadopted.items() if pending]
            if not tenants:
                return
            done = await asyncio.gather(*(self._sync_tenant(t, restoring=True) for t in tenants))
            if not all(done):
                raise SharedStateUnavailable("quotas: the leases could not be put back")
        # still granting locally after three rounds: those go with the next commands (_on_restored)

    def _count_in_fallback(self) -> None:
        """Redis is gone: the fallback counts every request Redis admitted that still runs (each
        takes a slot there), so that this replica never runs more than the limit across the switch."""
        for tenant, running in self._running.items():
            for lease in running.values():
                if lease.shared and lease.local is None:
                    lease.local = self.fallback.take_slot(tenant)

    def _on_restored(self) -> None:
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        if self._running and (self._renewer is None or self._renewer.done()):
            self._renewer = loop.create_task(self._renew_forever(), name="ragguard-quota-leases")
        self._arm_flush(0.0)
