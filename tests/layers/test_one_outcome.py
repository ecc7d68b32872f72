"""One outcome per failed attempt (issue 30): a Guard built with a classifier of its own gets layers
that all read its answer about a call, and the error is classified once per attempt, however many
layers read it.

The errors below are the user's own classes. ragguard's process-wide classifier reads each as
something else than the Guard's classifier does (a ``ValueError`` is the caller's error, a
``ConnectionError`` the dependency's failure), so a layer that asked the process-wide classifier
instead of reading the chain's answer would act differently, and each test would fail.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from ragguard import (
    AdaptivePolicy,
    BreakerOpen,
    BreakerPolicy,
    FakeClock,
    GenerationPolicy,
    Guard,
    HedgePolicy,
    Overloaded,
    Policy,
    RetryPolicy,
    StagePolicy,
    TenantQuota,
    ThrottlePolicy,
    degraded,
)
from ragguard.outcomes import CONTEXT_LENGTH, Kind, Outcome, classify, outcome_of, register_classifier
from ragguard.outcomes._classify import OutcomeClassifier

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


class Busy(ValueError):
    """The Guard's classifier: the dependency failed. Process-wide: the caller's error."""


class Crowded(ValueError):
    """The Guard's: the dependency rejected the call, asking for 2 s. Process-wide: the caller's."""


class Starved(ValueError):
    """The Guard's: the dependency ran out of memory. Process-wide: the caller's."""


class TooLong(ValueError):
    """The Guard's: a context-length refusal. Process-wide: the caller's error (input)."""


class Refused(ConnectionError):
    """The Guard's: the caller's bad request. Process-wide: the dependency's failure."""


OUTCOMES: dict[type[BaseException], Outcome] = {
    Busy: Outcome.of(Kind.FAILURE, reason="connection"),
    Crowded: Outcome.of(Kind.REJECTION, retry_after_s=2.0, reason="status", status=429),
    Starved: Outcome.of(Kind.FAILURE, reason="out_of_memory"),
    TooLong: Outcome.of(Kind.CALLER_ERROR, reached=False, reason=CONTEXT_LENGTH),
    Refused: Outcome.of(Kind.CALLER_ERROR, reached=False, reason="request", status=400),
}


class Counting:
    """The Guard's classifier: the outcomes above for those classes (None for anything else),
    counting how often it is asked about each class."""

    def __init__(self) -> None:
        self.asked: dict[str, int] = {}

    def __call__(self, exc: BaseException) -> Outcome | None:
        name = type(exc).__name__
        self.asked[name] = self.asked.get(name, 0) + 1
        return OUTCOMES.get(type(exc))


def test_the_process_wide_classifier_reads_each_error_otherwise() -> None:
    """The premise of every test below."""
    for cls in (Busy, Crowded, Starved, TooLong):
        assert classify(cls("x")).kind is Kind.CALLER_ERROR and classify(cls("x")).reason == "input"
    assert classify(Refused("x")).kind is Kind.FAILURE


def _guard(classifier: OutcomeClassifier | None = None, **stage: Any) -> tuple[Guard, FakeClock]:
    clock = FakeClock()
    options: dict[str, Any] = {"breaker": BreakerPolicy(kind="none"), "timeout_s": 5.0, "idempotent": True}
    options |= stage
    policy = Policy(stages={"s": StagePolicy(**options)})
    return Guard(policy, clock=clock, rng=random.Random(7), classifier=classifier), clock


def _failing(*errors: BaseException, then: Any = "ok") -> tuple[list[int], Any]:
    calls = [0]
    queue = list(errors)

    async def call(x: int = 1) -> Any:
        calls[0] += 1
        if queue:
            raise queue.pop(0)
        return then

    return calls, call


def _no_retry_waits() -> RetryPolicy:
    return RetryPolicy(attempts=3, initial_backoff_s=0.0, jitter_s=0.0, budget_min_per_s=100.0)


