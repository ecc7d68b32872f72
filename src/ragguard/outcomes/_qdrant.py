"""qdrant-client: REST (``UnexpectedResponse`` with its status and headers, ``ResponseHandlingException``
wrapping the transport's error) and gRPC (``ResourceExhaustedResponse`` with the server's
``retry-after``; other statuses are ``grpc.aio.AioRpcError`` s, read by the gRPC classifier)."""

from __future__ import annotations

import re

from .._http import parse_retry_after
from ._builtin import message_of
from ._classify import classify_cause
from ._kinds import Kind, Outcome
from ._status import from_http_status

__all__ = ["classify"]

_BAD_RETRY_AFTER = re.compile(r"retry-after header value is not a valid integer: (.{1,64})$")


def classify(exc: BaseException) -> Outcome | None:
    names = [cls.__name__ for cls in type(exc).__mro__]
    if "ResourceExhaustedResponse" in names:
        # qdrant-client's answer to a 429 (REST) or RESOURCE_EXHAUSTED (gRPC) stating a wait
        wait = getattr(exc, "retry_after_s", None)
        return Outcome.of(Kind.REJECTION, retry_after_s=wait, reason="status", status=429)
    if "UnexpectedResponse" in names:
        return from_http_status(getattr(exc, "status_code", None), getattr(exc, "headers", None))
    if "ResponseHandlingException" in names:
        source = getattr(exc, "source", None)
        if isinstance(source, Exception):
            from ._classify import classify as classify_any

            found = classify_any(source)
            if found.kind is not Kind.UNKNOWN:
                return found
        return classify_cause(exc)
    if "QdrantException" in names:
        # qdrant-client raises this instead of ResourceExhaustedResponse when a 429's Retry-After
        # is not an integer (an HTTP-date): still the server's rejection, with that wait
        match = _BAD_RETRY_AFTER.search(message_of(exc))
        if match is not None:
            wait = parse_retry_after(match.group(1).strip())
            return Outcome.of(Kind.REJECTION, retry_after_s=wait, reason="status", status=429)
    return None
