"""The failure path keeps its promises while costing less (issue 16): the policy's retry strategies,
asked inline, decide exactly as tenacity's strategy objects do; the retry budget's running totals
equal the sums they replace; a failed call leaves no reference cycle for the garbage collector."""

from __future__ import annotations

import asyncio
import gc
import random
from typing import Any

import pytest
import tenacity
from hypothesis import given, settings
from hypothesis import strategies as st

import ragguard
from ragguard import FakeClock, RetryPolicy, deadline
from ragguard.breakers import counts_by_default
from ragguard.layers._retry import RetryBudget, RetryLayer, _BudgetStop, _CutWait, _DeadlineStop
from ragguard.pipeline import Call

pytestmark = pytest.mark.timeout(60)


class Busy(ConnectionError):
    def __init__(self, retry_after_s: float) -> None:
        super().__init__("busy")
        self.retry_after_s = retry_after_s


class _RejectedConnection(ragguard.RagguardError, ConnectionError):
    """A rejection by ragguard that is also a ConnectionError: never retried all the same."""


def _errors(kinds: list[str]) -> list[Exception]:
    made: dict[str, Any] = {
        "refused": lambda: ConnectionRefusedError("refused"),
        "timeout": lambda: TimeoutError("slow"),
        "busy": lambda: Busy(0.3),
        "bad": lambda: ValueError("caller's"),
        "stage": lambda: ragguard.StageTimeout("s", 1.0),
        "open": lambda: ragguard.BreakerOpen("s", 1.0),
        "rejected": lambda: _RejectedConnection("no"),
    }
    return [made[k]() for k in kinds]


async def _drive(layer: RetryLayer, clock: FakeClock, errors: list[Exception], budget_s: float | None) -> Any:
    """One call whose attempts fail with ``errors`` in turn (then succeed); what it did."""
    call = Call("s", lambda: None, (), {})
    queue = list(errors)
    first = queue.pop(0)

    async def again() -> str:
        if queue:
            raise queue.pop(0)
        return "ok"

    async def run() -> Any:
        try:
            return await layer.recover(call, first, again)
        except Exception as exc:
            return type(exc).__name__

    if budget_s is None:
        outcome = await run()
    else:
        async with deadline(budget_s, clock=clock):
            outcome = await run()
    return outcome, call.attempt, clock()


def _layers(
    attempts: int, backoff: float, jitter: float, min_attempt: float, ratio: float, retry_on: tuple[str, ...]
) -> list[tuple[RetryLayer, FakeClock, list[float]]]:
    """Two layers of one policy: one asking its strategies inline, one given the same strategies
    as tenacity objects (asked through tenacity's protocol); each with its clock and sleep log."""
    made: list[tuple[RetryLayer, FakeClock, list[float]]] = []
    for explicit in (False, True):
        clock = FakeClock(50.0)
        slept: list[float] = []

        async def sleep(s: float, clock: FakeClock = clock, slept: list[float] = slept) -> None:
            slept.append(round(s, 9))
            clock.advance(s)

        policy = RetryPolicy(attempts=attempts, initial_backoff_s=backoff, jitter_s=jitter, retry_on=retry_on)
        budget = RetryBudget(ratio=ratio, min_per_s=0.2, window_s=10, clock=clock)
        holder: list[RetryLayer] = []
        strategies: dict[str, Any] = {}
        if explicit:
            strategies = {
                "stop": tenacity.stop_after_attempt(attempts)
                | _DeadlineStop(min_attempt)
                | _BudgetStop(lambda holder=holder: holder[0]._spend()),
                "wait": _CutWait(policy, min_attempt, random.Random(7)),
                "retry": tenacity.retry_if_exception(lambda exc, holder=holder: holder[0].retryable(exc)),
            }
        layer = RetryLayer(
            "s",
            policy,
            budget=budget,
            counts=counts_by_default,
            min_attempt_s=min_attempt,
            clock=clock,
            rng=random.Random(7),
            sleep=sleep,
            **strategies,
        )
        holder.append(layer)
        assert layer._native is not explicit
        made.append((layer, clock, slept))
    return made