async def test_the_retry_layer_retries_what_the_guards_classifier_calls_a_failure() -> None:
    g, _ = _guard(Counting(), retry=_no_retry_waits())
    calls, fn = _failing(Busy("down"), Busy("down"))
    assert await g.guard("s")(fn)() == "ok"
    assert calls == [3]
    calls, fn = _failing(Refused("bad request"))
    with pytest.raises(Refused):
        await g.guard("s")(fn)()
    assert calls == [1]  # the caller's error, for this Guard: never retried


async def test_the_retry_waits_the_wait_the_guards_classifier_read() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    retry = RetryPolicy(attempts=2, initial_backoff_s=0.01, jitter_s=0.0, retry_on=("rejection",))
    stage = StagePolicy(breaker=BreakerPolicy(kind="none"), idempotent=True, retry=retry)
    policy = Policy(stages={"s": stage})
    g = Guard(policy, clock=FakeClock(), sleep=sleep, classifier=Counting())
    calls, fn = _failing(Crowded("slow down"))
    assert await g.guard("s")(fn)() == "ok"
    assert calls == [2] and slept == [2.0]  # the stated wait, not the 0.01 s backoff


async def test_the_breaker_counts_what_the_guards_classifier_calls_an_outage() -> None:
    trips = BreakerPolicy(kind="vector_store_unavailable", minimum_calls=2, window_size=2)
    g, _ = _guard(Counting(), breaker=trips)
    for _ in range(2):
        with pytest.raises(Refused):  # the caller's, for this Guard: not counted
            await g.guard("s")(_failing(Refused("bad"))[1])()
    assert g.stage("s").breaker.state.value == "closed"  # type: ignore[union-attr]
    for _ in range(2):
        with pytest.raises(Busy):
            await g.guard("s")(_failing(Busy("down"))[1])()
    with pytest.raises(BreakerOpen):
        await g.guard("s")(_failing()[1])()


async def test_the_fallback_serves_what_the_guards_classifier_calls_a_failure() -> None:
    g, _ = _guard(Counting())

    async def keywords(x: int = 1) -> str:
        return "keywords"

    assert await g.guard("s", fallback=keywords)(_failing(Busy("down"))[1])() == "keywords"
    assert degraded() == ("keywords",)
    with pytest.raises(Refused):  # the caller's, for this Guard: passed on as it is
        await g.guard("s", fallback=keywords)(_failing(Refused("bad"))[1])()


async def test_the_throttle_counts_what_the_guards_classifier_calls_a_rejection() -> None:
    g, _ = _guard(Counting(), throttle=ThrottlePolicy(k=1.0, window_s=60.0, max_reject=0.9))
    for _ in range(3):
        with pytest.raises(Refused):  # accepted by the dependency: no throttling
            await g.guard("s")(_failing(Refused("bad"))[1])()
    throttle = g.stage("s").parts()["throttle"]
    assert throttle.probability() == 0.0
    for _ in range(6):
        with pytest.raises((Crowded, Overloaded)):
            await g.guard("s")(_failing(Crowded("slow down"))[1])()
    assert throttle.probability() > 0.0


async def test_the_adaptive_limit_backs_off_on_what_the_guards_classifier_calls_out_of_memory() -> None:
    g, clock = _guard(Counting(), adaptive=AdaptivePolicy(min_limit=1, initial_limit=20, backoff=0.5))
    with pytest.raises(Busy):  # a failure, not out of memory: the limit stays
        await g.guard("s")(_failing(Busy("down"))[1])()
    limiter = g.stage("s").parts()["limiter"]
    assert limiter.pressed == {}
    clock.advance(1.0)
    with pytest.raises(Starved):
        await g.guard("s")(_failing(Starved("CUDA"))[1])()
    assert limiter.pressed == {"out_of_memory": 1}  # the out_of_memory signal (the limit backs off)


