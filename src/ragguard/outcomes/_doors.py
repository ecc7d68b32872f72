"""What both front doors (the ASGI middleware, the gRPC interceptor) make of an outcome.

===============================  ===========  ===================  =============================
outcome                          HTTP         gRPC                 wait told (Retry-After,
                                                                   retry-after trailers)
===============================  ===========  ===================  =============================
REFUSED quota                    429          RESOURCE_EXHAUSTED   the quota's
REFUSED quota (reason deadline)  504          DEADLINE_EXCEEDED
REFUSED breaker / overloaded     503          UNAVAILABLE          the breaker's / the limit's
DEADLINE, TIMEOUT                504          DEADLINE_EXCEEDED
FAILURE                          502 (503     UNAVAILABLE          the dependency's, if stated
                                 out of mem.)
REJECTION                        503          UNAVAILABLE          the dependency's (at least 1 s)
CALLER_ERROR ragguard's input    400          INVALID_ARGUMENT
CALLER_ERROR a dependency's      400 (bad     INVALID_ARGUMENT /
                                 request) or  FAILED_PRECONDITION
                                 502
UNKNOWN, a plain ValueError      left to the application and the server
===============================  ===========  ===================  =============================

A dependency's rejection is 503, never 429: the caller is not over *its* quota (429 stays for
ragguard's own quota refusals). A dependency's error is described in general words: no response
names an upstream URL, host or port, whatever the error's own message says.
"""

from __future__ import annotations

from typing import Literal

from .._errors import InvalidInput, QuotaExceeded, RagguardError
from ._kinds import Kind, Outcome

__all__ = ["DEFAULT_REJECTION_WAIT_S", "DoorAnswer", "door_answer"]

DEFAULT_REJECTION_WAIT_S = 1.0
"""The wait told to the caller for a dependency's rejection that stated none (seconds)."""

DoorAnswer = tuple[
    Literal["quota", "quota_deadline", "unavailable", "deadline", "failure", "rejection", "invalid",
            "precondition"],
    float | None,
    str,
]
"""(what to answer, the wait to tell in seconds or None, the detail to show)."""

_DETAILS = {
    "failure": "a dependency of this service failed",
    "out_of_memory": "a dependency of this service ran out of memory",
    "rejection": "a dependency of this service is overloaded and rejected the call",
    "timeout": "a dependency of this service timed out",
    "invalid": "a dependency of this service refused the request as invalid",
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
                return "quota_deadline", None, str(exc)
            return "quota", outcome.retry_after_s or 0.0, str(exc)
        return "unavailable", outcome.retry_after_s, str(exc)
    if kind is Kind.DEADLINE:
        return "deadline", None, str(exc)
    if kind is Kind.TIMEOUT:
        return "deadline", None, str(exc) if own else _DETAILS["timeout"]
    if kind is Kind.FAILURE:
        detail = _DETAILS["out_of_memory" if outcome.out_of_memory else "failure"]
        return "failure", outcome.retry_after_s, detail
    if kind is Kind.REJECTION:
        wait = outcome.retry_after_s
        return "rejection", DEFAULT_REJECTION_WAIT_S if wait is None else wait, _DETAILS["rejection"]
    if kind is Kind.CALLER_ERROR:
        if isinstance(exc, InvalidInput):
            return "invalid", None, str(exc)
        if outcome.reason == "input":
            return None  # a plain ValueError/TypeError of the application: its own business
        if outcome.reason == "request":
            return "invalid", None, _DETAILS["invalid"]
        return "precondition", None, _DETAILS["precondition"]
    return None
