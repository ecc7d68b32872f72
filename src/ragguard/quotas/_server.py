"""A front door's server-wide bulkhead: the calls a server serves at once, shared fairly by tenants.

A gRPC server's ``maximum_concurrent_rpcs`` (or an HTTP server's ``--limit-concurrency``) counts
every call from its arrival until its task ends, and refuses the excess before any interceptor
knows its tenant: a call that waits in its tenant's quota queue holds one of those slots as surely
as a call that runs. A greedy tenant whose requests queue in its quota can so fill the server,
which then refuses well-behaved tenants' calls, blindly.

:class:`ServerBulkhead` makes the door the server's limit, tenant-aware. It counts the calls the
door holds against ``capacity``: each from the moment the door knows its tenant until the task
serving it ends (as the server counts it), waiting in its tenant's quota or running. A call
refused (by the door or by its tenant's quota), shed or cancelled gives its seat back at once: a
refusal does no work, and a tenant that sends again the moment it is refused would otherwise
fill the door with its refusals in flight. Once the calls held reach
``capacity - headroom``, an arrival is judged by how many calls each tenant holds per unit of its
``weight`` (its load), counting the arrival:

1. a tenant heavier than the arrival's tenant has a call still waiting in its quota: that call is
   shed (its wait ends with :class:`~ragguard.QuotaExceeded`, reason ``server``; a call that
   waits has done no work yet) and the arrival takes its place;
2. else, an arrival lighter than some tenant (whose calls all run) may use the headroom, up to
   ``capacity``;
3. else the arrival is refused (QuotaExceeded, reason ``server``): its tenant holds the most.

This is the longest-queue-drop rule of shared-buffer switches (when the shared buffer is full, the
flow holding the most gives way), applied to a server's slots: a tenant may use the whole server
while others leave it idle (the bulkhead acts only when it is full), and when it is full, the
tenant holding the most gives way first. A running call is never cut.

The server's own limit, if it has one, still counts a refused call while its status is sent, and
refuses whoever arrives next, blind to the tenant: under a tenant that sends again the moment it
is refused, those refusals in flight are as many as its callers. Leave the server's own limit
unset when the door bounds it (docs/grpc.md measures it).

Every operation is O(tenants holding calls) at most (no more than the calls held): the map holds
only tenants with calls held, so a flood of tenant ids cannot grow it.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio

from .. import _validate as v
from .._clock import Clock, monotonic
from .._compat import current_task, running_loop
from .._errors import ConfigError, QuotaExceeded
from ._refusal import refusal

if TYPE_CHECKING:
    from ._tenant import TenantContext

__all__ = ["ServerBulkhead", "server_bulkhead"]

_UNKNOWN_HOLD_S = 0.01  # the hold time assumed before any call has left
REASON = "server"


class _Holder:
    """One tenant's calls held by the door: all of them, and those still waiting in its quota
    (oldest first)."""

    __slots__ = ("held", "waiting", "weight")

    def __init__(self, weight: float) -> None:
        self.held = 0
        self.weight = weight
        self.waiting: list[_Seat] = []


class ServerBulkhead:
    """Bound the calls a server door holds at once to ``capacity``, shedding the heaviest tenant.

    ``capacity``: the calls the server serves at once, >= 1 (keep the server's own limit, e.g.
    grpc.aio's ``maximum_concurrent_rpcs``, unset: it refuses blind). ``headroom``: of those,
    kept for tenants lighter than the heaviest (default 0), 0 <= headroom < capacity. ``clock``:
    monotonic seconds, for the hold times behind ``retry_after_s``. Raises
    :class:`~ragguard.ConfigError` naming the field.

    ``seat(request)`` wraps a request's :class:`~ragguard.quotas.TenantContext` (``async with``):
    entering counts the call (or raises QuotaExceeded, reason ``server``), then admits it to its
    tenant's quota; a call shed while it waits there raises QuotaExceeded too; leaving, however it
    leaves (cancelled included), gives back the quota's slot and the seat.
    """

    __slots__ = (
        "_ending",
        "_hold_ewma_s",
        "_holders",
        "capacity",
        "clock",
        "headroom",
        "held",
        "mark",
        "refused",
        "shed",
    )

    def __init__(self, capacity: int, *, headroom: int = 0, clock: Clock = monotonic) -> None:
        self.capacity = v.count("capacity", capacity, 1, 1_000_000)
        self.headroom = v.count("headroom", headroom, 0, capacity - 1, hint="below capacity")
        self.mark = capacity - self.headroom
        self.clock = clock
        self.held = 0
        self.refused = 0  # arrivals refused
        self.shed = 0  # waiting calls shed for a lighter tenant's arrival
        self._holders: dict[str, _Holder] = {}
        self._ending: dict[Any, _Seat] = {}  # task -> the seat it left, given back when it ends
        self._hold_ewma_s = 0.0

    def seat(self, request: TenantContext) -> _Seat:
        """The request's seat: ``async with bulkhead.seat(request):`` instead of ``async with
        request:``."""
        return _Seat(self, request)

    def holding(self, tenant: str) -> int:
        """Calls of ``tenant`` the door holds now (waiting in its quota or running)."""
        h = self._holders.get(tenant)
        return 0 if h is None else h.held

    def waiting(self, tenant: str) -> int:
        """Calls of ``tenant`` the door holds that still wait in the tenant's quota."""
        h = self._holders.get(tenant)
        return 0 if h is None else len(h.waiting)

    def retry_after_s(self) -> float:
        """Seconds after which a refused call could find a seat: the usual time a call holds one
        (a moving average of those that left; 10 ms before any), at least 1 ms."""
        return max(0.001, self._hold_ewma_s or _UNKNOWN_HOLD_S)

    # -- the seat's steps ---------------------------------------------------------------------

    def _take(self, seat: _Seat, weight: float) -> None:
        """Count ``seat`` in, shedding a heavier tenant's waiting call when full; or refuse it
        (not counted: a refusal does no work)."""
        self._moved_on()
        tenant = seat.tenant
        holder = self._holders.get(tenant)
        refuse = False
        if self.held >= self.mark:
            mine = 1 / weight if holder is None else (1 + holder.held) / holder.weight
            victim: _Holder | None = None
            heaviest = mine
            heavier = False
            for name, other in self._holders.items():
                if name == tenant:
                    continue
                load = other.held / other.weight
                if load > mine:
                    heavier = True
                    if other.waiting and load > heaviest:
                        victim, heaviest = other, load
            if victim is not None:
                self._shed(victim.waiting[-1])  # the newest: it has waited least
            elif not heavier or self.held >= self.capacity:
                refuse = True
        if refuse:
            self.refused += 1
            raise self._refusal(tenant)
        if holder is None:
            holder = self._holders[tenant] = _Holder(weight)
        holder.held += 1
        self.held += 1
        seat.holder = holder
        holder.waiting.append(seat)
        seat.waits = True

    def _shed(self, seat: _Seat) -> None:
        self.shed += 1
        seat.shed = True
        self._stop_waiting(seat)
        if seat.victim is not None:
            seat.victim.cancel("shed by the server bulkhead")
        elif seat.scope is not None:
            seat.scope.cancel()

    def _stop_waiting(self, seat: _Seat) -> None:
        """``seat``'s call waits no more in its quota (admitted, shed, refused or cancelled): it
        may no longer be shed."""
        if seat.waits:
            seat.waits = False
            holder = seat.holder
            if holder is not None:
                holder.waiting.remove(seat)

    def _leave_later(self, seat: _Seat) -> None:
        """Give back ``seat`` when its call ends: when the task serving it is done (grpc.aio and
        uvicorn count a call until then), or when that task enters another seat (it serves
        requests one after the other, e.g. in-process test clients), else now."""
        self._stop_waiting(seat)
        loop = running_loop()
        task = None if loop is None else current_task(loop)
        if task is None or task.done():
            self._leave(seat)
            return
        earlier = self._ending.get(task)
        if earlier is not None:
            self._leave(earlier)
        self._ending[task] = seat
        seat.task = task
        task.add_done_callback(seat.leave)

    def _moved_on(self) -> None:
        """The running task enters a new seat: the seat it left is given back now."""
        if self._ending:
            loop = running_loop()
            task = None if loop is None else current_task(loop)
            earlier = self._ending.get(task)
            if earlier is not None:
                self._leave(earlier)

    def _leave(self, seat: _Seat) -> None:
        holder = seat.holder
        if holder is None:
            return  # left already (or never counted)
        seat.holder = None
        self._stop_waiting(seat)
        task = seat.task
        if task is not None:
            seat.task = None
            if self._ending.get(task) is seat:
                del self._ending[task]
            if not task.done():
                task.remove_done_callback(seat.leave)
        self.held -= 1
        holder.held -= 1
        if seat.started is not None:
            held = self.clock() - seat.started
            self._hold_ewma_s = held if self._hold_ewma_s == 0.0 else 0.8 * self._hold_ewma_s + 0.2 * held
        if holder.held == 0:
            del self._holders[seat.tenant]

    def _refusal(self, tenant: str) -> QuotaExceeded:
        return refusal(tenant, self.retry_after_s(), REASON)


def server_bulkhead(
    field: str, capacity: int | None, headroom: int | None, clock: Clock = monotonic
) -> ServerBulkhead | None:
    """A front door's bulkhead of ``capacity`` calls (None: none), its option named ``field``;
    :class:`~ragguard.ConfigError` naming ``field`` or ``headroom`` for a bad value."""
    if capacity is None:
        if headroom is not None:
            raise ConfigError(f"headroom needs {field} (the server's capacity)", field="headroom")
        return None
    v.count(field, capacity, 1, 1_000_000)
    return ServerBulkhead(capacity, headroom=0 if headroom is None else headroom, clock=clock)


class _Seat:
    """One call's seat at the door (``async with``): counted, then admitted by its tenant's quota,
    where the bulkhead may cancel its wait to shed it."""

    __slots__ = ("bulkhead", "holder", "request", "scope", "shed", "started", "task", "tenant", "victim",
                 "waits")

    def __init__(self, bulkhead: ServerBulkhead, request: TenantContext) -> None:
        self.bulkhead = bulkhead
        self.request = request
        self.tenant = request.tenant
        self.holder: _Holder | None = None
        self.scope: anyio.CancelScope | None = None
        self.started: float | None = None
        self.shed = False
        self.waits = False
        self.task: Any = None  # the task whose end gives the seat back
        self.victim: asyncio.Task[Any] | None = None  # the task to cancel to shed it (asyncio)

    def leave(self, _task: object = None) -> None:
        self.bulkhead._leave(self)

    async def __aenter__(self) -> TenantContext:
        bulkhead = self.bulkhead
        loop = running_loop()
        task = None if loop is None else current_task(loop)
        try:
            bulkhead._take(self, self.request._quota.weight)
            if task is not None:
                await self._admit_asyncio(task)
            else:
                await self._admit_anyio()
        except BaseException:  # refused, shed or cancelled: its task sends no answer of ours
            bulkhead._leave(self)
            raise
        bulkhead._stop_waiting(self)
        self.started = bulkhead.clock()
        return self.request

    async def _admit_asyncio(self, task: asyncio.Task[Any]) -> None:
        """The quota's admission, which the bulkhead sheds by cancelling ``task`` (no cancel scope:
        a seat costs a few dict operations). The task is suspended in the admission whenever it
        can be shed, so the cancellation lands there, never after it."""
        self.victim = task
        try:
            await self.request.__aenter__()
        except asyncio.CancelledError:
            if self.shed and task.uncancel() == 0:  # ours alone: the call is refused, not cancelled
                raise self.bulkhead._refusal(self.tenant) from None
            raise
        finally:
            self.victim = None
        if self.shed:  # admitted, the cancellation taken in on the way (a backend's bug): undo both
            task.uncancel()
            await self.request.__aexit__(None, None, None)
            raise self.bulkhead._refusal(self.tenant)

    async def _admit_anyio(self) -> None:
        """The quota's admission under trio: shed through a cancel scope."""
        with anyio.CancelScope() as scope:
            self.scope = scope
            await self.request.__aenter__()
        self.scope = None
        if self.shed:
            if not scope.cancelled_caught:  # admitted before the cancellation landed
                await self.request.__aexit__(None, None, None)
            raise self.bulkhead._refusal(self.tenant)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        try:
            return await self.request.__aexit__(exc_type, exc, tb)
        finally:
            self.bulkhead._leave_later(self)
