"""httpx (and httpx2, httpcore, the OpenAI/Anthropic SDKs' transport): by class name, so one
classifier serves every package that shares httpx's exception tree; ragguard's own
``RemoteStatusError`` s are ``HTTPStatusError`` s and are read by their status (but a 504 that
ran out the request's own deadline, ``request_deadline``: ``Kind.DEADLINE``). A caller's
error whose body (when it was read) says the request is longer than the model's context window
or was refused under a content policy (vLLM's 400, TGI's 422: :mod:`._refusal`) has that reason."""

from __future__ import annotations

from ._classify import classify_cause
from ._kinds import Kind, Outcome
from ._refusal import refined
from ._status import from_http_status

__all__ = ["classify", "transport_outcome"]

_BY_NAME: dict[str, Outcome] = {
    # a connection that was never made: the request cannot have reached the server
    "ConnectError": Outcome(Kind.FAILURE, reached=False, reason="connection"),
    "ProxyError": Outcome(Kind.FAILURE, reached=False, reason="connection"),
    "ConnectTimeout": Outcome(Kind.TIMEOUT, reached=False, reason="timeout"),
    "PoolTimeout": Outcome(Kind.TIMEOUT, reached=False, reason="timeout"),
    # the exchange started: the server may have the request
    "ReadTimeout": Outcome(Kind.TIMEOUT, reason="timeout"),
    "WriteTimeout": Outcome(Kind.TIMEOUT, reason="timeout"),
    "TimeoutException": Outcome(Kind.TIMEOUT, reason="timeout"),
    "RemoteProtocolError": Outcome(Kind.FAILURE, reason="protocol"),
    "DecodingError": Outcome(Kind.FAILURE, reason="protocol"),
    "ReadError": Outcome(Kind.FAILURE, reason="connection"),
    "WriteError": Outcome(Kind.FAILURE, reason="connection"),
    "CloseError": Outcome(Kind.FAILURE, reason="connection"),
    "NetworkError": Outcome(Kind.FAILURE, reason="connection"),
    # the request could not be made at all: the caller's
    "LocalProtocolError": Outcome(Kind.CALLER_ERROR, reached=False, reason="request"),
    "UnsupportedProtocol": Outcome(Kind.CALLER_ERROR, reached=False, reason="request"),
    "InvalidURL": Outcome(Kind.CALLER_ERROR, reached=False, reason="request"),
    "TooManyRedirects": Outcome(Kind.CALLER_ERROR, reason="request"),
}


_REQUEST_DEADLINE = Outcome(Kind.DEADLINE)


def transport_outcome(exc: BaseException) -> Outcome | None:
    """The outcome of an httpx-family transport error, by the first class name that says one."""
    for cls in type(exc).__mro__:
        found = _BY_NAME.get(cls.__name__)
        if found is not None:
            return found
    return None


def classify(exc: BaseException) -> Outcome | None:
    response = getattr(exc, "response", None)
    if response is not None and any(c.__name__ == "HTTPStatusError" for c in type(exc).__mro__):
        status = getattr(response, "status_code", None)
        if status == 504 and getattr(exc, "request_deadline", False) is True:
            return _REQUEST_DEADLINE  # the request's own deadline ran out at the server
        found = from_http_status(status, getattr(response, "headers", None))
        return None if found is None else refined(found, exc)
    found = transport_outcome(exc)
    if found is not None and found.kind is Kind.FAILURE and found.reason == "connection":
        # httpx raises ConnectError for a refused connection, ReadError for a reset: ask the cause
        cause = classify_cause(exc)
        if cause is not None and cause.kind is Kind.FAILURE:
            return Outcome(Kind.FAILURE, reached=found.reached and cause.reached, reason="connection")
    return found
