"""Failure classifiers: which errors a breaker counts against its dependency.

A classifier takes the exception a call raised and returns True when it says something about
the dependency's health (count it), False when it does not. Every one here is a question about
:func:`ragguard.outcomes.outcome_of`: the outcome the guarded call's chain recorded on the error
(its Guard's classification, the one its layers read), else :func:`ragguard.outcomes.classify`'s,
so a breaker and the retry, fallback and throttle layers can never disagree about a call:

- :func:`counts_outages` (every typed breaker): dependency failures (refused, reset, 5xx,
  ``UNAVAILABLE``, out of memory) and timeouts (the stage's own ``timeout_s`` included);
- :func:`counts_by_default` (a plain :class:`CircuitBreaker`, the ``generic`` kind): those, and
  errors no classifier recognises;
- :func:`counts_overloads` (every kind, for its ``rejection_rate_threshold``): a dependency's
  rejection that is not a rate limit (a 503 stating a wait, 529, an overload event inside a
  stream): counted apart from the failures, as rejections; a rate that persists opens the breaker;
- never counted: the caller's errors (4xx, bad input, auth, context length), a rate limit (429,
  ``RESOURCE_EXHAUSTED``: the throttle's business), ragguard's own refusals, the request's spent
  deadline, and cancellation.
"""

from __future__ import annotations

from collections.abc import Callable

from ..outcomes import Kind, outcome_of

__all__ = [
    "counts_by_default",
    "counts_outages",
    "counts_overloads",
    "is_connection_error",
    "is_out_of_memory",
    "is_timeout",
]

_OUTAGE = frozenset({Kind.FAILURE, Kind.TIMEOUT})
_GENERIC = frozenset({Kind.FAILURE, Kind.TIMEOUT, Kind.UNKNOWN})


def is_timeout(exc: BaseException) -> bool:
    """True when ``exc`` says the dependency ran out of time (``Kind.TIMEOUT``): builtin
    :class:`TimeoutError` (asyncio's, ``socket.timeout``, anyio's ``fail_after``), a
    :class:`ragguard.StageTimeout`, trio's ``TooSlowError``, redis, httpx and aiohttp timeouts,
    HTTP 408/504, gRPC ``DEADLINE_EXCEEDED``, the SDKs' ``APITimeoutError``. Never a
    :class:`ragguard.DeadlineExceeded` (the caller's budget), whatever it was raised from."""
    return outcome_of(exc).kind is Kind.TIMEOUT


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` says the dependency failed (``Kind.FAILURE``, out of memory aside): it
    could not be reached (refused, unreachable, name resolution, a connection pool exhausted), it
    dropped the connection (reset, broken pipe), or it answered 5xx or gRPC ``UNAVAILABLE``."""
    outcome = outcome_of(exc)
    return outcome.kind is Kind.FAILURE and outcome.reason != "out_of_memory"


def is_out_of_memory(exc: BaseException) -> bool:
    """True when ``exc`` says the call ran out of (host or accelerator) memory:
    :class:`MemoryError`, ``OSError(ENOMEM)``, torch's ``OutOfMemoryError``, tensorflow's
    ``ResourceExhaustedError``, a ``RuntimeError`` (or an error of torch, onnxruntime, tensorflow,
    jax) saying "out of memory", "failed to allocate memory", ``CUBLAS_STATUS_ALLOC_FAILED`` or
    ``std::bad_alloc``, gRPC ``RESOURCE_EXHAUSTED`` about memory, redis ``OOM``."""
    return outcome_of(exc).out_of_memory


def counts_outages(exc: BaseException) -> bool:
    """The classifier of every typed breaker: a dependency failure or a timeout (see the module
    docstring). An embedding provider that is down opens its breaker as surely as a slow one."""
    return outcome_of(exc).kind in _OUTAGE


def counts_by_default(exc: BaseException) -> bool:
    """The classifier of a plain :class:`CircuitBreaker`: outages (:func:`counts_outages`) and
    errors no classifier recognises (most likely the dependency's client failing in its own
    way). Not counted: the caller's errors, the dependency's rejections, ragguard's refusals,
    the request's deadline (see the module docstring)."""
    return outcome_of(exc).kind in _GENERIC


_KINDS_OF: dict[Callable[[BaseException], bool], frozenset[Kind]] = {
    counts_outages: _OUTAGE,
    counts_by_default: _GENERIC,
}


def kinds_counted(classifier: Callable[[BaseException], bool]) -> frozenset[Kind] | None:
    """The outcome kinds ``classifier`` counts as failures when it is one of ragguard's own
    (:func:`counts_outages`, :func:`counts_by_default`), else None: a breaker reads them off the
    outcome the chain recorded, with no call of the classifier."""
    return _KINDS_OF.get(classifier)


def judge(
    classifier: Callable[[BaseException], bool], exc: BaseException, rejections: bool
) -> tuple[bool, bool]:
    """``(counted, rejected)`` for ``exc``: whether ``classifier`` counts it as a failure, else
    (with ``rejections``) whether :func:`counts_overloads` says the dependency turned the call
    away. For ragguard's own classifiers the outcome is read once (the one the chain recorded)."""
    kinds = _KINDS_OF.get(classifier)
    if kinds is None:
        if classifier(exc):
            return True, False
        return False, rejections and counts_overloads(exc)
    outcome = outcome_of(exc)
    if outcome.kind in kinds:
        return True, False
    return False, rejections and outcome.kind is Kind.REJECTION and outcome.status != 429


def counts_overloads(exc: BaseException) -> bool:
    """True for a dependency's rejection that is not a rate limit: a 503 (or gRPC
    ``UNAVAILABLE``) stating a wait, Anthropic's 529 ``overloaded_error``, an overload event inside
    a stream, every deployment of a router cooling down. The dependency says it cannot serve now
    and when to come back; a breaker counts these as rejections (its ``rejection_rate_threshold``),
    apart from its failures. A 429 (and ``RESOURCE_EXHAUSTED``, a rate-limit error type) says the
    caller is over its own limit: never counted, the throttle's business."""
    outcome = outcome_of(exc)
    return outcome.kind is Kind.REJECTION and outcome.status != 429
