"""Errors the client interceptor raises for failed calls, shaped for the typed breakers.

Each is a :class:`grpc.aio.AioRpcError` (``code()``, ``details()``, ``trailing_metadata()`` work,
and ``except grpc.aio.AioRpcError`` still catches it) and also a class the breakers classify::

    grpc.aio.AioRpcError
     +-- RemoteCallError
          +-- RemoteUnavailable        (ConnectionError)  UNAVAILABLE: a dependency failure (a
          |                                               rejection when it states a wait)
          +-- RemoteDeadlineExceeded   (TimeoutError)     DEADLINE_EXCEEDED: a timeout (the
          |                                               request's deadline when it was the
          |                                               call's timeout: request_deadline;
          |                                               what set the server's: set_by)
          +-- RemoteQuotaExceeded                         RESOURCE_EXHAUSTED: a rejection

Each carries ``retry_after_s``: the seconds the server asked the client to wait, read from the
``retry-after`` trailer, else from ``grpc-retry-pushback-ms`` (None when it sent neither; 0.0 for
RESOURCE_EXHAUSTED, whose ``retry_after_s`` is always a float).

RESOURCE_EXHAUSTED is the dependency's rejection (:func:`ragguard.outcomes.classify`), not
ragguard's own quota refusal, so it is no :class:`~ragguard.QuotaExceeded`: no breaker counts it
(an "out of memory" detail is a failure, out of memory), the throttle does, the retry waits its
``retry-after``, the stage's fallback serves it, and a ragguard server it reaches answers
UNAVAILABLE with the same wait (the caller is not over *its* quota). The original AioRpcError is
the ``__cause__``.
"""

from __future__ import annotations

import grpc
from grpc.aio import AioRpcError

from ._status import deadline_told_of, retry_after_of

__all__ = [
    "RemoteCallError",
    "RemoteDeadlineExceeded",
    "RemoteQuotaExceeded",
    "RemoteUnavailable",
    "remote_error",
]


class RemoteCallError(AioRpcError):  # type: ignore[misc]
    """A gRPC call failed with a status ragguard classifies; see the subclasses.

    ``retry_after_s``: seconds the server asked to wait before a retry, or None.
    """

    retry_after_s: float | None

    def __init__(self, err: AioRpcError) -> None:
        # Fill AioRpcError's fields directly: its __init__ chains to the next base's __init__
        # (OSError's, QuotaExceeded's), which take different arguments.
        Exception.__init__(self, err.details())
        self._code = err.code()
        self._details = err.details()
        self._initial_metadata = err.initial_metadata()
        self._trailing_metadata = err.trailing_metadata()
        self._debug_error_string = err.debug_error_string()
        self.retry_after_s = retry_after_of(self._trailing_metadata)

    def __str__(self) -> str:
        text: str = AioRpcError.__str__(self)
        return text


class RemoteUnavailable(RemoteCallError, ConnectionError):
    """UNAVAILABLE: the server could not be reached or refused the call (a ConnectionError)."""


class RemoteDeadlineExceeded(RemoteCallError, TimeoutError):
    """DEADLINE_EXCEEDED: the call outlived its timeout (a TimeoutError).

    ``request_deadline``: the timeout was the request's own deadline (the client interceptors
    propagated it), so what ran out is the request's time, as :class:`ragguard.DeadlineExceeded`
    says: classified ``Kind.DEADLINE`` (never counted by a breaker, never retried, never
    continued) rather than as the server's slowness (``Kind.TIMEOUT``).

    ``set_by`` and ``deadline_s``: what a ragguard server said set the deadline that ran out on
    its side, and that deadline's budget in seconds (its ``ragguard-deadline-set-by`` and
    ``ragguard-deadline-s`` trailers, as :class:`ragguard.DeadlineExceeded` names them):
    ``"client"`` (the call's own timeout), ``"tenant"`` (the tenant's ``timeout_s`` there) or
    ``"handler"`` (the server code's own ``deadline(...)``); None when the server said nothing,
    or anything else (an unknown word; not a finite number in [0, ten years]; more than 64
    characters)."""

    def __init__(self, err: AioRpcError, *, request_deadline: bool = False) -> None:
        super().__init__(err)
        self.request_deadline = request_deadline
        self.set_by, self.deadline_s = deadline_told_of(self._trailing_metadata)


class RemoteQuotaExceeded(RemoteCallError):
    """RESOURCE_EXHAUSTED: the server throttled the call made for tenant ``tenant`` (a rejection).

    ``retry_after_s`` is the server's ``retry-after`` (else ``grpc-retry-pushback-ms``) in
    seconds, 0.0 when it sent neither; ``reason`` is ``"remote"``.
    """

    retry_after_s: float

    def __init__(self, err: AioRpcError, tenant: str) -> None:
        super().__init__(err)
        self.tenant = tenant
        self.reason = "remote"
        self.retry_after_s = retry_after_of(self._trailing_metadata) or 0.0


_BY_CODE: dict[grpc.StatusCode, type[RemoteCallError]] = {grpc.StatusCode.UNAVAILABLE: RemoteUnavailable}


def remote_error(err: AioRpcError, tenant: str, *, request_deadline: bool = False) -> RemoteCallError | None:
    """The classified error for ``err`` (tenant ``tenant`` made the call, with the request's
    deadline as its timeout when ``request_deadline``), or None to keep ``err``."""
    if isinstance(err, RemoteCallError):
        return None
    code = err.code()
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return RemoteQuotaExceeded(err, tenant)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RemoteDeadlineExceeded(err, request_deadline=request_deadline)
    cls = _BY_CODE.get(code)
    return None if cls is None else cls(err)