async def test_the_shrink_drops_passages_after_what_the_guards_classifier_calls_too_long() -> None:
    generation = GenerationPolicy(first_item_s=None, idle_s=None, total_s=None, max_shrinks=1)
    stage = StagePolicy(preset="generation", breaker=BreakerPolicy(kind="none"), generation=generation)
    policy = Policy(stages={"generation": stage})
    g = Guard(policy, clock=FakeClock(), classifier=Counting())
    sent: list[int] = []

    @g.guard("generation", passages="passages")
    async def answer(question: str, passages: list[str]) -> str:
        sent.append(len(passages))
        if len(passages) > 6:
            raise TooLong("too many tokens")
        return "answered"

    assert await answer("why?", [f"p{i}" for i in range(9)]) == "answered"
    assert sent == [9, 6]


@pytest.fixture
def counted_everywhere() -> Iterator[Counting]:
    """The same counting classifier registered process-wide (ragguard's own classifier asks it),
    for a Guard with no classifier of its own: what the layers, breakers and doors used to ask."""
    counting = Counting()
    remove = register_classifier(counting)
    try:
        yield counting
    finally:
        remove()


def _full_stack(classifier: OutcomeClassifier | None) -> Guard:
    never_opens = BreakerPolicy(kind="generic", minimum_calls=1000, window_size=1000)
    stage = StagePolicy(
        timeout_s=5.0, retry=_no_retry_waits(), breaker=never_opens, idempotent=True,
        hedge=HedgePolicy(min_samples=50), throttle=ThrottlePolicy(), adaptive=AdaptivePolicy(),
    )  # fmt: skip
    policy = Policy(stages={"s": stage}, default_quota=TenantQuota(max_concurrency=8))
    return Guard(policy, clock=FakeClock(), rng=random.Random(3), classifier=classifier)


@pytest.mark.parametrize("whose", ["the guard's", "process-wide"])
async def test_a_failed_attempt_is_classified_once_through_the_full_stack(
    whose: str, counted_everywhere: Counting
) -> None:
    """Fallback, deadline, quota, retry, hedge, throttle, adaptive limit, breaker and timeout: three
    failed attempts, three classifications (on main, 4-5 per attempt: each layer and each breaker
    asked again)."""
    own = Counting() if whose == "the guard's" else None
    g = _full_stack(own)
    counting = own if own is not None else counted_everywhere
    layers = [type(layer).__name__ for layer in g.stage("s").chain(_bound(g)).layers]
    assert {"FallbackLayer", "QuotaLayer", "RetryLayer", "HedgeLayer", "ThrottleLayer", "AdaptiveLayer",
            "BreakerLayer", "TimeoutLayer"} <= set(layers)  # fmt: skip

    async def keywords(x: int = 1) -> str:
        return "keywords"

    calls, fn = _failing(Busy("down"), Busy("down"), Busy("down"))
    assert await g.guard("s", fallback=keywords)(fn)() == "keywords"
    assert calls == [3] and counting.asked == {"Busy": 3}
    breaker = g.stage("s").breaker
    assert breaker is not None and breaker.metrics().failed_calls == 3  # type: ignore[attr-defined]


async def test_every_reader_of_an_escaped_error_agrees_with_the_chain() -> None:
    """What the chain recorded on the error is what the breakers' classifiers, the stated wait and
    the front doors read (they see only the error), not the process-wide answer."""
    from ragguard.asgi._status import http_status_for
    from ragguard.breakers import counts_outages
    from ragguard.grpc._status import status_for
    from ragguard.layers._retry import retry_after_of

    g, _ = _guard(Counting())
    with pytest.raises(Crowded) as raised:
        await g.guard("s")(_failing(Crowded("slow down"))[1])()
    error = raised.value
    assert outcome_of(error) == OUTCOMES[Crowded] and classify(error).kind is Kind.CALLER_ERROR
    assert retry_after_of(error) == 2.0 and not counts_outages(error)
    http = http_status_for(error)
    assert http is not None and http[0] == 503 and (b"retry-after", b"2") in http[1]
    grpc_status = status_for(error)
    assert grpc_status is not None and grpc_status[0].name == "UNAVAILABLE"


def _bound(g: Guard) -> Any:
    from ragguard.layers import Bound

    return Bound("s", _failing()[1], stream=False, fallbacks=(lambda: None,))
