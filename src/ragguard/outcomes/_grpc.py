"""gRPC status codes (``grpc.RpcError``, ``grpc.aio.AioRpcError``, ragguard's ``RemoteCallError``
and anything else with ``code()`` and ``details()``), the server's pushback read from trailing
metadata (``retry-after``, ``grpc-retry-pushback-ms``)."""

from __future__ import annotations

from typing import Any

from ._kinds import Kind, Outcome

__all__ = ["classify", "from_grpc_code"]

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
    from ..grpc._status import retry_after_of  # grpc is installed: its error is being classified

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
    return from_grpc_code(name, details if isinstance(details, str) else "", trailing)
