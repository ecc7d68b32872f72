"""The generation preset's layers: a stream's budgets, and its tenant's tokens.

A stream of a stage with the ``generation`` preset passes two layers of the preset (inside the
fallbacks, outside the retries and the breaker; see :mod:`ragguard.layers`):

- :class:`TokenMeter`, a gate of call scope that is also a stream wrapper. When the stream opens it
  makes the stream's :class:`StreamRecord` and reserves the call's token estimate from the tenant's
  ``token_quota`` (waiting up to ``max_wait_s``, else QuotaExceeded); it hooks the driver's
  hand-over of items (``Head.deliver``) to count each item's tokens and pace it to the tenant's
  ``tokens_per_s`` (an item for which the stage's ``usage`` function returns a number carries the
  provider's own count of the stream's tokens so far, which replaces the count: the difference is
  paced or given back); when the stream ends, however it ends (exhausted, failed, closed early,
  cancelled, or failed before its first item and handed to a fallback), it settles the quota with
  the real count. See :mod:`ragguard.quotas._tokens` for the arithmetic.
- :class:`StreamBudgets`, a gate of item scope: each wait for an item is bounded by the first-item
  budget (before the first item, per attempt) or the idle budget (later items), and by what is left
  of the total (the waits of the whole stream, summed). The timer is the Guard clock's (a
  :class:`~ragguard.FakeClock`'s own, else the event loop's timer wheel; on trio a cancel scope);
  one that fires ends the wait with :class:`~ragguard.StreamTimeout` naming the budget. The
  request's deadline and the stage's own ``timeout_s`` stay the timeout layer's: where one of them
  is as soon, this gate arms nothing and the timeout layer cuts the stream
  (:class:`~ragguard.DeadlineExceeded`, :class:`~ragguard.StageTimeout`).

Before the first item reaches the caller the stream's failure may still be retried or served by a
fallback (whose stream is neither budgeted, counted nor paced: it is not the model's); after it the
error reaches the caller with the count of items it had (the stream driver's commit point).

Both layers find a stream's record on its call (``call.meter``, a field the layer contract declares
for them, set when the stream opens and cleared when it ends): the contract gives a gate the call,
not the other layers' tokens.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from .._args import ArgRef
from .._clock import Clock, Timers
from .._compat import current_task, running_loop
from .._context import current_tenant
from .._deadline import current_expiry
from .._errors import InvalidInput, StreamBudget, StreamTimeout
from .._timeouts import MAX_TIMEOUT_S, wheel_for
from ..events import EventBus, StreamCut, StreamSettled, bus
from ..options import GenerationPolicy
from ..pipeline import WAIT, Call, Scope
from ..quotas._tokens import NOTHING, Reservation, TokenAccount, TokenAccounts
from ._counting import Usage

__all__ = ["StreamBudgets", "StreamRecord", "TokenMeter"]


class StreamRecord:
    """One stream of a generation stage: its tenant and token account, the tokens counted and the
    reservation held, the time spent waiting for items (``spent_s``) and pacing (``paced_s``),
    and the item timer in use (``handle``, ``kind``). Items of one stream come one at a time, so
    the timer fields are never shared."""

    __slots__ = (
        "account",
        "entered",
        "estimate",
        "handle",
        "input_tokens",
        "kind",
        "meter",
        "paced_s",
        "reported",
        "reservation",
        "spent_s",
        "tenant",
        "tokens",
        "wait_s",
    )

    def __init__(self, meter: TokenMeter, tenant: str, account: TokenAccount | None) -> None:
        self.meter = meter
        self.tenant = tenant
        self.account = account
        self.tokens = 0
        self.input_tokens = 0
        self.estimate = 0  # output tokens estimated (when a limit reserves them)
        self.reservation: Reservation = NOTHING
        self.reported: Usage | None = None  # the provider's report, if an item carried one
        self.wait_s = 0.0
        self.paced_s = 0.0
        self.spent_s = 0.0
        self.entered = 0.0
        self.handle: Any = None
        self.kind: StreamBudget = "first_item"

    def deliver(self, item: Any) -> Awaitable[None] | None:
        """Count ``item``'s tokens before it is handed over (the stream driver's ``Head.deliver``):
        None, or the tenant's pacing wait to await first."""
        meter = self.meter
        n = meter.count(item)
        if type(n) is not int or n < 0:
            if isinstance(n, Usage):
                self.report(n)
                return None
            n = _token_count(n)
        if meter.usage is not None:
            reported = meter.usage(item)
            if isinstance(reported, Usage):  # input and output, settled when the stream ends
                self.report(reported)
                output = reported.output_tokens  # when given, the provider's count so far
                n = 0 if output is None else output - self.tokens
            elif reported is not None:  # the provider's count so far replaces ours
                n = _token_count(reported) - self.tokens
        self.tokens += n
        account = self.account
        if account is None or not account.paces:
            return None
        if n < 0:
            meter.accounts.unpace(account, -n)  # counted too many: their pacing is given back
            return None
        wait: Any = meter.accounts.pace(account, n)
        if type(wait) is float:
            return self._paced(account, n, wait) if wait else None
        return self._paced_shared(account, n, wait)  # a shared ledger's round trip

    def report(self, usage: Usage) -> None:
        """Keep the provider's report ``usage`` (over an earlier one, count by count)."""
        earlier = self.reported
        self.reported = usage if earlier is None else earlier.then(usage)

    async def _paced(self, account: TokenAccount, n: int, wait: float) -> None:
        try:
            await self.meter.sleep(wait)
        except BaseException:
            self.meter.accounts.unpace(account, n)  # never handed over: its place goes to the next
            raise
        self.paced_s += wait

    async def _paced_shared(self, account: TokenAccount, n: int, pending: Awaitable[float]) -> None:
        try:
            wait = await pending
        except BaseException:
            self.meter.accounts.unpace(account, n)
            raise
        if wait:
            await self._paced(account, n, wait)

    @property
    def reserved(self) -> int:
        """Input + output tokens the stream reserved."""
        return self.reservation.total


