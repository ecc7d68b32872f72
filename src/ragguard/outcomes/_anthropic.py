"""The Anthropic Python SDK (``anthropic``): 529 ``overloaded_error``, 429 ``rate_limit_error``
with ``retry-after``, and the ``overloaded_error`` event a stream sends after HTTP 200 (the SDK
raises it as an ``APIStatusError`` whose status is the stream's 200: its ``type`` says which)."""

from __future__ import annotations

from ._kinds import Kind, Outcome
from ._openai import sdk_outcome

__all__ = ["classify"]

_CALLER_TYPES = {
    "invalid_request_error": "request",
    "request_too_large": "request",
    "authentication_error": "auth",
    "permission_error": "auth",
    "billing_error": "auth",
    "not_found_error": "not_found",
}


def classify(exc: BaseException) -> Outcome | None:
    body_type = getattr(exc, "type", None)
    if isinstance(body_type, str) and body_type in _CALLER_TYPES:
        return Outcome(Kind.CALLER_ERROR, reason=_CALLER_TYPES[body_type])
    return sdk_outcome(exc, body_type=body_type, body_code=getattr(exc, "error_code", None))
