"""Outcomes read from an HTTP status and its headers: shared by every HTTP client's classifier."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .._http import stated_wait
from ._kinds import Kind, Outcome

__all__ = ["from_http_status", "from_overload_type", "stated_wait_of"]

_CALLER_REASONS = {
    400: "request", 413: "request", 414: "request", 422: "request", 431: "request",
    401: "auth", 402: "auth", 403: "auth", 407: "auth",
    404: "not_found", 410: "not_found",
    409: "conflict", 412: "conflict",
}


def from_http_status(status: object, headers: Any = None) -> Outcome | None:
    """The outcome of an HTTP response with ``status`` (None for a status below 400 or not a
    number), the wait from ``headers`` (:func:`ragguard._http.stated_wait`) attached.

    408, 504 and 524 are timeouts; 429 and 529 rejections, and so is a 503 that states a wait
    (RFC 9110: the server is overloaded or in maintenance and says when to come back, as a
    ragguard service's open breaker or shedding does); other 5xx failures; other 4xx the caller's
    errors (``reason`` ``request``, ``auth``, ``not_found``, ``conflict`` or ``status``). An
    ``x-should-retry: true|false`` header is the server's word on retrying (``Outcome.retry``)."""
    if isinstance(status, bool) or not isinstance(status, int) or status < 400:
        return None
    outcome = _of_status(status, headers)
    said = _should_retry(headers)
    return outcome if said is None else replace(outcome, retry=said)


def _should_retry(headers: Any) -> bool | None:
    """``x-should-retry`` (not a standard header; the OpenAI and Anthropic APIs send it): True or
    False for exactly ``true`` or ``false``, as their SDKs read it; None otherwise."""
    try:
        value = headers.get("x-should-retry") if headers is not None else None
    except Exception:  # headers of an unexpected shape: no word said
        return None
    return {"true": True, "false": False}.get(value) if isinstance(value, str) else None


def _of_status(status: int, headers: Any) -> Outcome:
    if status in (429, 503, 529):
        wait = stated_wait(headers)
        if status != 503 or wait is not None:
            return Outcome.of(Kind.REJECTION, retry_after_s=wait, reason="status", status=status)
    if status in (408, 504, 524):
        return Outcome.of(Kind.TIMEOUT, retry_after_s=stated_wait(headers), reason="status", status=status)
    if status >= 500:
        return Outcome.of(Kind.FAILURE, retry_after_s=stated_wait(headers), reason="status", status=status)
    return Outcome(Kind.CALLER_ERROR, reason=_CALLER_REASONS.get(status, "status"), status=status)


_OVERLOAD_TYPES = frozenset({"overloaded_error", "server_overloaded"})
_RATE_LIMIT_TYPES = frozenset({
    "rate_limit_error", "rate_limit_exceeded", "insufficient_quota_temporary", "too_many_requests",
    "requests_limit_exceeded", "tokens_limit_exceeded",
})
_FAILURE_TYPES = frozenset({"api_error", "server_error", "internal_server_error", "service_unavailable"})


def from_overload_type(kind: object, *, status: int = 0, headers: Any = None) -> Outcome | None:
    """The outcome an error ``type`` or ``code`` in a provider's error body names (the event a
    stream sends after HTTP 200: Anthropic's ``overloaded_error``, OpenAI's ``server_error``), or
    None when it names none of them."""
    if not isinstance(kind, str):
        return None
    name = kind.lower()
    if name in _RATE_LIMIT_TYPES or "rate_limit" in name:
        # the caller's own limit, whatever status carried it: read as a 429 (a breaker's
        # rejection rate never counts it; see ragguard.breakers.counts_overloads)
        return Outcome.of(Kind.REJECTION, retry_after_s=stated_wait(headers), reason="stream", status=429)
    if name in _OVERLOAD_TYPES or "overloaded" in name:
        return Outcome.of(Kind.REJECTION, retry_after_s=stated_wait(headers), reason="stream", status=status)
    if name in _FAILURE_TYPES:
        return Outcome.of(Kind.FAILURE, retry_after_s=stated_wait(headers), reason="stream", status=status)
    if name == "timeout" or name.endswith("_timeout"):
        return Outcome(Kind.TIMEOUT, reason="stream", status=status)
    return None


def stated_wait_of(exc: BaseException) -> float | None:
    """The wait an error's headers state: its ``headers`` (LiteLLM's), its response's, or its
    ``litellm_response_headers``; None when none states one."""
    for headers in (
        getattr(exc, "headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
        getattr(exc, "litellm_response_headers", None),
    ):
        if headers:
            wait = stated_wait(headers)
            if wait is not None:
                return wait
    return None