def _token_count(n: Any) -> int:
    try:
        count = operator.index(n)
    except TypeError:
        raise InvalidInput(f"tokens: the counter must return an int >= 0, got {type(n).__name__}") from None
    if isinstance(n, bool) or count < 0:
        raise InvalidInput(f"tokens: the counter must return an int >= 0, got {n!r:.40}")
    return count


class TokenMeter:
    """Opens and settles each stream's record and its tenant's token reservation; hooks the
    hand-over of its items (see the module docstring)."""

    scope: ClassVar[Scope] = "call"
    __slots__ = (
        "_bus",
        "accounts",
        "always_estimate",
        "count",
        "estimate",
        "estimate_tokens",
        "input_tokens",
        "key",
        "model",
        "provider",
        "sleep",
        "stage",
        "usage",
    )

    def __init__(
        self,
        stage: str,
        accounts: TokenAccounts,
        *,
        count: Callable[[Any], Any],
        estimate: Callable[..., Any] | None,
        estimate_tokens: int,
        sleep: Callable[[float], Awaitable[Any]],
        input_tokens: Callable[..., Any] | None = None,
        model: ArgRef | Callable[..., Any] | None = None,
        usage: Callable[[Any], Any] | None = None,
        event_bus: EventBus = bus,
        always_estimate: bool = False,
        key: str = "",
        provider: str = "",
    ) -> None:
        self.stage = stage
        self.key = key  # the deployment's, and its provider: what StreamSettled says
        self.provider = provider
        self.always_estimate = always_estimate  # a deployment's token limit reads the estimates
        self._bus = event_bus
        self.usage = usage
        self.accounts = accounts
        self.count = count
        self.estimate = estimate
        self.estimate_tokens = estimate_tokens
        self.input_tokens = input_tokens
        self.model = model
        self.sleep = sleep

    def enter(self, call: Call) -> Any:
        tenant = current_tenant()
        accounts = self.accounts
        account = accounts.open(tenant, None if self.model is None else self._model(call))
        record = StreamRecord(self, tenant, account)
        if self.always_estimate and (account is None or not account.limits):
            try:
                record.input_tokens = self._input_tokens(call)
                record.estimate = self._estimate(call)
            except BaseException:
                if account is not None:
                    accounts.close(account)
                raise
        elif account is not None and account.limits:
            try:
                record.input_tokens = self._input_tokens(call)
                record.estimate = estimate = self._estimate(call)
                if accounts.shared:  # a round trip to Redis: in enter_async
                    record.reservation = Reservation((), record.input_tokens, estimate, 0)
                    call.meter = record
                    return WAIT
                record.reservation, record.wait_s = accounts.reserve(account, estimate, record.input_tokens)
            except BaseException:
                accounts.close(account)
                raise
        call.meter = record
        return WAIT if record.wait_s else record

    async def enter_async(self, call: Call) -> Any:
        record: StreamRecord = call.meter
        try:
            if self.accounts.shared and not record.reservation.taken and record.account is not None:
                wanted = record.reservation
                record.reservation = NOTHING  # until Redis answers: nothing to settle
                record.reservation, record.wait_s = await self.accounts.reserve_async(
                    record.account, wanted.output, wanted.input
                )
            if record.wait_s:
                await self.sleep(record.wait_s)  # the reservation is made: wait for its tokens
        except BaseException as exc:
            self._end(call, record, exc)
            raise
        return record

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        self._end(call, token, exc)
        return None

    async def around(self, call: Call, proceed: Callable[[], Awaitable[Any]]) -> Any:
        head = await proceed()
        record = call.meter
        if record is not None and (record.account is not None or self.always_estimate or self._bus.active):
            head.deliver = record.deliver
        return head

    def _estimate(self, call: Call) -> int:
        given = self.estimate
        if given is None:
            return self.estimate_tokens
        n = given(*call.args, **call.kwargs)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidInput(f"estimate: must return an int >= 1 (tokens), got {n!r:.40}")
        return n

    def _input_tokens(self, call: Call) -> int:
        given = self.input_tokens
        if given is None:
            return 0
        n = given(*call.args, **call.kwargs)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidInput(f"input_tokens: must return an int >= 0 (tokens), got {n!r:.40}")
        return n

    def _model(self, call: Call) -> str | None:
        given = self.model
        if isinstance(given, ArgRef):
            name = given.get(call.args, call.kwargs)
        else:
            name = given(*call.args, **call.kwargs)  # type: ignore[misc]
        return name if isinstance(name, str) else None  # not a name: the tenant's limits only

    def _model_of(self, call: Call) -> str | None:
        """The model the call names (None: none, or its ``model=`` option raised)."""
        if self.model is None:
            return None
        try:
            return self._model(call)
        except Exception:
            return None

    def _end(self, call: Call, record: StreamRecord, exc: BaseException | None) -> None:
        call.meter = None
        account = record.account
        if account is not None:
            usage = record.reported
            if usage is None:
                self.accounts.settle(account, record.reservation, record.tokens)
            else:
                used = record.tokens if usage.output_tokens is None else usage.output_tokens
                self.accounts.settle(account, record.reservation, used, usage.input_tokens)
            self.accounts.close(account)
        if self._bus.active:
            outcome = "ok" if exc is None else "error" if isinstance(exc, Exception) else "cancelled"
            usage = record.reported  # what the provider reported, and bills, before the end
            model = self._model_of(call)
            self._bus.emit(
                StreamSettled(
                    self.stage, record.tenant, call.items, record.tokens, record.reserved, record.paced_s,
                    outcome, None if usage is None else usage.input_tokens,
                    None if usage is None else usage.output_tokens, self.key, self.provider, model or "",
                )
            )  # fmt: skip


