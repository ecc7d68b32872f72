"""``@guard`` on a sync function: a worker thread under the same layers (docs/sync.md).

The promises tested: the function runs in a worker thread with the caller's context (tenant,
deadline, degraded marks); retry, breaker, fallback, chaos and observation act as on an async
function; a timeout or a cancellation stops the waiting at once but cannot stop the thread, and
what the call holds (the tenant's slot, the default tenant's per-call slot, the adaptive limit's
permit, the stage's thread bulkhead) stays held until the thread returns, then is released.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from core_helpers import Recorder

import ragguard
from ragguard import (
    AdaptivePolicy,
    BreakerPolicy,
    ConfigError,
    DeadlineExceeded,
    FakeClock,
    Guard,
    Policy,
    QuotaExceeded,
    RetryPolicy,
    StagePolicy,
    StageTimeout,
    TenantQuota,
)
from ragguard.chaos import Chaos, Error
from ragguard.events import StageCompleted
from ragguard.overload import limiters
from ragguard.pipeline._threads import _Job, limiter_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def _until(predicate: Callable[[], bool], what: str) -> None:
    """Let the loop run (a worker thread posts its end to it) until ``predicate`` holds."""
    with anyio.fail_after(10):
        while not predicate():
            await anyio.sleep(0.002)
    assert predicate(), what


class Blocker:
    """A sync function that blocks its worker thread until the test lets it go."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.go = threading.Event()
        self.finished = threading.Event()
        self.calls = 0
        self.threads: list[int] = []

    def __call__(self, x: int) -> int:
        self.calls += 1
        self.threads.append(threading.get_ident())
        self.started.set()
        try:
            assert self.go.wait(10), "the test never let the thread go"
            return x * 2
        finally:
            self.finished.set()


async def _started(blocker: Blocker) -> None:
    await _until(blocker.started.is_set, "the worker thread started")


async def _time_out(clock: FakeClock, blocker: Blocker, work: Callable[[int], Any]) -> None:
    """Call ``work`` and advance ``clock`` past its 1 s attempt timeout while its thread runs."""

    async def timed_out() -> None:
        with pytest.raises(StageTimeout):
            await work(1)

    async with anyio.create_task_group() as tg:
        tg.start_soon(timed_out)
        await _started(blocker)
        clock.advance(1.0)  # the attempt timer fires while the thread runs


def _guard(stage: StagePolicy, *, clock: Any = None, **tenants: TenantQuota) -> Guard:
    options = {} if clock is None else {"clock": clock}
    return Guard(Policy(stages={"s": stage}, tenants=tenants), **options)


# -- a worker thread, the same layers ---------------------------------------------------------------


async def test_a_sync_function_runs_in_a_worker_thread_and_keeps_its_signature() -> None:
    g = Guard()
    loop_thread = threading.get_ident()
    seen: list[int] = []

    @g.guard("s")
    def double(x: int, *, plus: int = 0) -> int:
        """Doubles."""
        seen.append(threading.get_ident())
        return 2 * x + plus

    assert await double(4, plus=1) == 9
    assert seen and seen[0] != loop_thread
    assert double.__name__ == "double" and double.__doc__ == "Doubles."
    assert double.__ragguard_stage__ == "s"  # type: ignore[attr-defined]


async def test_the_caller_context_is_visible_inside_the_thread() -> None:
    g = Guard()
    seen: dict[str, Any] = {}

    @g.guard("s", fallback=lambda: "served")
    async def failing() -> str:
        raise ConnectionError("refused")

    @g.guard("t")
    def look() -> None:
        seen["tenant"] = ragguard.current_tenant()
        seen["left"] = ragguard.remaining()
        seen["degraded"] = ragguard.degraded()

    async with g.tenant("acme"), g.deadline(30.0):
        assert await failing() == "served"
        await look()
    assert seen["tenant"] == "acme"
    assert seen["left"] is not None and 0 < seen["left"] <= 30.0
    assert len(seen["degraded"]) == 1


async def test_retry_breaker_and_fallback_act_on_a_sync_function() -> None:
    g = _guard(
        StagePolicy(
            idempotent=True,
            retry=RetryPolicy(attempts=3, initial_backoff_s=0, jitter_s=0),
            breaker=BreakerPolicy(kind="generic", minimum_calls=3),
        )
    )
    calls: list[int] = []

    def refuse() -> str:
        calls.append(1)
        raise ConnectionRefusedError("no route")

    guarded = g.guard("s", fallback=lambda: "fallback")(refuse)
    assert await guarded() == "fallback"
    assert len(calls) == 3  # the retry layer ran it three times, each in a thread
    assert g.breaker("s").state.value == "open"
    assert await guarded() == "fallback"
    assert len(calls) == 3  # the open breaker fast-failed: no thread ran


async def test_chaos_and_observation_see_a_sync_call(events: Recorder) -> None:
    chaos = Chaos()
    g = Guard(chaos=chaos)
    ran: list[int] = []

    @g.guard("s")
    def work() -> str:
        ran.append(1)
        return "ok"

    assert await work() == "ok"
    with chaos.inject(Error(ConnectionRefusedError), stage="s"), pytest.raises(ConnectionError):
        await work()
    assert ran == [1]  # the fault was raised in place of the call
    await events.settle()
    outcomes = [e.outcome for e in events.of(StageCompleted) if e.stage == "s"]
    assert outcomes == ["success", "error"]


async def test_a_sync_generator_function_is_refused_at_decoration() -> None:
    def items() -> Any:
        yield 1

    with pytest.raises(ConfigError, match="sync generator"):
        ragguard.guard("s")(items)