@settings(max_examples=120, deadline=None)
@given(
    attempts=st.integers(1, 6),
    backoff=st.sampled_from([0.0, 0.05, 0.2]),
    jitter=st.sampled_from([0.0, 0.03]),
    min_attempt=st.sampled_from([0.0, 0.05]),
    ratio=st.sampled_from([0.0, 1.0]),
    retry_on=st.sampled_from([("connection",), ("connection", "timeout"), ("any",)]),
    budget_s=st.sampled_from([None, 0.12, 0.5, 3.0]),
    calls=st.lists(
        st.lists(
            st.sampled_from(["refused", "timeout", "busy", "bad", "stage", "open", "rejected"]),
            min_size=1,
            max_size=7,
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_the_inline_strategies_decide_as_tenacitys_objects(
    attempts: int,
    backoff: float,
    jitter: float,
    min_attempt: float,
    ratio: float,
    retry_on: tuple[str, ...],
    budget_s: float | None,
    calls: list[list[str]],
) -> None:
    """The same calls through a layer asking the policy's strategies inline and one asking the
    same strategies as tenacity objects: the same waits, attempts, outcomes, budget charges."""
    (native, n_clock, n_slept), (explicit, e_clock, e_slept) = _layers(
        attempts, backoff, jitter, min_attempt, ratio, retry_on
    )

    async def both() -> None:
        for kinds in calls:
            for layer in (native, explicit):
                layer.budget.on_call(layer.clock())
            got = await _drive(native, n_clock, _errors(kinds), budget_s)
            want = await _drive(explicit, e_clock, _errors(kinds), budget_s)
            assert got == want
            assert n_slept == e_slept
            assert native.budget._cur_retries == explicit.budget._cur_retries

    asyncio.run(both())


@settings(max_examples=80, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["call", "retry", "tick"]), st.floats(0.0, 4.0)), max_size=60))
def test_the_retry_budget_keeps_its_sums_as_it_moves(ops: list[tuple[str, float]]) -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.5, min_per_s=0.1, window_s=3, clock=clock)
    for op, seconds in ops:
        if op == "tick":
            clock.advance(seconds)
        elif op == "call":
            budget.on_call(clock())
        else:
            budget.try_spend()
        assert budget._past_calls == sum(c for c, _ in budget._buckets.values())
        assert budget._past_retries == sum(r for _, r in budget._buckets.values())


def _garbage_of(run: Any, times: int) -> int:
    for _ in range(5):  # earlier tests' garbage can take more than one pass (finalizers)
        if not gc.collect():
            break
    gc.disable()
    try:
        for _ in range(times):
            run()
        return gc.collect()
    finally:
        gc.enable()


@pytest.mark.parametrize("full", [False, True], ids=["retries", "full-stack"])
def test_a_failed_call_leaves_no_reference_cycle(full: bool) -> None:
    """Each error raised holds the frames it passed through in its traceback: a frame still holding
    the error (a recovery's local) made a cycle only the garbage collector could free."""
    stage = ragguard.StagePolicy(
        timeout_s=2.0 if full else None,
        retry=RetryPolicy(attempts=3, retry_on=("connection",), initial_backoff_s=0.0, jitter_s=0.0),
        breaker=ragguard.BreakerPolicy(kind="generic" if full else "none", minimum_calls=100),
    )
    g = ragguard.Guard(
        ragguard.Policy(stages={"s": stage}, tenants={"acme": ragguard.TenantQuota(max_concurrency=4)}),
        sleep=lambda s: asyncio.sleep(0),
    )

    async def down(x: int) -> int:
        raise ConnectionRefusedError("down")

    async def fallback_fails(x: int) -> int:
        raise ConnectionResetError("the fallback is down too")

    guarded = g.guard("s", fallback=fallback_fails if full else None)(down)

    async def calls(n: int) -> None:
        for _ in range(n):
            with pytest.raises(ConnectionRefusedError):
                async with g.tenant("acme"):
                    await guarded(1)

    asyncio.run(calls(5))  # warm: chains compiled, caches filled
    loop = asyncio.new_event_loop()
    try:
        assert _garbage_of(lambda: loop.run_until_complete(calls(20)), 1) == 0
    finally:
        loop.close()