class StreamBudgets:
    """Bounds each wait for an item of a stream by its first-item, idle and total budgets
    (seconds, None: no such budget; see the module docstring)."""

    scope: ClassVar[Scope] = "item"
    __slots__ = (
        "_bus",
        "_loop",
        "_timers",
        "_wheel",
        "clock",
        "first_item_s",
        "idle_s",
        "stage",
        "timeout_s",
        "total_s",
    )

    def __init__(
        self,
        stage: str,
        policy: GenerationPolicy,
        *,
        timeout_s: float | None,
        clock: Clock,
        timers: Timers | None,
        event_bus: EventBus = bus,
    ) -> None:
        self.stage = stage
        self._bus = event_bus
        self.first_item_s = policy.first_item_s
        self.idle_s = policy.idle_s
        self.total_s = policy.total_s
        self.timeout_s = timeout_s  # the stage's own per-item timeout: the timeout layer's
        self.clock = clock
        self._timers = timers  # the Guard clock's own (a FakeClock's), else the loop's wheel
        self._loop: Any = None
        self._wheel: Any = None

    def enter(self, call: Call) -> Any:
        record = call.meter
        if record is None:  # pragma: no cover - the meter opens every stream of the stage
            return None
        record.entered = self.clock()
        budget: float | None
        kind: StreamBudget
        if call.items:
            budget, kind = self.idle_s, "idle"
        else:
            budget, kind = self.first_item_s, "first_item"
        total = self.total_s
        if total is not None:
            left = total - record.spent_s
            if left <= 0.0:
                raise self._cut(call, record, "total")
            if budget is None or left < budget:
                budget, kind = left, "total"
        if budget is None or budget >= MAX_TIMEOUT_S:
            return record
        expiry = current_expiry()
        if expiry is not None and expiry.left() <= budget:
            return record  # the deadline comes first: the timeout layer cuts
        if self.timeout_s is not None and self.timeout_s <= budget:
            return record  # so does the stage's own timeout
        record.kind = kind
        loop = running_loop()
        if loop is None:
            record.handle = _trio_scope(budget)
            return record
        call.task = task = current_task(loop)
        if task is None:  # pragma: no cover - awaited outside a task: nothing to cancel
            return record
        timers = self._timers
        if timers is None:  # the loop's wheel (inlined: this runs for every item)
            if loop is not self._loop:
                self._wheel = wheel_for(loop)
                self._loop = loop
            timers = self._wheel
        record.handle = timers.arm(task, budget)
        return record

    async def enter_async(self, call: Call) -> Any:  # pragma: no cover - enter never waits
        return self.enter(call)

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        if token is None:  # pragma: no cover - see enter
            return None
        record: StreamRecord = token
        record.spent_s += self.clock() - record.entered
        handle = record.handle
        if handle is None:
            return None
        record.handle = None
        if type(handle) is not int:  # a trio cancel scope
            handle.__exit__(type(exc) if exc is not None else None, exc, None)
            if exc is not None and handle.cancelled_caught:
                return self._cut(call, record, record.kind)
            return None
        timers = self._timers if self._timers is not None else self._wheel
        if not timers.disarm(handle):
            return None
        # the timer fired: take its cancellation back; the budget ran out only if the wait ended
        # cancelled and nobody else asked to cancel the task too
        outside = call.task.uncancel() > 0
        if isinstance(exc, asyncio.CancelledError) and not outside:
            return self._cut(call, record, record.kind)
        return None

    def _cut(self, call: Call, record: StreamRecord, kind: StreamBudget) -> StreamTimeout:
        seconds = {"total": self.total_s, "first_item": self.first_item_s, "idle": self.idle_s}[kind]
        error = StreamTimeout(self.stage, kind, seconds or 0.0, call.items)
        error.__suppress_context__ = True  # the cancellation that stopped the wait is ours
        if self._bus.active:
            self._bus.emit(StreamCut(self.stage, record.tenant, kind, call.items))
        return error


def _trio_scope(timeout_s: float) -> Any:
    import trio

    scope = trio.CancelScope(deadline=trio.current_time() + timeout_s)
    scope.__enter__()
    return scope