# -- a timeout stops the waiting, not the thread ----------------------------------------------------


async def test_a_timeout_returns_at_once_and_the_tenant_slot_is_held_until_the_thread_returns() -> None:
    g = _guard(StagePolicy(timeout_s=0.05), acme=TenantQuota(max_concurrency=1))
    blocker = Blocker()
    work = g.guard("s")(blocker)

    with pytest.raises(StageTimeout):
        async with g.tenant("acme"):
            await work(1)
    assert not blocker.finished.is_set()  # the caller stopped waiting; the thread runs on
    assert g.quotas.in_flight("acme") == 1  # the request ended, its slot is still held
    with pytest.raises(QuotaExceeded):
        async with g.tenant("acme"):
            pass
    blocker.go.set()
    await _until(lambda: g.quotas.in_flight("acme") == 0, "the slot was released")
    assert blocker.finished.is_set()
    async with g.tenant("acme"):
        assert await work(3) == 6


async def test_a_fake_clock_timeout_holds_the_default_tenant_slot_of_a_call_outside_a_request() -> None:
    clock = FakeClock(100.0)
    g = Guard(
        Policy(stages={"s": StagePolicy(timeout_s=1.0)}, default_quota=TenantQuota(max_concurrency=1)),
        clock=clock,
    )
    blocker = Blocker()
    work = g.guard("s")(blocker)

    await _time_out(clock, blocker, work)
    assert not blocker.finished.is_set()
    assert g.quotas.in_flight("default") == 1
    with pytest.raises(QuotaExceeded):
        await work(2)
    assert blocker.calls == 1
    blocker.go.set()
    await _until(lambda: g.quotas.in_flight("default") == 0, "the per-call slot was released")
    assert await work(5) == 10


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_adaptive_permit_is_held_until_the_thread_returns() -> None:
    clock = FakeClock(0.0)
    g = _guard(StagePolicy(timeout_s=1.0, adaptive=AdaptivePolicy(initial_limit=4)), clock=clock)
    blocker = Blocker()
    work = g.guard("s")(blocker)

    await _time_out(clock, blocker, work)
    limiter = limiters(g)["s"]
    assert limiter.in_flight == 1
    blocker.go.set()
    await _until(lambda: limiter.in_flight == 0, "the adaptive permit was released")


async def test_a_cancelled_caller_returns_at_once_and_the_slot_is_held_until_the_thread_returns() -> None:
    g = _guard(StagePolicy(), acme=TenantQuota(max_concurrency=1))
    blocker = Blocker()
    work = g.guard("s")(blocker)
    ended = anyio.Event()

    async def request() -> None:
        try:
            async with g.tenant("acme"):
                await work(1)
        finally:
            ended.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(request)
        await _started(blocker)
        tg.cancel_scope.cancel()  # the client went away
    assert ended.is_set() and not blocker.finished.is_set()
    assert g.quotas.in_flight("acme") == 1
    blocker.go.set()
    await _until(lambda: g.quotas.in_flight("acme") == 0, "the slot was released")
    assert limiter_for(g.stage("s")).borrowed_tokens == 0


async def test_the_thread_bulkhead_counts_an_abandoned_thread_until_it_returns() -> None:
    g = _guard(StagePolicy(timeout_s=0.05, max_threads=1))
    blocker = Blocker()
    work = g.guard("s")(blocker)
    limiter = limiter_for(g.stage("s"))

    with pytest.raises(StageTimeout):
        await work(1)
    assert limiter.borrowed_tokens == 1  # the abandoned thread still runs
    with pytest.raises(StageTimeout):
        await work(2)  # waited for a thread within its timeout, and none came free
    assert blocker.calls == 1  # the second call never reached a thread
    blocker.go.set()
    await _until(lambda: limiter.borrowed_tokens == 0, "the thread's token was returned")
    assert await work(3) == 6


async def test_a_deadline_bounds_the_wait_and_the_thread_keeps_running() -> None:
    g = Guard()
    blocker = Blocker()
    work = g.guard("s")(blocker)
    with pytest.raises(DeadlineExceeded):
        async with g.deadline(0.05):
            await work(1)
    assert not blocker.finished.is_set()
    blocker.go.set()
    await _until(blocker.finished.is_set, "the thread ended")
    await _until(lambda: limiter_for(g.stage("s")).borrowed_tokens == 0, "the thread's token came back")


async def test_a_retry_after_a_timeout_runs_a_second_thread_and_the_slot_waits_for_both() -> None:
    g = _guard(
        StagePolicy(
            timeout_s=0.05, idempotent=True, retry=RetryPolicy(attempts=2, initial_backoff_s=0, jitter_s=0)
        ),
        acme=TenantQuota(max_concurrency=1),
    )
    blocker = Blocker()
    work = g.guard("s")(blocker)
    with pytest.raises(StageTimeout):
        async with g.tenant("acme"):
            await work(1)
    await _until(lambda: blocker.calls == 2, "the retry's thread started")
    assert g.quotas.in_flight("acme") == 1
    blocker.go.set()
    await _until(lambda: g.quotas.in_flight("acme") == 0, "the slot was released after both threads")
    assert len(set(blocker.threads)) == 2


def test_a_job_cancelled_before_its_thread_picked_it_up_never_runs() -> None:
    limiter = anyio.CapacityLimiter(1)
    job = _Job(limiter, lambda fn: None)
    ran: list[int] = []
    assert job.abandon() is False  # not started: nothing to wait for
    assert job.run(lambda: ran.append(1), (), {}) is None
    assert ran == []