class _Flaky(ValueError):
    """Not a kind ``retry_on`` names (a caller's ValueError): retried only by a user's predicate."""


def _strategy_guard(clock: FakeClock, slept: list[float], **strategies: Any) -> ragguard.Guard:
    async def sleep(s: float) -> None:
        slept.append(round(s, 6))
        clock.advance(s)

    retry = RetryPolicy(attempts=5, initial_backoff_s=0.1, jitter_s=0.0, budget_min_per_s=100.0, **strategies)
    policy = ragguard.Policy(
        stages={"s": ragguard.StagePolicy(retry=retry, breaker=ragguard.BreakerPolicy(kind="none"))}
    )
    return ragguard.Guard(policy, clock=clock, sleep=sleep)


def test_a_policy_takes_a_users_tenacity_strategies() -> None:
    """``RetryPolicy(stop=..., wait=..., retry=...)``: the user's strategies join the policy's
    rules (attempts, deadline, budget, never a rejection by ragguard)."""
    clock, slept = FakeClock(), []
    g = _strategy_guard(
        clock,
        slept,
        wait=tenacity.wait_fixed(0.25),
        stop=tenacity.stop_after_delay(0.6),
        retry=tenacity.retry_if_exception_type(_Flaky),
    )
    attempts: list[float] = []

    @g.guard("s")
    async def flaky() -> None:
        attempts.append(clock())
        raise _Flaky("again")

    with pytest.raises(_Flaky):
        asyncio.run(flaky())
    # wait_fixed(0.25) instead of 0.1, 0.2...; stop_after_delay(0.6) before attempts=5 stops
    assert slept == [0.25, 0.25, 0.25] and attempts == [0.0, 0.25, 0.5, 0.75]

    @g.guard("s")
    async def refused() -> None:
        raise ConnectionRefusedError("not a _Flaky: the user's predicate says no")

    slept.clear()
    with pytest.raises(ConnectionRefusedError):
        asyncio.run(refused())
    assert slept == []

    @g.guard("s")
    async def rejected() -> None:
        raise _RejectedConnection("a rejection by ragguard is never retried")

    with pytest.raises(_RejectedConnection):
        asyncio.run(rejected())
    assert slept == []


def test_a_users_wait_is_still_cut_to_the_deadline_and_the_attempts_still_bound() -> None:
    clock, slept = FakeClock(), []
    g = _strategy_guard(clock, slept, wait=lambda state: 10.0)  # a plain callable works too
    calls = 0

    @g.guard("s")
    async def down() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionRefusedError("down")

    async def within(budget_s: float) -> None:
        async with g.deadline(budget_s):
            await down()

    with pytest.raises(ConnectionRefusedError):
        asyncio.run(within(1.0))
    # cut to leave min_attempt_s (0.001 s at least), then cut to nothing: the FakeClock does not move
    # while the attempts fail, so they run out first (as with the policy's own wait)
    assert slept[0] == pytest.approx(0.999) and slept[1:] == [0.0] * 3 and calls == 5
    calls = 0
    slept.clear()
    with pytest.raises(ConnectionRefusedError):
        asyncio.run(down())  # no deadline: the full wait, and attempts=5 bounds it
    assert slept == [10.0] * 4 and calls == 5


@pytest.mark.parametrize("field", ["stop", "wait", "retry"])
def test_a_strategy_that_is_not_callable_is_a_config_error_naming_the_field(field: str) -> None:
    with pytest.raises(ragguard.ConfigError) as info:
        RetryPolicy(attempts=3, **{field: "wait_fixed(1)"})
    assert info.value.field == field and "tenacity strategy" in str(info.value)
