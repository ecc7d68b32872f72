"""LiteLLM's exception types (``litellm.exceptions``, and the Router's ``RouterRateLimitError`` of
``litellm.types.router``), read by class name: they subclass the OpenAI SDK's (whose classifier
reads the rest), and add a few of their own. LiteLLM is not a dependency
of ragguard, not even for its tests: the names are LiteLLM's, as its source defines them."""

from __future__ import annotations

from . import _classify as core
from ._kinds import CONTENT_POLICY, CONTEXT_LENGTH, Kind, Outcome
from ._status import from_http_status, stated_wait_of

__all__ = ["classify"]

_CALLER = {
    "ContextWindowExceededError": CONTEXT_LENGTH,
    "ContentPolicyViolationError": CONTENT_POLICY,
    "BlockedPiiEntityError": "request",
    "RejectedRequestError": "request",
    "ImageFetchError": "request",
    "UnsupportedParamsError": "request",
    "JSONSchemaValidationError": "request",
    "BudgetExceededError": "auth",
}


def classify(exc: BaseException) -> Outcome | None:
    for cls in type(exc).__mro__:
        if not (cls.__module__ or "").startswith("litellm"):
            continue
        name = cls.__name__
        if name in _CALLER:
            return Outcome(Kind.CALLER_ERROR, reason=_CALLER[name])
        if name == "MidStreamFallbackError":
            original = getattr(exc, "original_exception", None)
            if isinstance(original, Exception) and original is not exc:
                inner = core.classify(original)
                if inner.kind is not Kind.UNKNOWN:
                    return inner
            return Outcome(Kind.FAILURE, reason="stream")
        if name == "RateLimitError":
            kind_of_limit = getattr(getattr(exc, "rate_limit_type", None), "value", None)
            kind_of_limit = kind_of_limit or getattr(exc, "rate_limit_type", None)
            if kind_of_limit == "budget":
                return Outcome(Kind.CALLER_ERROR, reason="auth")
            return Outcome.of(Kind.REJECTION, retry_after_s=stated_wait_of(exc), reason="status", status=429)
        if name == "Timeout":
            return Outcome(Kind.TIMEOUT, reason="timeout")
        if name == "APIError":
            # LiteLLM's APIError (an openai.APIError, not a status error) carries the provider's
            # status as an attribute: a 429 or a 400 must not read as a failure of the stream
            status = getattr(exc, "status_code", None)
            if isinstance(status, int) and not isinstance(status, bool) and status >= 400:
                return from_http_status(status)
        if name in ("RouterRateLimitError", "RouterRateLimitErrorBasic"):
            # the Router's "No deployments available ... Try again in N seconds": every deployment
            # is cooling down (a ValueError in LiteLLM's source, litellm/types/router.py, so the
            # standard library's rules would call it the caller's error)
            wait = getattr(exc, "cooldown_time", None)
            return Outcome.of(Kind.REJECTION, reached=False, retry_after_s=wait, reason="status")
    return None  # the OpenAI classifier reads the rest (their bases are the SDK's)
