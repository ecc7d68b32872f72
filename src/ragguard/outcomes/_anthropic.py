"""The Anthropic Python SDK (``anthropic``): 529 ``overloaded_error``, 429 ``rate_limit_error``
with ``retry-after``, and the ``overloaded_error`` event a stream sends after HTTP 200 (the SDK
raises it as an ``APIStatusError`` whose status is the stream's 200: its ``type`` says which);
an ``invalid_request_error`` saying "prompt is too long" or "Output blocked by content filtering
policy" is the caller's error with the reason ``context_length`` or ``content_policy``."""

from __future__ import annotations

from ._kinds import Kind, Outcome
from ._openai import sdk_outcome
from ._refusal import refined

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
        found = Outcome(Kind.CALLER_ERROR, reason=_CALLER_TYPES[body_type])
        return refined(found, exc, getattr(exc, "error_code", None))
    return sdk_outcome(exc, body_type=body_type, body_code=getattr(exc, "error_code", None))
