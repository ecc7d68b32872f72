"""StageTimeout: a stage's own timeout is a RagguardError and a TimeoutError, counted by every
typed breaker, retried as a "timeout" (the attempt timer runs on the Guard's FakeClock)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

import ragguard
from ragguard import (
    BreakerPolicy,
    DeadlineExceeded,
    FakeClock,
    Guard,
    Policy,
    RagguardError,
    RetryPolicy,
    StagePolicy,
    StageTimeout,
    deadline,
)
from ragguard.options._breaker import BREAKER_KINDS

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # attempt timers on a FakeClock cancel asyncio tasks


def test_a_stage_timeout_is_a_ragguard_error_and_a_timeout_error() -> None:
    error = StageTimeout("embedding", 2.5)
    assert isinstance(error, RagguardError) and isinstance(error, TimeoutError)
    assert not isinstance(error, DeadlineExceeded)  # the dependency was slow, not the caller's budget
    assert (error.stage, error.timeout_s) == ("embedding", 2.5)
    assert "embedding" in str(error) and "2.500s" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is StageTimeout and (copy.stage, copy.timeout_s) == ("embedding", 2.5)
    assert "StageTimeout" in ragguard.__all__


def _hangs(g: Guard, stage: str, clock: FakeClock) -> Any:
    @g.guard(stage)
    async def slow(*args: Any) -> str:
        await clock.sleep(60)  # time passes on the Guard's clock: the attempt timer fires
        return "late"

    return slow


@pytest.mark.parametrize("kind", sorted(BREAKER_KINDS))
async def test_every_typed_breaker_counts_a_stage_timeout(kind: str) -> None:
    clock = FakeClock()
    breaker = BreakerPolicy(kind=kind, minimum_calls=2, window_size=2, failure_rate_threshold=100)
    g = Guard(Policy(stages={"dep": StagePolicy(timeout_s=1.0, breaker=breaker, preset=None)}), clock=clock)
    slow = _hangs(g, "dep", clock)
    for _ in range(2):
        with pytest.raises(StageTimeout) as timed_out:
            await slow()
        assert timed_out.value.timeout_s == 1.0
    assert g.breaker("dep").classifier(StageTimeout("dep", 1.0))
    assert g.breaker("dep").state.value == "open"


async def test_the_callers_deadline_is_not_a_stage_timeout_and_is_not_counted() -> None:
    clock = FakeClock()
    breaker = BreakerPolicy(kind="generic", minimum_calls=1, window_size=1, failure_rate_threshold=100)
    g = Guard(Policy(stages={"dep": StagePolicy(timeout_s=5.0, breaker=breaker)}), clock=clock)
    slow = _hangs(g, "dep", clock)
    with deadline(1.0, clock=clock), pytest.raises(DeadlineExceeded):
        await slow()
    assert g.breaker("dep").metrics().calls == 0


async def test_a_stage_timeout_is_retried_as_a_timeout() -> None:
    clock = FakeClock()
    retry = RetryPolicy(attempts=3, retry_on=("timeout",), jitter_s=0.0, initial_backoff_s=0.5)
    g = Guard(
        Policy(stages={"dep": StagePolicy(
            timeout_s=1.0, retry=retry, breaker=BreakerPolicy(kind="none"), idempotent=True,
        )}),
        clock=clock,
    )
    attempts = 0

    @g.guard("dep")
    async def flaky() -> str:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            await clock.sleep(60)
        return "ok"

    assert await flaky() == "ok"
    assert attempts == 3
    # each hung attempt ends at its 1 s timeout, then a backoff (0.5 s, then 1 s): the discrete-event
    # clock reaches each timer before the 60 s sleep it cuts short
    assert clock() == pytest.approx(1.0 + 0.5 + 1.0 + 1.0)

    never = Guard(
        Policy(
            stages={
                "dep": StagePolicy(
                    timeout_s=1.0,
                    retry=RetryPolicy(attempts=3, retry_on=("connection",)),
                    breaker=BreakerPolicy(kind="none"),
                )
            }
        ),
        clock=clock,
    )
    attempts = 0
    with pytest.raises(StageTimeout):
        await never.guard("dep")(flaky.__wrapped__)()  # type: ignore[attr-defined]
    assert attempts == 1  # "timeout" not in retry_on


@pytest.mark.parametrize(
    "cls",
    [
        ragguard.EmbeddingTimeoutBreaker,
        ragguard.VectorStoreUnavailableBreaker,
        ragguard.RerankOOMBreaker,
        ragguard.CircuitBreaker,
    ],
)
def test_a_typed_breaker_built_by_hand_counts_a_stage_timeout_too(cls: type[ragguard.CircuitBreaker]) -> None:
    breaker = cls("given")  # as passed to @guard(..., breaker=...): no policy wraps its classifier
    assert breaker.classifier(StageTimeout("given", 1.0))
    if cls is not ragguard.CircuitBreaker:  # the generic one counts everything; the layer releases
        assert not breaker.classifier(DeadlineExceeded("given", 1.0))  # a spent deadline itself


async def test_a_hung_dependency_trips_a_breaker_given_to_the_decorator() -> None:
    clock = FakeClock()
    g = Guard(Policy(stages={"vector_store": StagePolicy(timeout_s=1.0)}), clock=clock)
    given = ragguard.VectorStoreUnavailableBreaker("vs", minimum_calls=2, window_size=2, clock=clock)

    @g.guard("vector_store", breaker=given)
    async def search(q: str) -> list[str]:
        await clock.sleep(60)
        return []

    with pytest.raises(StageTimeout):
        await search("q")  # two attempts (the standard stage retries a timeout once), both timed out
    assert given.state.value == "open"
    with pytest.raises(ragguard.VectorStoreUnavailable):
        await search("q")
