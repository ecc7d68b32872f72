"""Deadline-aware retries (run by tenacity) and the retry budget that stops retry storms.

A recovery: nothing runs until an attempt fails with an error the stage retries (``retry_on``:
dependency failures, timeouts, out of memory, a dependency's rejections, or anything the breaker
counts, as the outcome the chain classified says, ``Call.outcome``; never a caller's error, a
cancellation or a refusal by ragguard itself). A stage that is not idempotent retries only errors
raised before its request could have left (``Outcome.reached`` False: a refused connection, a
connect timeout), never after a timeout or a reset mid-request. Then the layer's own loop drives the
retries with tenacity's strategy objects (built once per layer, from small strategies that compose
as tenacity intends; a caller may pass its own ``stop``, ``wait`` and ``retry``), asking them
exactly as tenacity's ``AsyncRetrying`` would, in the same order, with a fresh
``tenacity.RetryCallState`` per call:

- stop after ``attempts``, or when the next attempt could not start before the deadline with
  ``min_attempt_s`` left (the upcoming sleep included), or when the retry budget refuses;
- wait exponentially with seeded jitter, cut to the deadline, and at least the wait the dependency
  stated (``Outcome.retry_after_s``: ``Retry-After``, ``retry-after-ms``, rate-limit resets, gRPC
  pushback); a stated wait over ``max_retry_after_s``, or one the deadline cannot fit, stops at
  once, so the stage's fallback serves instead of a caller waiting for hours;
- sleep with the Guard's time source (a :class:`~ragguard.FakeClock` in tests).

The retry budget (after Envoy's and Finagle's) lets retries add at most ``budget_ratio`` of the
stage's calls over ``budget_window_s`` plus ``budget_min_per_s`` per second.

Why not ``AsyncRetrying`` itself: its machinery (an action list rebuilt per attempt, a
``concurrent.futures`` future with its lock per outcome, statistics in a thread-local dict) was
three quarters of a failing call's CPU time (benchmarks/failure_path.py): on the failure path,
exactly when a dependency is down, that is what saturates an event loop. The strategies are the
part worth keeping, and they are kept: a layer given its own ``stop``, ``wait`` or ``retry`` asks
them through tenacity's protocol (a ``RetryCallState`` per call). The policy's own strategies are
asked in the same order with the same arithmetic, but inline (the backoff of each attempt
computed once, by tenacity's ``wait_exponential`` itself): a dozen strategy calls per retry were
two thirds of what was left of a failing call's cost.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar

import tenacity

from .._context import current_tenant
from .._deadline import current_expiry, remaining
from .._errors import RagguardError, StageTimeout
from ..events import EventBus, RetryBudgetExhausted, RetryScheduled, bus
from ..options import HedgePolicy, RetryPolicy
from ..outcomes import Kind, Outcome, outcome_of
from ..pipeline import NO_EXIT, Call, Scope
from ..pipeline._contract import repeat

if TYPE_CHECKING:
    from ._shapes import Bound, Budget, Stage

__all__ = ["RetryBudget", "RetryLayer", "build", "make_budget"]


_FAILURE, _TIMEOUT, _REJECTION, _UNKNOWN = Kind.FAILURE, Kind.TIMEOUT, Kind.REJECTION, Kind.UNKNOWN
"""(A module's names: in CPython 3.11 ``Kind.FAILURE`` costs a descriptor call per look-up.)"""


class RetryBudget:
    """Retries may add at most ``ratio`` of the calls seen in the last ``window_s`` seconds, plus
    ``min_per_s`` retries per second (after Envoy's retry budget and Finagle's RetryBudget).

    Calls are counted in one-second buckets of the injected ``clock`` (monotonic seconds).
    """

    __slots__ = (
        "_buckets",
        "_clock",
        "_cur",
        "_cur_calls",
        "_cur_retries",
        "_past_calls",
        "_past_retries",
        "min_per_s",
        "ratio",
        "window_s",
    )

    @classmethod
    def of(cls, policy: RetryPolicy | HedgePolicy, clock: Callable[[], float]) -> RetryBudget:
        """The budget a policy's ``budget_ratio``, ``budget_min_per_s`` and ``budget_window_s``
        give (the retries' or the hedges')."""
        return cls(ratio=policy.budget_ratio, min_per_s=policy.budget_min_per_s,
                   window_s=policy.budget_window_s, clock=clock)  # fmt: skip

    def __init__(
        self, *, ratio: float, min_per_s: float, window_s: float, clock: Callable[[], float]
    ) -> None:
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.window_s = max(1, round(window_s))
        self._clock = clock
        self._buckets: dict[int, tuple[int, int]] = {}
        self._cur = -1
        self._cur_calls = 0
        self._cur_retries = 0
        self._past_calls = 0  # the sums over _buckets (the seconds before the current one)
        self._past_retries = 0

    def _rotate(self, sec: int) -> None:
        if self._cur >= 0 and (self._cur_calls or self._cur_retries):
            self._buckets[self._cur] = (self._cur_calls, self._cur_retries)
            self._past_calls += self._cur_calls
            self._past_retries += self._cur_retries
        self._cur, self._cur_calls, self._cur_retries = sec, 0, 0
        horizon = sec - self.window_s
        for old in [k for k in self._buckets if k <= horizon]:
            calls, retries = self._buckets.pop(old)
            self._past_calls -= calls
            self._past_retries -= retries

    def on_call(self, now: float) -> None:
        """Count one first attempt made at clock time ``now``."""
        sec = int(now)
        if sec != self._cur:
            self._rotate(sec)
        self._cur_calls += 1

    def try_spend(self) -> bool:
        """Take one retry from the budget; False when the budget is spent."""
        sec = int(self._clock())
        if sec != self._cur:
            self._rotate(sec)
        calls = self._cur_calls + self._past_calls
        retries = self._cur_retries + self._past_retries
        if retries + 1 > self.ratio * calls + self.min_per_s * self.window_s:
            return False
        self._cur_retries += 1
        return True

    def refund(self) -> None:
        """Give back one retry taken by :meth:`try_spend` that was never sent (a hedge refused
        before it reached the dependency): from the current second, else the latest one holding
        one."""
        if self._cur_retries > 0:
            self._cur_retries -= 1
            return
        for sec in sorted(self._buckets, reverse=True):
            calls, retries = self._buckets[sec]
            if retries > 0:
                self._buckets[sec] = (calls, retries - 1)
                self._past_retries -= 1
                return


Strategy = Callable[[tenacity.RetryCallState], Any]
"""A tenacity strategy: ``stop`` and ``retry`` return a bool, ``wait`` the seconds to sleep."""


class _DeadlineStop(tenacity.stop.stop_base):
    """Stop when the next attempt could not start before the deadline with ``min_attempt_s`` left.

    tenacity's ``stop_after_delay`` is checked against the time already spent, so its last sleep can
    carry an attempt past the deadline; this one looks at the upcoming sleep as well.
    """

    def __init__(self, min_attempt_s: float) -> None:
        self.min_attempt_s = max(min_attempt_s, 0.001)

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        left = remaining()
        return left is not None and left - retry_state.upcoming_sleep < self.min_attempt_s


def retry_after_of(exc: BaseException | None) -> float:
    """The wait in seconds the dependency stated with an error (the ``retry_after_s`` of its
    outcome, as the chain recorded it: :func:`ragguard.outcomes.outcome_of`), 0.0 when it stated
    none."""
    if exc is None:
        return 0.0
    return outcome_of(exc).retry_after_s or 0.0


class _StatedWaitStop(tenacity.stop.stop_base):
    """Stop when the dependency stated a wait longer than ``max_after_s``: no retry waits for it,
    so the stage's fallback serves at once."""

    def __init__(self, max_after_s: float) -> None:
        self.max_after_s = max_after_s

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        outcome = retry_state.outcome
        if outcome is None or not outcome.failed:
            return False
        return retry_after_of(outcome.exception()) > self.max_after_s


class _CutWait(tenacity.wait.wait_base):
    """Exponential backoff with seeded jitter, cut so that ``min_attempt_s`` stays for the retry,
    and never shorter than the failed attempt's ``retry_after_s`` (then the deadline stop decides
    whether that wait fits)."""

    def __init__(
        self,
        policy: RetryPolicy,
        min_attempt_s: float,
        rng: random.Random,
        base: Strategy | None = None,
    ) -> None:
        # ``base``: a wait of the user's, in place of the exponential backoff and its jitter
        self.base: Strategy = base or tenacity.wait_exponential(
            multiplier=policy.initial_backoff_s, exp_base=policy.multiplier, max=policy.max_backoff_s
        )
        self.jitter_s = 0.0 if base is not None else policy.jitter_s
        self.min_attempt_s = max(min_attempt_s, 0.001)
        self.rng = rng

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        wait = float(self.base(retry_state))
        if self.jitter_s:
            wait += self.rng.uniform(0.0, self.jitter_s)
        left = remaining()
        if left is not None:
            wait = min(wait, max(0.0, left - self.min_attempt_s))
        outcome = retry_state.outcome
        if outcome is not None and outcome.failed:
            wait = max(wait, retry_after_of(outcome.exception()))
        return wait


class _BudgetStop(tenacity.stop.stop_base):
    """Stop when the retry budget refuses the retry; checked last, so only retries that would
    otherwise happen are charged to the budget."""

    def __init__(self, spend: Callable[[], bool]) -> None:
        self.spend = spend

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return not self.spend()


def _not_a_rejection(exc: BaseException) -> bool:
    """Neither a cancellation nor a rejection by ragguard (a stage timeout is a timeout)."""
    return isinstance(exc, Exception) and (
        not isinstance(exc, RagguardError) or isinstance(exc, StageTimeout)
    )


class _Numbered:
    """What ``wait_exponential`` reads of a retry state: the number of the attempt that failed."""

    __slots__ = ("attempt_number",)

    def __init__(self, attempt_number: int) -> None:
        self.attempt_number = attempt_number


class _Failed:
    """A failed attempt's outcome as tenacity strategies read it (``failed``, ``exception()``,
    ``result()``, ``attempt_number``), without the ``concurrent.futures.Future`` (and its lock)
    that tenacity allocates for each outcome."""

    __slots__ = ("_exc", "attempt_number")
    failed = True

    def __init__(self, exc: BaseException, attempt_number: int) -> None:
        self._exc = exc
        self.attempt_number = attempt_number

    def exception(self, timeout: float | None = None) -> BaseException:
        return self._exc

    def result(self, timeout: float | None = None) -> Any:
        raise self._exc

    def done(self) -> bool:
        return True

    def cancelled(self) -> bool:
        return False


class _CallState(tenacity.RetryCallState):
    """tenacity's per-call retry state, its times on the Guard's clock (so ``stop_after_delay``
    and friends follow a FakeClock), for a call that has just failed its first attempt: it started
    when the breaker admitted that attempt (``Call.started``), or now without a breaker."""

    def __init__(self, call: Call, clock: Callable[[], float]) -> None:
        self.start_time = call.started or clock()
        self.retry_object = None  # type: ignore[assignment]
        self.fn = call.fn  # type: ignore[assignment]
        self.args = call.args
        self.kwargs = call.kwargs
        self.attempt_number = 1
        self.outcome = None
        self.outcome_timestamp = None
        self.idle_for = 0.0
        self.next_action = None
        self.upcoming_sleep = 0.0


class _Asking:
    """A retry layer's loop for one call, asking the layer's tenacity strategies with the call's
    own retry state (:meth:`RetryLayer._next_wait_of_strategies`)."""

    __slots__ = ("layer", "sleep", "state")

    def __init__(self, layer: RetryLayer, call: Call) -> None:
        self.layer = layer
        self.sleep = layer.sleep
        self.state = _CallState(call, layer.clock)

    def next_wait(self, call: Call, exc: Exception, attempt: int) -> float | None:
        layer = self.layer
        wait = layer._next_wait_of_strategies(call, exc, self.state)
        if wait is not None and layer._bus.active:
            layer._scheduled(attempt, wait, exc)
        return wait


class RetryLayer:
    """Retries a failed attempt of stage ``stage`` (see the module docstring).

    Also a gate of call scope, so that every call (not only the failing ones) counts towards the
    retry budget's ratio. With the policy's own strategies it ``repeats`` (see
    :class:`~ragguard.pipeline.Recovery`): a chain asks :meth:`next_wait` after each failed
    attempt, sleeps with :attr:`sleep` and runs the next one in its own frame, as :meth:`recover`
    would."""

    scope: ClassVar[Scope] = "call"
    __slots__ = (
        "_any",
        "_attempts",
        "_backoffs",
        "_bus",
        "_connection",
        "_counts",
        "_idempotent",
        "_jitter_s",
        "_max_after_s",
        "_min_left",
        "_native",
        "_out_of_memory",
        "_rejection",
        "_timeout",
        "budget",
        "clock",
        "min_attempt_s",
        "policy",
        "repeats",
        "retry",
        "rng",
        "sleep",
        "stage",
        "stop",
        "wait",
    )

    def __init__(
        self,
        stage: str,
        policy: RetryPolicy,
        *,
        budget: Budget,
        counts: Callable[[BaseException], bool],
        min_attempt_s: float,
        clock: Callable[[], float],
        rng: random.Random,
        sleep: Callable[[float], Awaitable[Any]],
        stop: Strategy | None = None,
        wait: Strategy | None = None,
        retry: Strategy | None = None,
        idempotent: bool = True,
        event_bus: EventBus = bus,
    ) -> None:
        self.stage = stage
        self._bus = event_bus
        self.policy = policy
        self.budget = budget
        self.min_attempt_s = min_attempt_s
        self.clock = clock
        self.rng = rng
        self.sleep = sleep
        kinds = policy.retry_on
        self._any = "any" in kinds
        self._counts = counts
        self._idempotent = idempotent
        self._max_after_s = policy.max_retry_after_s
        # what ``retry_on`` retries of each kind ("any": rejections, and what the breaker counts)
        self._rejection = self._any or "rejection" in kinds
        self._connection = not self._any and "connection" in kinds
        self._out_of_memory = not self._any and "out_of_memory" in kinds
        self._timeout = not self._any and "timeout" in kinds
        # A policy's own strategies (RetryPolicy.stop/wait/retry) join the policy's rules (see
        # RetryPolicy); ``stop``/``wait``/``retry`` given here replace them outright.
        if stop is None and policy.stop is not None:
            stop = tenacity.stop_any(  # (plain callables as well as strategy objects)
                tenacity.stop_after_attempt(policy.attempts),
                _DeadlineStop(min_attempt_s),
                _StatedWaitStop(policy.max_retry_after_s),
                policy.stop,
                _BudgetStop(self._spend),
            )
        if wait is None and policy.wait is not None:
            wait = _CutWait(policy, min_attempt_s, rng, base=policy.wait)
        if retry is None and policy.retry is not None:
            retry = tenacity.retry_all(tenacity.retry_if_exception(self._may_repeat), policy.retry)
        # The policy's strategies, asked inline by recover(): stop after ``attempts``, or when the
        # deadline would leave less than ``_min_left`` after the wait, or when the budget refuses;
        # wait tenacity's exponential backoff for the attempt (computed once here, by tenacity),
        # plus jitter, cut to the deadline, at least the error's retry_after_s (see _CutWait).
        self._native = stop is None and wait is None and retry is None
        self.repeats = self._native  # a chain runs recover()'s loop itself, asking next_wait
        self._attempts = policy.attempts
        self._min_left = max(min_attempt_s, 0.001)
        self._jitter_s = policy.jitter_s
        exponential = _CutWait(policy, min_attempt_s, rng).base
        self._backoffs: tuple[float, ...] = tuple(
            float(exponential(_Numbered(n))) for n in range(1, policy.attempts + 1)  # type: ignore[arg-type]
        )
        # tenacity strategies hold no per-call state (that is the RetryCallState's), so one set
        # serves every call; ``stop``/``wait``/``retry`` replace the policy's (any tenacity
        # strategy, or a callable of a RetryCallState returning bool / seconds / bool)
        if stop is None:
            stop = tenacity.stop_after_attempt(policy.attempts) | _DeadlineStop(min_attempt_s)
            stop = stop | _StatedWaitStop(policy.max_retry_after_s) | _BudgetStop(self._spend)
        self.stop: Strategy = stop
        self.wait: Strategy = wait if wait is not None else _CutWait(policy, min_attempt_s, rng)
        self.retry: Strategy = retry if retry is not None else tenacity.retry_if_exception(self.retryable)

    def retryable(self, exc: BaseException) -> bool:
        """True when ``exc`` may be retried: its outcome is one of the stage's ``retry_on`` kinds,
        not a caller's error, a cancellation or a refusal by ragguard (a stage timeout is a
        timeout, and retryable); for a stage that is not idempotent, only when the request cannot
        have reached the dependency."""
        if not _not_a_rejection(exc):
            return False  # tenacity hands cancellations to the predicate too: never retry them
        return self._retries(exc, outcome_of(exc))

    def _may_repeat(self, exc: BaseException) -> bool:
        """Neither a cancellation nor a refusal by ragguard, and for a stage that is not
        idempotent an error raised before the request could have left (a user's ``retry``
        predicate is asked only then)."""
        return _not_a_rejection(exc) and (self._idempotent or not outcome_of(exc).reached)

    def _retries(self, exc: BaseException, outcome: Outcome) -> bool:
        said = outcome.retry  # the dependency's own word (x-should-retry) over its status's
        if said is not None:
            return said and (self._idempotent or not outcome.reached)
        if outcome.reached and not self._idempotent:
            return False
        kind = outcome.kind
        if kind is _FAILURE:
            retried = self._out_of_memory if outcome.reason == "out_of_memory" else self._connection
        elif kind is _TIMEOUT:
            retried = self._timeout
        elif kind is _REJECTION:
            return self._rejection
        elif kind is not _UNKNOWN:
            return False  # the caller's error, a cancellation, ragguard's refusal, the deadline
        else:
            retried = False
        return retried or (self._any and bool(self._counts(exc)))

    def enter(self, call: Call) -> Any:
        if call.attempt == 1:
            self.budget.on_call(self.clock())
        return NO_EXIT

    async def enter_async(self, call: Call) -> Any:  # pragma: no cover - enter never waits
        return self.enter(call)

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        return None  # pragma: no cover - enter answers NO_EXIT

    async def recover(self, call: Call, exc: Exception, again: Callable[[], Awaitable[Any]]) -> Any:
        """The retry loop (:func:`~ragguard.pipeline._contract.repeat`): after each failed
        attempt, decide whether and how long to wait (the policy's strategies, :meth:`next_wait`;
        or the layer's tenacity strategies, with a retry state of the call's own), say so
        (RetryScheduled), sleep, and run the next attempt; the error of the attempt not retried
        is raised."""
        try:
            return await repeat(self if self._native else _Asking(self, call), call, exc, again)
        finally:
            del exc  # (see repeat: no reference cycle between the error and this frame)

    def next_wait(self, call: Call, exc: Exception, attempt: int) -> float | None:
        """The seconds to sleep before the next attempt after ``exc`` ended attempt number
        ``attempt`` (RetryScheduled said), or None: not retried (the budget is charged only for
        a retry that happens). The policy's own strategies, asked inline in tenacity's order: the
        retry predicate (with the outcome the chain recorded, ``call.outcome``), the wait, the
        stop (attempts, deadline, budget). Only for a layer that :attr:`repeats`."""
        if isinstance(exc, RagguardError) and not isinstance(exc, StageTimeout):
            return None  # ragguard's own refusal (_not_a_rejection, inlined: exc is an Exception)
        outcome = call.outcome or outcome_of(exc)
        outer = call.recoverable
        if not self._retries(exc, outcome) or (outer is not None and outer(exc)):
            return None
        after = outcome.retry_after_s or 0.0
        if after > self._max_after_s:
            return None  # the dependency asks for more than this stage would ever wait
        wait = self._backoffs[attempt - 1]
        jitter_s = self._jitter_s
        if jitter_s:
            wait += self.rng.uniform(0.0, jitter_s)
        if attempt >= self._attempts:
            # the last attempt failed: stop (the deadline and Retry-After below only shape the
            # wait, which no retry will sleep; the jitter is drawn as before)
            return None
        expiry = current_expiry()
        if expiry is not None:
            min_left = self._min_left
            left = expiry.at - expiry.clock()  # expiry.left(), inlined (and below)
            if wait > left - min_left:
                wait = left - min_left if left > min_left else 0.0
            if after > wait:  # the wait the dependency stated
                wait = after
            # the time left read again, as _DeadlineStop does after _CutWait: a wait cut to leave
            # exactly min_left is stopped once any time has passed since
            left = expiry.at - expiry.clock()
            if (left if left > 0.0 else 0.0) - wait < min_left:
                return None
        elif after > wait:
            wait = after
        if not self.budget.try_spend():  # self._spend(), inlined
            self._exhausted()
            return None
        if self._bus.active:
            self._scheduled(attempt, wait, exc)
        return wait

    def _scheduled(self, attempt: int, wait: float, exc: BaseException) -> None:
        self._bus.emit(RetryScheduled(self.stage, attempt + 1, wait, type(exc).__name__, current_tenant()))

    def _next_wait_of_strategies(self, call: Call, exc: Exception, state: _CallState) -> float | None:
        """The seconds to wait before the next attempt after ``exc``, or None to stop, asking the
        layer's tenacity strategies (a user's among them) in tenacity's order
        (``BaseRetrying.iter``): the outcome, the retry predicate, the wait (as
        ``upcoming_sleep``), the stop; then the state moves on to the next attempt."""
        state.outcome = _Failed(exc, state.attempt_number)  # type: ignore[assignment]
        state.outcome_timestamp = self.clock()
        outer = call.recoverable
        if not self.retry(state) or (outer is not None and outer(exc)):
            # (an outer layer recovers this error itself, as the rerank chunker shrinks the batch
            # on an out-of-memory error: retrying the same attempt would repeat it)
            return None
        sleep = float(self.wait(state))
        state.upcoming_sleep = sleep
        if self.stop(state):
            return None
        state.idle_for += sleep
        state.prepare_for_next_attempt()
        return sleep

    def _spend(self) -> bool:
        # Consulted by tenacity only after the attempt and deadline checks allowed a retry, so
        # the budget is charged for retries that really happen, never for a call's last attempt.
        if self.budget.try_spend():
            return True
        self._exhausted()
        return False

    def _exhausted(self) -> None:
        if self._bus.active:
            self._bus.emit(RetryBudgetExhausted(self.stage, current_tenant()))


def make_budget(stage: Stage) -> RetryBudget | None:
    """The stage's retry budget (shared by every function of the stage), None without retries."""
    retry = stage.policy.retry
    if retry.attempts <= 1:
        return None
    return RetryBudget.of(retry, stage.clock)


def build(stage: Stage, bound: Bound) -> RetryLayer | None:
    budget = stage.budget
    if budget is None:
        return None
    return RetryLayer(
        stage.name,
        stage.policy.retry,
        budget=budget,
        counts=stage.counts,
        min_attempt_s=stage.policy.min_attempt_s,
        clock=stage.clock,
        rng=stage.context.rng,
        sleep=stage.context.sleep,
        idempotent=stage.policy.is_idempotent,
        event_bus=stage.context.bus,
    )
