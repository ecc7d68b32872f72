"""Elasticsearch (``elasticsearch``, ``elastic_transport``) and OpenSearch (``opensearchpy``):
429 ``es_rejected_execution_exception`` is a rejection (``Retry-After`` read when sent), 5xx a
failure, other 4xx the caller's; the transports' connection errors and timeouts by class."""

from __future__ import annotations

from ._builtin import message_of
from ._classify import classify_cause
from ._kinds import Kind, Outcome
from ._status import from_http_status

__all__ = ["classify"]

_NEVER_SENT = ("connection refused", "failed to establish a new connection", "name or service not known")


def _connection(exc: BaseException) -> Outcome:
    for inner in getattr(exc, "errors", ()) or ():
        if isinstance(inner, Exception):
            found = classify_cause_of(inner)
            if found is not None and found.kind in (Kind.FAILURE, Kind.TIMEOUT):
                return found
    cause = classify_cause(exc)
    if cause is not None and cause.kind in (Kind.FAILURE, Kind.TIMEOUT):
        return cause
    reached = not any(marker in message_of(exc) for marker in _NEVER_SENT)
    return Outcome(Kind.FAILURE, reached=reached, reason="connection")


def classify_cause_of(exc: Exception) -> Outcome | None:
    from ._classify import classify

    found = classify(exc)
    return None if found.kind is Kind.UNKNOWN else found


def classify(exc: BaseException) -> Outcome | None:
    names = [cls.__name__ for cls in type(exc).__mro__]
    meta = getattr(exc, "meta", None)
    if meta is not None and "ApiError" in names:  # elasticsearch 8+: meta.status, meta.headers
        if "UnsupportedProductError" in names:
            return Outcome(Kind.CALLER_ERROR, reason="request")  # not an Elasticsearch server
        return from_http_status(getattr(meta, "status", None), getattr(meta, "headers", None))
    if "ConnectionTimeout" in names:
        return Outcome(Kind.TIMEOUT, reason="timeout")
    if "TlsError" in names or "SSLError" in names:
        return Outcome(Kind.FAILURE, reached=False, reason="connection")
    if "ConnectionError" in names:
        return _connection(exc)
    if "SerializationError" in names:
        return Outcome(Kind.FAILURE, reason="protocol")
    if "TransportError" in names:  # opensearch-py: args are (status, error, info)
        status = getattr(exc, "status_code", None)
        if isinstance(status, int):
            return from_http_status(status, None)
        return Outcome(Kind.FAILURE, reason="connection")
    return None
