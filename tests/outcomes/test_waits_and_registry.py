"""Stated waits parsed and clamped (no value can raise), the registration of a user's classifier,
LiteLLM's exception names, and the policy rules about idempotency."""

from __future__ import annotations

import email.utils
import math

import httpx2
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ragguard
from ragguard import ConfigError, HedgePolicy, Policy, StagePolicy
from ragguard._http import (
    format_retry_after,
    format_retry_after_ms,
    parse_reset,
    parse_retry_after,
    parse_retry_after_ms,
    stated_wait,
)
from ragguard.grpc._status import parse_pushback_ms, retry_after_of, retry_trailers
from ragguard.grpc._status import parse_retry_after as grpc_parse_retry_after
from ragguard.outcomes import MAX_STATED_WAIT_S, Kind, Outcome, classify, register_classifier

NOW = 1_700_000_000.0


def test_retry_after_in_seconds_milliseconds_dates_and_resets() -> None:
    assert stated_wait({"retry-after": "3"}) == 3.0
    assert stated_wait({"Retry-After": "2", "retry-after-ms": "1500"}) == 1.5
    date = email.utils.formatdate(NOW + 7, usegmt=True)
    assert parse_retry_after(date, now=NOW) == pytest.approx(7.0, abs=1.0)
    assert parse_retry_after(email.utils.formatdate(NOW - 60, usegmt=True), now=NOW) == 0.0
    assert parse_reset("6m0s") == 360.0 and parse_reset("1h2m3.5s") == 3723.5
    assert parse_reset("20ms") == 0.02 and parse_reset("1s") == 1.0 and parse_reset("0.5") == 0.5
    assert parse_reset("soon") is None and parse_reset("") is None
    both = {"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-reset-tokens": "20ms"}
    assert stated_wait(both) == 360.0  # neither says it is spent: the later one
    spent = {**both, "x-ratelimit-remaining-tokens": "0", "x-ratelimit-remaining-requests": "12"}
    assert stated_wait(spent) == 0.02  # the limit that is spent
    assert stated_wait([(b"retry-after-ms", b"250")]) == 0.25
    assert stated_wait({}) is None and stated_wait(None) is None


def test_extreme_waits_are_clamped_everywhere() -> None:
    day = MAX_STATED_WAIT_S
    assert parse_retry_after("9999999999") == day
    assert parse_retry_after_ms("9" * 40) == day
    assert parse_retry_after(email.utils.formatdate(NOW + 50 * 365 * 86400, usegmt=True), now=NOW) == day
    assert grpc_parse_retry_after("1e308") == day and grpc_parse_retry_after("inf") == day
    assert grpc_parse_retry_after("nan") is None and grpc_parse_retry_after("-1") is None
    assert parse_pushback_ms("9" * 400) == day and parse_pushback_ms("-5") is None
    assert retry_after_of((("retry-after", "1e308"),)) == day
    assert format_retry_after(1e308) == "86400" and format_retry_after_ms(math.inf) == "86400000"
    assert retry_trailers(1e308) == (("retry-after", "86400.000"), ("grpc-retry-pushback-ms", "86400000"))
    assert Outcome.of(Kind.REJECTION, retry_after_s=10**400).retry_after_s == day


@given(st.one_of(st.text(max_size=80), st.binary(max_size=80), st.floats(), st.integers(), st.none()))
def test_no_value_raises(value: object) -> None:
    for parse in (
        parse_retry_after,
        parse_retry_after_ms,
        parse_reset,
        grpc_parse_retry_after,
        parse_pushback_ms,
    ):
        wait = parse(value)  # type: ignore[operator]
        assert wait is None or 0.0 <= wait <= MAX_STATED_WAIT_S
    wait = stated_wait({"retry-after": value, "retry-after-ms": value, "x-ratelimit-reset-tokens": value})
    assert wait is None or 0.0 <= wait <= MAX_STATED_WAIT_S
    if isinstance(value, float):
        assert format_retry_after(value) and format_retry_after_ms(value)
        retry_trailers(value)


