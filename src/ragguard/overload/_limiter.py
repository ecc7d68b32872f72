"""One stage's adaptive concurrency limiter: the limit, the calls in flight, and a priority queue.

A call is admitted at once while the calls in flight are below the limit and nobody queues (the
synchronous fast path: a counter and a dict update). Otherwise it queues, for at most
``max_wait_s`` (cut to what its deadline leaves), and a slot that frees goes to the waiter of the
highest priority, then of the lightest tenant, then the oldest.

The queue is bounded and rejects gradually, after failsafe-go's adaptive limiter: it holds at most
``max_queue`` x limit waiters, and from ``early_queue`` x limit waiters on, each arrival sheds one
call with a probability rising linearly to 1 at the bound (drawn from the Guard's seeded rng). The
call shed is the worst of the queue and the arrival: the lowest priority, then the heaviest tenant
(the most calls asked for lately at this stage, admitted, queued or shed, plus its calls in flight,
per unit of the tenant's ``weight``: :meth:`AdaptiveLimiter.usage`), then the newest. Calls shed
count: a saturated limit admits each tenant about as often as the others, so by its admissions a
heavy tenant whose calls are being shed would look as light as the tenants it crowds out. A shed
call raises :class:`~ragguard.Overloaded`. While a baseline probe pins the limit low, the queue
keeps the size of the limit the probe will give back (a probe measures the dependency; it does not
shrink the room to wait).

Every wait is on the Guard's clock: a queued call's wait is bounded by the clock's own timers (a
:class:`~ragguard.FakeClock`'s) or the loop's timer wheel, as attempt timeouts are.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from .._clock import Clock, Timers
from .._compat import current_task, running_loop
from .._errors import Overloaded
from .._timeouts import wheel_for
from ..events import EventBus, bus
from ._events import LimitChanged, LoadShed
from ._gradient import GradientLimit, LimitSettings, admits
from ._priority import PRIORITIES, RANK

__all__ = ["AdaptiveLimiter", "Permit", "QueueSettings"]


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """The queue's options (see :class:`ragguard.AdaptivePolicy`)."""

    max_queue: float = 2.0
    early_queue: float = 1.0
    max_wait_s: float = 1.0
    usage_window_s: float = 1.0
    max_tenants: int = 10_000


class Permit:
    """One admitted call: give it back with :meth:`AdaptiveLimiter.release` (exactly once)."""

    __slots__ = ("in_flight", "started", "tenant")

    def __init__(self, tenant: str, started: float, in_flight: int) -> None:
        self.tenant = tenant
        self.started = started
        self.in_flight = in_flight


class _Usage:
    __slots__ = ("at", "in_flight", "recent", "waiting")

    def __init__(self, now: float) -> None:
        self.in_flight = 0
        self.waiting = 0
        self.recent = 0.0  # calls asked for (admitted or not), decayed with time constant usage_window_s
        self.at = now


class _Waiter:
    __slots__ = ("event", "out_of_time", "outcome", "priority", "rank", "seq", "tenant")

    def __init__(self, tenant: str, priority: str, seq: int, out_of_time: str = "queue") -> None:
        self.out_of_time = out_of_time  # the reason given when its wait runs out
        self.tenant = tenant
        self.priority = priority
        self.rank = RANK[priority]
        self.seq = seq
        self.event = anyio.Event()
        self.outcome: Permit | Overloaded | None = None


