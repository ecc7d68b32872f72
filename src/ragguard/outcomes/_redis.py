"""redis-py's errors (``redis.exceptions``), by class name down the MRO."""

from __future__ import annotations

from ._builtin import message_of
from ._kinds import Kind, Outcome

__all__ = ["classify"]

_BY_NAME: dict[str, Outcome] = {
    "AuthenticationError": Outcome(Kind.CALLER_ERROR, reached=False, reason="auth"),
    "AuthorizationError": Outcome(Kind.CALLER_ERROR, reason="auth"),
    "NoPermissionError": Outcome(Kind.CALLER_ERROR, reason="auth"),
    "AuthenticationWrongNumberOfArgsError": Outcome(Kind.CALLER_ERROR, reached=False, reason="auth"),
    "MaxConnectionsError": Outcome(Kind.FAILURE, reached=False, reason="connection"),  # the pool's
    "BusyLoadingError": Outcome(Kind.FAILURE, reason="status"),
    "OutOfMemoryError": Outcome(Kind.FAILURE, reason="out_of_memory"),  # maxmemory reached
    "ReadOnlyError": Outcome(Kind.FAILURE, reason="status"),  # a replica after failover
    "ClusterDownError": Outcome(Kind.FAILURE, reason="status"),
    "MasterDownError": Outcome(Kind.FAILURE, reason="status"),
    "TryAgainError": Outcome(Kind.FAILURE, reason="status"),
    "TimeoutError": Outcome(Kind.TIMEOUT, reason="timeout"),
    "NoScriptError": Outcome(Kind.CALLER_ERROR, reason="request"),
    "DataError": Outcome(Kind.CALLER_ERROR, reached=False, reason="input"),
    "WatchError": Outcome(Kind.CALLER_ERROR, reason="conflict"),
    "LockError": Outcome(Kind.CALLER_ERROR, reason="conflict"),
    "InvalidResponse": Outcome(Kind.FAILURE, reason="protocol"),
}
_NEVER_SENT = ("connecting to", "connection refused", "too many connections", "no connection available")


def classify(exc: BaseException) -> Outcome | None:
    names = [cls.__name__ for cls in type(exc).__mro__ if (cls.__module__ or "").startswith("redis")]
    for name in names:
        found = _BY_NAME.get(name)
        if found is not None:
            return found
        if name == "ConnectionError":
            message = message_of(exc)
            reached = not any(marker in message for marker in _NEVER_SENT)
            return Outcome(Kind.FAILURE, reached=reached, reason="connection")
        if name == "ResponseError":
            message = message_of(exc)
            if message.startswith("max number of clients"):
                return Outcome(Kind.REJECTION, reason="status")
            if message.startswith(("loading", "busy", "masterdown", "clusterdown", "tryagain")):
                return Outcome(Kind.FAILURE, reason="status")
            return Outcome(Kind.CALLER_ERROR, reason="request")  # WRONGTYPE, ERR syntax...
    return None
