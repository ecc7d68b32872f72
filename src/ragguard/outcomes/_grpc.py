"""gRPC status codes (``grpc.RpcError``, ``grpc.aio.AioRpcError``, ragguard's ``RemoteCallError``
and anything else with ``code()`` and ``details()``), the server's pushback read from trailing
metadata (``retry-after``, ``grpc-retry-pushback-ms``)."""

from __future__ import annotations

from typing import Any

from .._waits import MAX_STATED_WAIT_S, clamped
from ._kinds import Kind, Outcome

__all__ = [
    "PUSHBACK_KEY", "RETRY_AFTER_KEY", "classify", "from_grpc_code", "parse_pushback_ms", "parse_retry_after",
    "retry_after_of",
]  # fmt: skip

RETRY_AFTER_KEY = "retry-after"
PUSHBACK_KEY = "grpc-retry-pushback-ms"

_CALLER = {
    "INVALID_ARGUMENT": "request",
    "OUT_OF_RANGE": "request",
    "NOT_FOUND": "not_found",
    "ALREADY_EXISTS": "conflict",
    "FAILED_PRECONDITION": "conflict",
    "PERMISSION_DENIED": "auth",
    "UNAUTHENTICATED": "auth",
    "UNIMPLEMENTED": "request",
}
_FAILURES = frozenset({"UNAVAILABLE", "INTERNAL", "UNKNOWN", "DATA_LOSS", "ABORTED"})
_NEVER_SENT = (
    "failed to connect",
    "connection refused",
    "connect failed",
    "dns resolution failed",
    "name resolution",
    "no route to host",
    "connection attempt timed out",
)


def from_grpc_code(name: str, details: str = "", trailing: Any = None) -> Outcome | None:
    """The outcome of a gRPC status named ``name`` (``"UNAVAILABLE"``...), None for ``OK``."""
    if name == "OK":
        return None
    if name == "CANCELLED":
        return Outcome(Kind.CANCELLED)
    if name in _CALLER:
        return Outcome(Kind.CALLER_ERROR, reason=_CALLER[name])
    wait = _pushback(trailing)
    if name == "DEADLINE_EXCEEDED":
        return Outcome(Kind.TIMEOUT, reason="status")
    if name == "RESOURCE_EXHAUSTED":
        if "memory" in details.lower():
            return Outcome(Kind.FAILURE, reason="out_of_memory")
        # a quota or rate limit: 429 in google.rpc.Code's HTTP mapping (never counted by a
        # breaker's rejection rate, as a 429 is not)
        return Outcome.of(Kind.REJECTION, retry_after_s=wait, reason="status", status=429)
    if name == "UNAVAILABLE" and wait is not None:
        # the server says when to come back (gRFC A6 pushback, a ragguard server's open breaker or
        # shedding): a rejection, not an outage
        return Outcome.of(Kind.REJECTION, retry_after_s=wait, reason="status")
    if name in _FAILURES:
        text = details.lower()
        reached = not any(marker in text for marker in _NEVER_SENT)
        return Outcome.of(Kind.FAILURE, reached=reached, retry_after_s=wait, reason="status")
    return None


def _pushback(trailing: Any) -> float | None:
    if not trailing:
        return None
    try:
        return retry_after_of(trailing)
    except Exception:
        return None


def classify(exc: BaseException) -> Outcome | None:
    code = getattr(exc, "code", None)
    if not callable(code) or not callable(getattr(exc, "details", None)):
        return None
    try:
        name = getattr(code(), "name", None)
        details = exc.details() or ""  # type: ignore[attr-defined]
        trailing_of = getattr(exc, "trailing_metadata", None)
        trailing = trailing_of() if callable(trailing_of) else None
    except Exception:
        return None
    if not isinstance(name, str):
        return None
    if name == "DEADLINE_EXCEEDED" and getattr(exc, "request_deadline", False) is True:
        return _REQUEST_DEADLINE  # the request's own deadline, propagated as the call's timeout
    return from_grpc_code(name, details if isinstance(details, str) else "", trailing)


_REQUEST_DEADLINE = Outcome(Kind.DEADLINE)


def parse_retry_after(value: object) -> float | None:
    """A ``retry-after`` metadata value in seconds, or None when absent or not a number >= 0;
    clamped to [0, a day] (``1e308`` and ``inf`` are a day); never raises."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str) or len(value) > _MAX_VALUE:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if seconds != seconds or seconds < 0:  # NaN, negative
        return None
    return clamped(seconds)


def parse_pushback_ms(value: object) -> float | None:
    """A ``grpc-retry-pushback-ms`` value in seconds, or None: a negative or unreadable value means
    "do not retry" in gRFC A6, which gives no wait to honour. Clamped to [0, a day]."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str) or len(value) > _MAX_VALUE:
        return None
    text = value.strip()
    if not text.isdigit() or not text.isascii():
        return None
    if len(text) > _MAX_DIGITS:
        return MAX_STATED_WAIT_S
    return clamped(int(text) / 1000.0)


_MAX_VALUE = 1024


_MAX_DIGITS = 15  # more milliseconds than that is far past the cap


def retry_after_of(metadata: object) -> float | None:
    """The wait, in seconds, that trailing ``metadata`` asks for: ``retry-after`` when readable,
    else ``grpc-retry-pushback-ms``; None when neither is there."""
    if not metadata:
        return None
    pushback: float | None = None
    for item in metadata:  # type: ignore[attr-defined]
        key, value = item[0], item[1]
        if key == RETRY_AFTER_KEY:
            seconds = parse_retry_after(value)
            if seconds is not None:
                return seconds
        elif key == PUSHBACK_KEY and pushback is None:
            pushback = parse_pushback_ms(value)
    return pushback