class AdaptiveLimiter:
    """The adaptive limit of stage ``stage`` (see the module docstring).

    ``clock``: the Guard's (monotonic seconds); ``rng``: its seeded random source (probe jitter,
    gradual rejection); ``timers``: the clock's own timers when it has them (None: the loop's
    wheel); ``weight_of(tenant)``: the tenant's weight (> 0). Counters: ``admitted``,
    ``shed`` (by priority name) and ``shed_reasons`` (by reason).
    """

    def __init__(
        self,
        stage: str,
        limit: LimitSettings,
        queue: QueueSettings,
        *,
        clock: Clock,
        rng: random.Random,
        timers: Timers | None = None,
        weight_of: Callable[[str], float] | None = None,
        event_bus: EventBus = bus,
    ) -> None:
        self.stage = stage
        self._bus = event_bus
        self.clock = clock
        self.rng = rng
        self.queue = queue
        self._timers = timers
        self._weight_of = weight_of
        self.gradient = GradientLimit(limit, now=clock(), rng=rng)
        self.cap = admits(self.gradient.limit)
        self.in_flight = 0
        self.waiters: list[_Waiter] = []
        self._usage: dict[str, _Usage] = {}
        self._seq = itertools.count()
        self.admitted = 0
        self.shed: dict[str, int] = dict.fromkeys(PRIORITIES, 0)
        self.shed_reasons: dict[str, int] = {}
        self.pressed: dict[str, int] = {}

    # -- admission ---------------------------------------------------------------------------------

    def try_acquire(self, tenant: str) -> Permit | None:
        """Admit a call of ``tenant`` at once, or None when it must queue (:meth:`acquire`)."""
        if self.in_flight >= self.cap or self.waiters:
            return None
        now = self.clock()
        self._asked(tenant, now)
        return self._admit(tenant, now)

    def _asked(self, tenant: str, now: float) -> None:
        """Count a call of ``tenant`` asking for a slot (once, admitted or not) in its usage."""
        usage = self._usage.get(tenant)
        if usage is None:
            usage = self._new_usage(tenant, now)
        if now > usage.at:
            usage.recent *= math.exp((usage.at - now) / self.queue.usage_window_s)
            usage.at = now
        usage.recent += 1.0

    def _admit(self, tenant: str, now: float) -> Permit:
        self.in_flight += 1
        self.admitted += 1
        usage = self._usage.get(tenant)
        if usage is None:
            usage = self._new_usage(tenant, now)
        usage.in_flight += 1
        return Permit(tenant, now, self.in_flight)

    async def acquire(self, tenant: str, priority: str, wait_s: float, by_deadline: bool = False) -> Permit:
        """Queue a call of ``tenant`` at ``priority`` for at most ``wait_s`` seconds; ``by_deadline``:
        the caller cut ``wait_s`` to what the request's deadline leaves. Raises
        :class:`~ragguard.Overloaded` when shed or out of time (reason ``deadline`` when the deadline
        set the wait, see :class:`~ragguard.Overloaded`)."""
        now = self.clock()
        self._asked(tenant, now)
        if self.in_flight < self.cap and not self.waiters:
            return self._admit(tenant, now)
        if wait_s <= 0.0:  # no time to queue at all
            raise self._reject(tenant, priority, "deadline" if by_deadline else "limit")
        waiter = _Waiter(tenant, priority, next(self._seq), "deadline" if by_deadline else "queue")
        self._enqueue(waiter)  # raises Overloaded when the arrival itself is shed
        loop = running_loop()
        if loop is None:  # trio: the loop's own clock bounds the wait
            try:
                with anyio.move_on_after(wait_s):
                    await waiter.event.wait()
            except BaseException:
                self._abandon(waiter)
                raise
            return self._outcome(waiter)
        task = current_task(loop)
        timers = self._timers if self._timers is not None else wheel_for(loop)
        handle: int | None = timers.arm(task, wait_s)
        try:
            await waiter.event.wait()
        except asyncio.CancelledError:
            assert handle is not None
            fired = timers.disarm(handle)
            handle = None
            outside = fired and task.uncancel() > 0
            if fired and not outside:
                return self._outcome(waiter)  # our timer: the wait is over, granted or not
            self._abandon(waiter)
            raise
        finally:
            if handle is not None:
                timers.disarm(handle)
        return self._outcome(waiter)

    def _outcome(self, waiter: _Waiter) -> Permit:
        outcome = waiter.outcome
        if isinstance(outcome, Permit):
            return outcome
        if outcome is None:  # out of time in the queue
            self._remove(waiter)
            outcome = self._reject(waiter.tenant, waiter.priority, waiter.out_of_time)
        raise outcome

    def _abandon(self, waiter: _Waiter) -> None:
        """A cancelled waiter: leave the queue, or give back the slot it was just granted."""
        outcome = waiter.outcome
        if isinstance(outcome, Permit):
            self.release(outcome, None)
        elif outcome is None:
            self._remove(waiter)

    def _enqueue(self, waiter: _Waiter) -> None:
        q = self.queue
        waiting = len(self.waiters)
        g = self.gradient
        size = admits(g.saved_limit) if g.probing else self.cap  # a probe pins the limit, not the queue
        bound = math.ceil(q.max_queue * size)
        early = q.early_queue * size
        shed = waiting >= bound
        if not shed and waiting >= early and bound > early:
            shed = self.rng.random() < (waiting - early + 1) / (bound - early + 1)
        if shed:
            victim = self._worst(waiter)
            if victim is waiter:
                raise self._reject(waiter.tenant, waiter.priority, "limit")
            self._remove(victim)
            victim.outcome = self._reject(victim.tenant, victim.priority, "queue")
            victim.event.set()
        self.waiters.append(waiter)
        usage = self._usage.get(waiter.tenant)
        if usage is None:
            usage = self._new_usage(waiter.tenant, self.clock())
        usage.waiting += 1

    def _remove(self, waiter: _Waiter) -> None:
        try:
            self.waiters.remove(waiter)
        except ValueError:
            return
        usage = self._usage.get(waiter.tenant)
        if usage is not None:
            usage.waiting -= 1

    # -- release and hand-off ----------------------------------------------------------------------

    def release(self, permit: Permit, rtt_s: float | None, *, cut: bool = False) -> None:
        """Give back ``permit``; ``rtt_s`` (seconds) is the call's latency sample, None for none
        (a cancellation, a fast failure that says nothing about latency); ``cut``: the call ran out
        of time after ``rtt_s`` seconds (a censored sample, see :mod:`ragguard.overload._gradient`)."""
        self.in_flight -= 1
        usage = self._usage.get(permit.tenant)
        if usage is not None:
            usage.in_flight -= 1
        if rtt_s is not None and self.gradient.sample(
            self.clock(), rtt_s, permit.in_flight, admitted_at=permit.started, cut=cut
        ):
            self._limit_changed()
        if self.waiters and self.in_flight < self.cap:
            self._grant()

    def press(self, reason: str) -> None:
        """Outside pressure named ``reason`` (``loop_lag``, ``pool_wait``, ``out_of_memory``):
        the limit backs off (at most once per window)."""
        self.pressed[reason] = self.pressed.get(reason, 0) + 1
        if self.gradient.press(self.clock()):
            self._limit_changed()

    def _limit_changed(self) -> None:
        old = self.cap
        self.cap = admits(self.gradient.limit)
        if (events := self._bus).active and self.cap != old:
            g, now = self.gradient, self.clock()
            events.emit(LimitChanged(self.stage, old, self.cap, g.min_rtt, g.last_rtt, g.probing, now))
        if self.waiters and self.in_flight < self.cap:
            self._grant()

    def _grant(self) -> None:
        now = self.clock()
        while self.waiters and self.in_flight < self.cap:
            best = self._best()
            self._remove(best)
            best.outcome = self._admit(best.tenant, now)
            best.event.set()

    # -- choosing ----------------------------------------------------------------------------------

    def usage(self, tenant: str) -> float:
        """How heavily ``tenant`` uses this stage now: the calls it asked for (admitted, queued or
        shed) in the last ``usage_window_s`` or so (decayed) plus its calls in flight (a call
        holding a slot weighs more than one that left), per unit of its weight. A queued call
        counts once, as asked for: counted again as queued, a light tenant's burst would weigh
        as much as a heavy tenant's steady flood."""
        u = self._usage.get(tenant)
        if u is None:
            return 0.0
        now = self.clock()
        recent = u.recent * math.exp((u.at - now) / self.queue.usage_window_s) if now > u.at else u.recent
        weight = self._weight_of(tenant) if self._weight_of is not None else 1.0
        return (u.in_flight + recent) / weight

    def _key(self, w: _Waiter, usage: dict[str, float]) -> tuple[int, float, int]:
        """How much ``w`` deserves a slot: priority, then the lighter tenant, then the older call
        (``usage``: each tenant's, computed once per choice)."""
        u = usage.get(w.tenant)
        if u is None:
            u = usage[w.tenant] = self.usage(w.tenant)
        return (w.rank, -u, -w.seq)

    def _best(self) -> _Waiter:
        usage: dict[str, float] = {}
        return max(self.waiters, key=lambda w: self._key(w, usage))

    def _worst(self, arrival: _Waiter) -> _Waiter:
        usage: dict[str, float] = {}
        return min([arrival, *self.waiters], key=lambda w: self._key(w, usage))

    def _reject(self, tenant: str, priority: str, reason: str) -> Overloaded:
        self.shed[priority] = self.shed.get(priority, 0) + 1
        self.shed_reasons[reason] = self.shed_reasons.get(reason, 0) + 1
        if self._bus.active:
            self._bus.emit(LoadShed(self.stage, tenant, priority, reason, self.clock()))
        return Overloaded(self.stage, self.retry_after_s(), reason, priority=priority, tenant=tenant)

    def retry_after_s(self) -> float:
        """About when a shed call could be admitted: the queue ahead drained at the current
        latency (seconds, at least 1 ms)."""
        g = self.gradient
        rtt = g.last_rtt or g.min_rtt or 0.01
        return max(0.001, rtt * (1 + len(self.waiters)) / self.cap)

    def _new_usage(self, tenant: str, now: float) -> _Usage:
        if len(self._usage) >= self.queue.max_tenants:
            for key in [k for k, u in self._usage.items() if not u.in_flight and not u.waiting]:
                del self._usage[key]
                if len(self._usage) < self.queue.max_tenants * 0.9:
                    break
        usage = self._usage[tenant] = _Usage(now)
        return usage

    # -- inspection --------------------------------------------------------------------------------

    @property
    def limit(self) -> int:
        """The current limit (calls in flight at once)."""
        return self.cap

    def status(self) -> dict[str, Any]:
        """A JSON-ready snapshot: limit, in flight, queued, baseline and last latency (seconds),
        probing, calls admitted, shed by priority and by reason, pressure by signal."""
        g = self.gradient
        return {
            "limit": self.cap,
            "in_flight": self.in_flight,
            "queued": len(self.waiters),
            "min_rtt_s": g.min_rtt,
            "rtt_s": g.last_rtt,
            "probing": g.probing,
            "admitted": self.admitted,
            "shed": dict(self.shed),
            "shed_reasons": dict(self.shed_reasons),
            "pressed": dict(self.pressed),
        }