def test_a_users_classifier_is_asked_first_and_can_be_removed() -> None:
    class Throttled(Exception):
        pass

    def mine(exc: BaseException) -> Outcome | None:
        return Outcome.of(Kind.REJECTION, retry_after_s=2.0) if isinstance(exc, Throttled) else None

    assert classify(Throttled()).kind is Kind.UNKNOWN
    remove = ragguard.register_classifier(mine)
    try:
        assert classify(Throttled()) == Outcome(Kind.REJECTION, retry_after_s=2.0)
        assert classify(ConnectionRefusedError()).kind is Kind.FAILURE  # others are untouched
    finally:
        remove()
    assert classify(Throttled()).kind is Kind.UNKNOWN
    with pytest.raises(ConfigError):
        register_classifier("not a function")  # type: ignore[arg-type]


def test_a_classifier_that_raises_is_skipped() -> None:
    def broken(exc: BaseException) -> Outcome | None:
        raise RuntimeError("classifier bug")

    remove = register_classifier(broken)
    try:
        assert classify(ConnectionRefusedError()).kind is Kind.FAILURE
    finally:
        remove()


def _litellm(name: str, base: type[BaseException]) -> type[BaseException]:
    """A class shaped as LiteLLM's of that name (litellm itself is never installed: its names and
    bases are read from its source, ``litellm/exceptions.py``)."""
    return type(name, (base,), {"__module__": "litellm.exceptions"})


def test_litellm_exception_names() -> None:
    request = httpx2.Request("POST", "https://api.example/v1/chat/completions")

    def response(status: int, **headers: str) -> httpx2.Response:
        return httpx2.Response(status, headers=headers, request=request)

    context = _litellm("ContextWindowExceededError", openai.BadRequestError)
    assert classify(context("too long", response=response(400), body=None)).kind is Kind.CALLER_ERROR
    limited = _litellm("RateLimitError", openai.RateLimitError)
    err = limited("slow down", response=response(429, **{"retry-after": "5"}), body=None)
    assert classify(err) == Outcome(Kind.REJECTION, retry_after_s=5.0, reason="status", status=429)
    unavailable = _litellm("ServiceUnavailableError", openai.APIStatusError)
    assert classify(unavailable("down", response=response(503), body=None)).kind is Kind.FAILURE
    timeout = _litellm("Timeout", openai.APITimeoutError)
    assert classify(timeout(request=request)).kind is Kind.TIMEOUT
    budget = _litellm("BudgetExceededError", Exception)
    assert classify(budget("over budget")).kind is Kind.CALLER_ERROR
    midstream = _litellm("MidStreamFallbackError", unavailable)
    inner = _litellm("RateLimitError", openai.RateLimitError)("limited", response=response(429), body=None)
    err = midstream("cut", response=response(503), body=None)
    err.original_exception = inner  # type: ignore[attr-defined]
    assert classify(err).kind is Kind.REJECTION


def test_idempotency_is_declared_and_hedging_needs_it() -> None:
    policy = Policy()
    for name in ("embedding", "vector_store", "rerank", "generation"):
        assert policy.stage(name).is_idempotent
    assert not policy.stage("my_tool_call").is_idempotent  # no preset: not assumed
    with pytest.raises(ConfigError) as info:
        StagePolicy(idempotent=False, hedge=HedgePolicy())
    assert info.value.field == "hedge"
    with pytest.raises(ConfigError) as info:
        Policy(stages={"search": StagePolicy(hedge=HedgePolicy())})
    assert info.value.field == "stages.search.hedge"
    assert Policy(stages={"vector_store": StagePolicy(hedge=HedgePolicy())}).stage("vector_store").hedge
    assert Policy(stages={"search": StagePolicy(idempotent=True, hedge=HedgePolicy())}).stage("search").hedge
