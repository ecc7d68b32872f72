"""docs/outcomes.md, the table of what each layer and front door does with each outcome: one test
per row, each column asserted through the Guard's own layers (breakers, retry, fallback,
throttle) and the two doors' mappings."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest

from ragguard import (
    BreakerOpen,
    BreakerPolicy,
    DeadlineExceeded,
    FakeClock,
    Guard,
    InvalidInput,
    Overloaded,
    Policy,
    QuotaExceeded,
    RetryPolicy,
    StagePolicy,
    StageTimeout,
    ThrottlePolicy,
)
from ragguard.asgi import PermissionDenied, Unauthenticated
from ragguard.asgi._status import http_status_for
from ragguard.breakers import (
    CircuitBreaker,
    EmbeddingTimeoutBreaker,
    RerankOOMBreaker,
    VectorStoreUnavailableBreaker,
    classify_outcome,
)
from ragguard.breakers._outcome import outcome_name
from ragguard.grpc._status import status_for
from ragguard.layers._throttle import throttle_for
from ragguard.outcomes import Kind, classify

pytestmark = pytest.mark.anyio


def _status_error(status: int, headers: dict[str, str] | None = None) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://10.0.0.7:8080/v1/embeddings")
    response = httpx.Response(status, headers=headers or {}, request=request)
    return httpx.HTTPStatusError(f"{status} from {request.url}", request=request, response=response)


@dataclass(frozen=True)
class Row:
    kind: Kind
    typed: bool  # every typed breaker counts it
    generic: bool  # the generic breaker counts it
    retried: bool
    fallback: bool
    throttle: str  # accepted / rejected / forgotten
    http: int | None
    grpc: grpc.StatusCode | None
    rejected: bool = False  # every breaker counts it as a rejection (its rejection rate)


ROWS: dict[str, tuple[Any, Row]] = {
    "failure: refused": (
        lambda: ConnectionRefusedError("refused"),
        Row(Kind.FAILURE, True, True, True, True, "accepted", 502, grpc.StatusCode.UNAVAILABLE),
    ),
    "failure: 5xx": (
        lambda: _status_error(500),
        Row(Kind.FAILURE, True, True, True, True, "accepted", 502, grpc.StatusCode.UNAVAILABLE),
    ),
    "failure: out of memory": (
        lambda: MemoryError(),
        Row(Kind.FAILURE, True, True, True, True, "accepted", 503, grpc.StatusCode.UNAVAILABLE),
    ),
    "rejection: 429": (
        lambda: _status_error(429, {"retry-after-ms": "20"}),
        Row(Kind.REJECTION, False, False, True, True, "rejected", 503, grpc.StatusCode.UNAVAILABLE),
    ),
    "rejection: 503 stating a wait": (
        lambda: _status_error(503, {"retry-after": "1"}),
        Row(
            Kind.REJECTION, False, False, True, True, "rejected", 503, grpc.StatusCode.UNAVAILABLE,
            rejected=True,
        ),
    ),
    "timeout": (
        lambda: StageTimeout("s", 1.0),
        Row(Kind.TIMEOUT, True, True, True, True, "accepted", 504, grpc.StatusCode.DEADLINE_EXCEEDED),
    ),
    "caller error: a dependency's 400": (
        lambda: _status_error(400),
        Row(Kind.CALLER_ERROR, False, False, False, False, "accepted", 400, grpc.StatusCode.INVALID_ARGUMENT),
    ),
    "caller error: a dependency's 401": (
        lambda: _status_error(401),
        Row(
            Kind.CALLER_ERROR,
            False,
            False,
            False,
            False,
            "accepted",
            502,
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
    ),
    "caller error: InvalidInput": (
        lambda: InvalidInput("bad"),
        Row(Kind.CALLER_ERROR, False, False, False, False, "accepted", 400, grpc.StatusCode.INVALID_ARGUMENT),
    ),
    "caller error: Unauthenticated": (
        lambda: Unauthenticated("token expired"),
        Row(Kind.CALLER_ERROR, False, False, False, False, "accepted", 401, grpc.StatusCode.UNAUTHENTICATED),
    ),
    "caller error: PermissionDenied": (
        lambda: PermissionDenied("not this tenant"),
        Row(
            Kind.CALLER_ERROR, False, False, False, False, "accepted", 403, grpc.StatusCode.PERMISSION_DENIED
        ),
    ),
    "caller error: a plain ValueError": (
        lambda: ValueError("bad"),
        Row(Kind.CALLER_ERROR, False, False, False, False, "accepted", None, None),
    ),
    "refused: breaker": (
        lambda: BreakerOpen("inner", 2.0),
        Row(Kind.REFUSED, False, False, False, True, "forgotten", 503, grpc.StatusCode.UNAVAILABLE),
    ),
    "refused: shed": (
        lambda: Overloaded("s", 0.5, "limit"),
        Row(Kind.REFUSED, False, False, False, True, "forgotten", 503, grpc.StatusCode.UNAVAILABLE),
    ),
    "refused: quota": (
        lambda: QuotaExceeded("acme", 1.0, "rate"),
        Row(Kind.REFUSED, False, False, False, False, "rejected", 429, grpc.StatusCode.RESOURCE_EXHAUSTED),
    ),
    "deadline": (
        lambda: DeadlineExceeded("s", 1.0),
        Row(Kind.DEADLINE, False, False, False, True, "forgotten", 504, grpc.StatusCode.DEADLINE_EXCEEDED),
    ),
    "unknown": (
        lambda: KeyError("a bug"),
        Row(Kind.UNKNOWN, False, True, False, True, "accepted", None, None),
    ),
}


def _guard(**stage: Any) -> Guard:
    return Guard(Policy(stages={"s": StagePolicy(**stage)}), clock=FakeClock())


@pytest.mark.parametrize("name", list(ROWS))
async def test_a_row_of_the_outcome_table(name: str) -> None:
    make, row = ROWS[name]
    assert classify(make()).kind is row.kind
    # breakers
    for typed in (EmbeddingTimeoutBreaker(), VectorStoreUnavailableBreaker(), RerankOOMBreaker()):
        assert typed.classifier(make()) is row.typed, typed
    assert CircuitBreaker("generic").classifier(make()) is row.generic
    for breaker in (EmbeddingTimeoutBreaker(), VectorStoreUnavailableBreaker(), RerankOOMBreaker(),
                    CircuitBreaker("generic")):
        assert (outcome_name(classify_outcome(breaker.config, make(), 0.0)) == "rejection") is row.rejected
    # retry (an idempotent stage retrying every dependency kind)
    retry = RetryPolicy(
        attempts=2, retry_on=("connection", "timeout", "out_of_memory", "rejection"), jitter_s=0.0
    )
    g = _guard(retry=retry, breaker=BreakerPolicy(kind="none"), idempotent=True)
    calls = 0

    @g.guard("s")
    async def failing() -> None:
        nonlocal calls
        calls += 1
        raise make()

    with pytest.raises(Exception):  # noqa: B017 - the error of the row
        await failing()
    assert calls == (2 if row.retried else 1)
    # fallback
    g = _guard(breaker=BreakerPolicy(kind="generic"))

    @g.guard("s", fallback=lambda: "fallback")
    async def served() -> str:
        raise make()

    if row.fallback:
        assert await served() == "fallback"
    else:
        with pytest.raises(Exception):  # noqa: B017
            await served()
    # throttle
    g = _guard(throttle=ThrottlePolicy(), breaker=BreakerPolicy(kind="none"))

    @g.guard("s")
    async def throttled() -> None:
        raise make()

    with pytest.raises(Exception):  # noqa: B017
        await throttled()
    throttle = throttle_for(g.stage("s"))
    seen = {(1, 1): "accepted", (1, 0): "rejected", (0, 0): "forgotten"}[
        (throttle.requests, throttle.accepts)
    ]
    assert seen == row.throttle
    # the front doors
    mapped = http_status_for(make())
    assert (None if mapped is None else mapped[0]) == row.http
    status = status_for(make())
    assert (None if status is None else status[0]) == row.grpc
    if mapped is not None:
        assert "10.0.0.7" not in str(mapped[2]) and "8080" not in str(mapped[2])


async def test_the_cancelled_row() -> None:
    assert classify(asyncio.CancelledError()).kind is Kind.CANCELLED
    for breaker in (CircuitBreaker("generic"), VectorStoreUnavailableBreaker()):
        assert not breaker.classifier(asyncio.CancelledError())
    g = _guard(
        retry=RetryPolicy(attempts=3, retry_on=("connection", "timeout")),
        breaker=BreakerPolicy(kind="generic", minimum_calls=1, window_size=1),
        throttle=ThrottlePolicy(),
        idempotent=True,
    )
    calls = 0

    @g.guard("s", fallback=lambda: "fallback")
    async def cancelled() -> None:
        nonlocal calls
        calls += 1
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await cancelled()
    assert calls == 1 and g.breaker("s").metrics().calls == 0
    throttle = throttle_for(g.stage("s"))
    assert (throttle.requests, throttle.accepts) == (1, 1)
    assert http_status_for(asyncio.CancelledError()) is None and status_for(asyncio.CancelledError()) is None


def test_the_success_row() -> None:
    outcome = classify(None)
    assert outcome.kind is Kind.SUCCESS and not outcome.counts_as_outage


async def test_a_non_idempotent_stage_retries_only_what_never_left() -> None:
    retry = RetryPolicy(attempts=2, retry_on=("connection", "timeout"), jitter_s=0.0)
    g = _guard(retry=retry, breaker=BreakerPolicy(kind="none"))  # no preset: not idempotent
    assert not g.policy.stage("s").is_idempotent
    for make, retried in (
        (lambda: ConnectionRefusedError(), True),
        (lambda: ConnectionResetError(), False),
        (lambda: StageTimeout("s", 1.0), False),
    ):
        calls = 0

        @g.guard("s")
        async def act(make: Any = make) -> None:
            nonlocal calls
            calls += 1
            raise make()

        with pytest.raises(OSError):  # (a StageTimeout is a TimeoutError, an OSError)
            await act()
        assert calls == (2 if retried else 1)
