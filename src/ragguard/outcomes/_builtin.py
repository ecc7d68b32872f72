"""The standard library's errors, and the class names and messages of runtimes that have no
classifier of their own (aiohttp, psycopg, urllib3, google-api-core, onnxruntime, tensorflow,
jax...): the last questions :func:`ragguard.outcomes.classify` asks before ``UNKNOWN``."""

from __future__ import annotations

import errno

from ._kinds import Kind, Outcome

__all__ = [
    "BROKEN_CONNECTION",
    "OUT_OF_MEMORY",
    "REFUSED_CONNECTION",
    "TIMED_OUT",
    "builtin",
    "connection_errno_reached",
    "is_oom_message",
    "message_of",
]

_MAX_MESSAGE = 4096

OUT_OF_MEMORY = Outcome(Kind.FAILURE, reason="out_of_memory")
REFUSED_CONNECTION = Outcome(Kind.FAILURE, reached=False, reason="connection")
BROKEN_CONNECTION = Outcome(Kind.FAILURE, reached=True, reason="connection")
TIMED_OUT = Outcome(Kind.TIMEOUT, reason="timeout")
_INPUT = Outcome(Kind.CALLER_ERROR, reached=False, reason="input")

_TIMEOUT_NAMES = frozenset({
    "TooSlowError",            # trio.fail_after
    "ServerTimeoutError",      # aiohttp
    "ConnectionTimeoutError",  # aiohttp
    "SocketTimeoutError",      # aiohttp
    "DeadlineExceeded",        # google.api_core (504)
})
_UNREACHED_NAMES = frozenset({
    "ClientConnectorError",    # aiohttp: the connection was never made
    "PoolExhaustedError", "PoolExhausted", "PoolError",  # psycopg / urllib3 pools
    "gaierror",                # name resolution failed
    "NewConnectionError",      # urllib3
})
_BROKEN_NAMES = frozenset({
    "ClientConnectionError", "ServerDisconnectedError", "ClientOSError",  # aiohttp
    "ServiceUnavailable",      # google.api_core (503)
    "ProtocolError",           # urllib3
    "OperationalError",        # DB-API: the database went away
})
_CONNECTION_MESSAGES = (
    "connect call failed",     # asyncio, several addresses refused ("Multiple exceptions: ...")
    "connection refused",
    "pool exhausted",
    "too many connections",
    "no connection available",
)
_OOM_NAMES = frozenset({
    "OutOfMemoryError",        # torch.OutOfMemoryError, torch.cuda.OutOfMemoryError
    "ResourceExhaustedError",  # tensorflow
})
_OOM_MESSAGES = (
    "out of memory",           # "CUDA out of memory", "CUDA error: out of memory", MPS, HIP, XLA
    "can't allocate memory",
    "cannot allocate memory",
    "failed to allocate memory",  # onnxruntime BFCArena
    "alloc_failed",            # CUBLAS_STATUS_ALLOC_FAILED
    "bad_alloc",               # std::bad_alloc through pybind11
    "is smaller than requested bytes",  # onnxruntime arena
)
_ML_MODULES = ("torch", "onnxruntime", "tensorflow", "jax", "jaxlib", "cupy", "tensorrt")


def message_of(exc: BaseException) -> str:
    """``str(exc)``, lower case, at most 4096 characters; "" when ``str`` raises."""
    try:
        return str(exc)[:_MAX_MESSAGE].lower()
    except Exception:
        return ""


def is_oom_message(exc: BaseException) -> bool:
    """True when ``exc``'s message says it ran out of memory (see ``_OOM_MESSAGES``)."""
    message = message_of(exc)
    return any(m in message for m in _OOM_MESSAGES)


def builtin(exc: BaseException) -> Outcome | None:
    """The outcome of a standard-library error, or of one recognised by class name or message."""
    if isinstance(exc, ConnectionRefusedError):
        return REFUSED_CONNECTION
    if isinstance(exc, ConnectionError):  # reset, aborted, broken pipe
        return BROKEN_CONNECTION
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError, socket.timeout, anyio's fail_after
        return TIMED_OUT
    if isinstance(exc, MemoryError):
        return OUT_OF_MEMORY
    names = {cls.__name__ for cls in type(exc).__mro__}
    if isinstance(exc, OSError):
        if exc.errno == errno.ENOMEM:
            return OUT_OF_MEMORY
        reached = connection_errno_reached(exc.errno)
        if reached is not None:
            return BROKEN_CONNECTION if reached else REFUSED_CONNECTION
        if "gaierror" in names:
            return REFUSED_CONNECTION
        if exc.errno is None and any(m in message_of(exc) for m in _CONNECTION_MESSAGES):
            return REFUSED_CONNECTION
    if not _OOM_NAMES.isdisjoint(names):
        return OUT_OF_MEMORY
    if isinstance(exc, RuntimeError) or any(
        (cls.__module__ or "").startswith(_ML_MODULES) for cls in type(exc).__mro__
    ):
        if is_oom_message(exc):
            return OUT_OF_MEMORY
    if not _TIMEOUT_NAMES.isdisjoint(names):
        return TIMED_OUT
    if not _UNREACHED_NAMES.isdisjoint(names):
        return REFUSED_CONNECTION
    if not _BROKEN_NAMES.isdisjoint(names):
        return BROKEN_CONNECTION
    if isinstance(exc, (ValueError, TypeError)):
        return _INPUT  # the caller's bad input (a validation error, a wrong argument)
    if any("Pool" in n or "Connection" in n for n in names) and any(
        m in message_of(exc) for m in _CONNECTION_MESSAGES
    ):
        return REFUSED_CONNECTION
    return None


def connection_errno_reached(code: int | None) -> bool | None:
    """Whether an OSError with errno ``code`` may have reached the peer: False for the errnos of a
    connection that never opened, True for one that broke, None for other errnos."""
    if code in _NEVER_OPENED:
        return False
    if code in _BROKE:
        return True
    return None


_NEVER_OPENED = frozenset(
    getattr(errno, name)
    for name in ("ECONNREFUSED", "ENETUNREACH", "ENETDOWN", "EHOSTUNREACH", "EHOSTDOWN", "EADDRNOTAVAIL")
    if hasattr(errno, name)
)
_BROKE = frozenset(
    getattr(errno, name)
    for name in ("ECONNRESET", "ECONNABORTED", "EPIPE", "ENOTCONN", "ESHUTDOWN", "ENETRESET")
    if hasattr(errno, name)
)
