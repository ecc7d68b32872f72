"""The OpenAI Python SDK (``openai``): its status errors with the headers of the response (the
waits of ``retry-after-ms``, ``retry-after`` and ``x-ratelimit-reset-*``), its connection and
timeout errors (whether the request left is read from the transport error they wrap), the
``error`` a stream sends after HTTP 200, and the refusals a stage may route (context length,
content policy: :mod:`._refusal`), OpenAI-compatible servers' (vLLM, TGI) included."""

from __future__ import annotations

from typing import Any

from ._classify import classify_cause
from ._kinds import CONTENT_POLICY, Kind, Outcome
from ._refusal import error_text, refined, refusal_reason
from ._status import from_http_status, from_overload_type

__all__ = ["classify", "sdk_outcome"]

_CALLER_CODES = frozenset({
    "context_length_exceeded", "string_above_max_length", "invalid_api_key", "model_not_found",
    "invalid_request_error", "unsupported_parameter", "invalid_value",
})
_BILLING_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached", "billing_not_active"})


def _names(exc: BaseException) -> list[str]:
    return [cls.__name__ for cls in type(exc).__mro__]


def sdk_outcome(exc: BaseException, *, body_type: object = None, body_code: object = None) -> Outcome | None:
    """What an OpenAI-shaped SDK error says (shared by the ``openai`` and ``anthropic`` classifiers:
    their trees have the same names): the status error's code and headers first, then what the
    error body's ``type``/``code`` names, then the connection and timeout errors; a caller's error
    with the reason its code or words give (``context_length``, ``content_policy``)."""
    found = _sdk_outcome(exc, body_type, body_code)
    return None if found is None else refined(found, exc, body_code, body_type)


def _sdk_outcome(exc: BaseException, body_type: object, body_code: object) -> Outcome | None:
    names = _names(exc)
    if isinstance(body_code, str) and body_code in _BILLING_CODES:
        return Outcome(Kind.CALLER_ERROR, reason="auth")  # no wait makes an unpaid account pay
    if isinstance(body_code, str) and body_code in _CALLER_CODES:
        return Outcome(Kind.CALLER_ERROR, reason="request")
    if "APITimeoutError" in names:
        cause = classify_cause(exc)
        reached = cause.reached if cause is not None else True
        return Outcome(Kind.TIMEOUT, reached=reached, reason="timeout")
    if "APIConnectionError" in names:
        cause = classify_cause(exc)
        if cause is not None and cause.kind in (Kind.TIMEOUT, Kind.FAILURE):
            return cause
        return Outcome(Kind.FAILURE, reason="connection")
    response = getattr(exc, "response", None)
    status = getattr(exc, "status_code", None)
    headers = getattr(response, "headers", None)
    code = status if isinstance(status, int) else 0
    by_type = from_overload_type(body_type, status=code, headers=headers)
    if by_type is None:
        by_type = from_overload_type(body_code, status=code, headers=headers)
    if "APIStatusError" in names:
        by_status = from_http_status(status, headers)
        if by_status is not None:
            # a 4xx whose body names an overload (Anthropic's 529 is one; some gateways send 400)
            if by_type is not None and by_status.kind is Kind.CALLER_ERROR:
                return by_type
            return by_status
        if by_type is not None:
            return by_type  # an error event inside a stream answered 200
        return Outcome(Kind.FAILURE, reason="stream")
    if "APIResponseValidationError" in names:
        return Outcome(Kind.FAILURE, reason="protocol")
    if "APIError" in names:  # a stream's error event (no status of its own)
        if by_type is not None:
            return by_type
        refusal = refusal_reason(error_text(exc), body_code, body_type)  # TGI's validation event
        return (
            Outcome(Kind.FAILURE, reason="stream")
            if refusal is None
            else Outcome(Kind.CALLER_ERROR, reason=refusal)
        )
    if "ContentFilterFinishReasonError" in names:
        return Outcome(Kind.CALLER_ERROR, reason=CONTENT_POLICY)
    if "LengthFinishReasonError" in names:  # the answer hit max_tokens: not the context window
        return Outcome(Kind.CALLER_ERROR, reason="request")
    return None


def _body_field(exc: BaseException, name: str) -> Any:
    value = getattr(exc, name, None)
    if value is not None:
        return value
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            return inner.get(name)
    return None


def classify(exc: BaseException) -> Outcome | None:
    found = sdk_outcome(exc, body_type=_body_field(exc, "type"), body_code=_body_field(exc, "code"))
    if found is not None:
        return found
    if type(exc).__name__ == "OpenAIError" and "api_key" in str(exc):
        return Outcome(Kind.CALLER_ERROR, reached=False, reason="auth")
    return None
