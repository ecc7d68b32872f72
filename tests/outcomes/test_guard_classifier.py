"""A Guard's own classifier (``Guard(classifier=...)``, :func:`ragguard.outcomes.classify_with`) and
the outcome a chain records on an error (:func:`ragguard.outcomes.outcome_of`)."""

from __future__ import annotations

import logging
import pickle

import pytest

from ragguard import BreakerOpen, ConfigError, Guard, QuotaExceeded
from ragguard.outcomes import Kind, Outcome, classify, outcome_of, register_classifier
from ragguard.outcomes._classify import classify_with


class Throttled(Exception):
    """The user's own client error."""


def _mine(exc: BaseException) -> Outcome | None:
    if isinstance(exc, (Throttled, BreakerOpen)):
        return Outcome.of(Kind.REJECTION, retry_after_s=1.5)
    return None


def test_the_guards_classifier_comes_after_ragguards_own_errors_and_before_the_registered() -> None:
    remove = register_classifier(lambda exc: Outcome.of(Kind.FAILURE) if isinstance(exc, Throttled) else None)
    try:
        mine = classify_with(_mine)
        assert classify(Throttled()).kind is Kind.FAILURE  # the registered one, process-wide
        assert mine(Throttled()) == Outcome.of(Kind.REJECTION, retry_after_s=1.5)  # the Guard's first
        assert mine(BreakerOpen("s", 1.0)).kind is Kind.REFUSED  # ragguard's own: never asked
        assert mine(KeyError("x")) == classify(KeyError("x"))  # None: the next classifier decides
        assert mine(None).kind is Kind.SUCCESS
        cause = RuntimeError("wrapped")
        cause.__cause__ = Throttled()
        assert mine(cause).kind is Kind.REJECTION  # asked about what an error was raised from too
        quota = QuotaExceeded("acme", 3.0, "rate")
        assert mine(quota).retry_after_s == 3.0  # a wait the error carries
    finally:
        remove()


def test_a_guards_classifier_that_raises_is_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    def broken(exc: BaseException) -> Outcome | None:
        raise RuntimeError("classifier bug")

    with caplog.at_level(logging.ERROR, logger="ragguard.outcomes"):
        assert classify_with(broken)(ConnectionResetError()).kind is Kind.FAILURE
        assert classify_with(broken)(Throttled()).kind is Kind.UNKNOWN
    assert "classifier" in caplog.text


def test_a_classifier_that_is_not_callable_is_refused_naming_the_option() -> None:
    with pytest.raises(ConfigError) as refused:
        Guard(classifier="mine")  # type: ignore[arg-type]
    assert refused.value.field == "classifier"


@pytest.mark.anyio
async def test_an_error_keeps_its_outcome_when_pickled_whatever_classified_it() -> None:
    """The record on an error pickles without the classifier (a Guard's may be a closure)."""
    g = Guard(classifier=lambda exc: _mine(exc))

    @g.guard("s")
    async def call() -> None:
        raise Throttled("slow down")

    with pytest.raises(Throttled) as raised:
        await call()
    assert outcome_of(raised.value).kind is Kind.REJECTION and classify(raised.value).kind is Kind.UNKNOWN
    copy = pickle.loads(pickle.dumps(raised.value))
    assert outcome_of(copy) == Outcome.of(Kind.REJECTION, retry_after_s=1.5)


def test_an_error_no_chain_classified_is_classified_by_outcome_of() -> None:
    assert outcome_of(ConnectionRefusedError()) == classify(ConnectionRefusedError())
    assert outcome_of(None).kind is Kind.SUCCESS


@pytest.mark.anyio
async def test_a_guarded_call_further_out_reads_the_answer_of_the_first_the_error_left() -> None:
    """An error classified once keeps its outcome: the outer Guard's breaker counts what the inner
    Guard's classifier called a failure (ragguard's own calls a ValueError the caller's)."""
    from ragguard import BreakerOpen, BreakerPolicy, Policy, StagePolicy

    class Busy(ValueError):
        pass

    inner = Guard(classifier=lambda exc: Outcome.of(Kind.FAILURE) if isinstance(exc, Busy) else None)
    trips = BreakerPolicy(kind="vector_store_unavailable", minimum_calls=2, window_size=2)
    outer = Guard(Policy(stages={"search": StagePolicy(breaker=trips)}))

    @inner.guard("store")
    async def store() -> None:
        raise Busy("the store is busy")

    @outer.guard("search")
    async def search() -> None:
        await store()

    for _ in range(2):
        with pytest.raises(Busy):
            await search()
    with pytest.raises(BreakerOpen):
        await search()
