"""What both front doors (the ASGI middleware, the gRPC interceptor) make of an error: the one
table of HTTP statuses and gRPC codes, :data:`ANSWERS`, that both read.

===============================  ===========  ===================  =============================
outcome                          HTTP         gRPC                 wait told (Retry-After,
                                                                   retry-after trailers)
===============================  ===========  ===================  =============================
REFUSED quota                    429          RESOURCE_EXHAUSTED   the quota's
REFUSED quota (reason deadline)  504          DEADLINE_EXCEEDED
REFUSED breaker / overloaded     503          UNAVAILABLE          the breaker's / the limit's
DEADLINE, TIMEOUT                504          DEADLINE_EXCEEDED
FAILURE                          502          UNAVAILABLE          the dependency's, if stated
FAILURE (out of memory)          503          UNAVAILABLE          the dependency's, if stated
REJECTION                        503          UNAVAILABLE          the dependency's (at least 1 s)
CALLER_ERROR ragguard's input    400          INVALID_ARGUMENT
CALLER_ERROR Unauthenticated     401          UNAUTHENTICATED      (HTTP: ``WWW-Authenticate``)
CALLER_ERROR PermissionDenied    403          PERMISSION_DENIED
CALLER_ERROR a dependency's      400 (bad     INVALID_ARGUMENT /
                                 request,     FAILED_PRECONDITION
                                 context
                                 length,
                                 content
                                 policy) or
                                 502
UNKNOWN, a plain ValueError      left to the application and the server
===============================  ===========  ===================  =============================

``Unauthenticated`` and ``PermissionDenied`` get the same answer whether a tenant resolver raised
them or the handler did (itself, or from a guarded call). A dependency's rejection is 503, never
429: the caller is not over *its* quota (429 stays for ragguard's own quota refusals). A
dependency's 401 or 403 is not the caller's: 502 / FAILED_PRECONDITION. A dependency's error is
described in general words: no response names an upstream URL, host or port, whatever the
error's own message says.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import (
    SET_BY,
    InvalidInput,
    PermissionDenied,
    QuotaExceeded,
    RagguardError,
    Unauthenticated,
)
from ._kinds import CONTENT_POLICY, CONTEXT_LENGTH, Kind, Outcome

__all__ = [
    "ANSWERS", "DEFAULT_REJECTION_WAIT_S", "Answer", "DoorAnswer", "door_answer", "told_deadline",
]  # fmt: skip

DEFAULT_REJECTION_WAIT_S = 1.0
"""The wait told to the caller for a dependency's rejection that stated none (seconds)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """One row of the table: ``name``, the HTTP status and the gRPC code (a ``grpc.StatusCode``
    member's name: the core does not import grpc) of an error."""

    name: str
    http_status: int
    grpc_code: str


ANSWERS: dict[str, Answer] = {
    row.name: row
    for row in (
        Answer("quota", 429, "RESOURCE_EXHAUSTED"),
        Answer("quota_deadline", 504, "DEADLINE_EXCEEDED"),
        Answer("unavailable", 503, "UNAVAILABLE"),
        Answer("deadline", 504, "DEADLINE_EXCEEDED"),
        Answer("failure", 502, "UNAVAILABLE"),
        Answer("out_of_memory", 503, "UNAVAILABLE"),
        Answer("rejection", 503, "UNAVAILABLE"),
        Answer("invalid", 400, "INVALID_ARGUMENT"),
        Answer("unauthenticated", 401, "UNAUTHENTICATED"),
        Answer("permission_denied", 403, "PERMISSION_DENIED"),
        Answer("precondition", 502, "FAILED_PRECONDITION"),
    )
}
"""The HTTP status and gRPC code of every answer a front door gives (see the module docstring)."""

DoorAnswer = tuple[Answer, float | None, str]
"""(the row of :data:`ANSWERS`, the wait to tell in seconds or None, the detail to show)."""

_DETAILS = {
    "failure": "a dependency of this service failed",
    "out_of_memory": "a dependency of this service ran out of memory",
    "rejection": "a dependency of this service is overloaded and rejected the call",
    "timeout": "a dependency of this service timed out",
    "deadline": "the request's deadline ran out at a dependency of this service",
    "invalid": "a dependency of this service refused the request as invalid",
    "context_length": "a dependency of this service refused the request as longer than its context window",
    "content_policy": "a dependency of this service refused the request under its content policy",
    "precondition": "a dependency of this service refused the call",
}


def door_answer(exc: BaseException, outcome: Outcome) -> DoorAnswer | None:
    """What a front door answers for ``exc`` (whose outcome is ``outcome``), None to leave it to
    the application (see the module docstring)."""
    kind = outcome.kind
    own = isinstance(exc, RagguardError)
    if kind is Kind.REFUSED:
        if isinstance(exc, QuotaExceeded):
            if exc.reason == "deadline":
                return ANSWERS["quota_deadline"], None, str(exc)
            return ANSWERS["quota"], outcome.retry_after_s or 0.0, str(exc)
        return ANSWERS["unavailable"], outcome.retry_after_s, str(exc)
    if kind is Kind.DEADLINE:
        return ANSWERS["deadline"], None, str(exc) if own else _DETAILS["deadline"]
    if kind is Kind.TIMEOUT:
        return ANSWERS["deadline"], None, str(exc) if own else _DETAILS["timeout"]
    if kind is Kind.FAILURE:
        name = "out_of_memory" if outcome.out_of_memory else "failure"
        return ANSWERS[name], outcome.retry_after_s, _DETAILS[name]
    if kind is Kind.REJECTION:
        wait = outcome.retry_after_s
        return ANSWERS["rejection"], DEFAULT_REJECTION_WAIT_S if wait is None else wait, _DETAILS["rejection"]
    if kind is Kind.CALLER_ERROR:
        if isinstance(exc, InvalidInput):
            return ANSWERS["invalid"], None, str(exc)
        if isinstance(exc, Unauthenticated):
            return ANSWERS["unauthenticated"], None, str(exc)
        if isinstance(exc, PermissionDenied):
            return ANSWERS["permission_denied"], None, str(exc)
        if outcome.reason == "input":
            return None  # a plain ValueError/TypeError of the application: its own business
        if outcome.reason == "request":
            return ANSWERS["invalid"], None, _DETAILS["invalid"]
        if outcome.reason in (CONTEXT_LENGTH, CONTENT_POLICY):
            return ANSWERS["invalid"], None, _DETAILS[outcome.reason]
        return ANSWERS["precondition"], None, _DETAILS["precondition"]
    return None


_MAX_TOLD_S = 10 * 365 * 24 * 3600.0  # ragguard._deadline.MAX_DEADLINE_S: no deadline is longer


def told_deadline(set_by: object, seconds: object) -> tuple[str | None, float | None]:
    """What set a deadline (a key of ``SET_BY``, else None) and its budget in seconds (finite, in
    [0, ten years], else None), read from anything: what the doors tell, and what a client
    takes from a server's answer."""
    by = set_by if isinstance(set_by, str) and set_by in SET_BY else None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return by, None
    if not 0.0 <= seconds <= _MAX_TOLD_S:
        return by, None  # NaN and infinity fail the range too
    return by, float(seconds)
