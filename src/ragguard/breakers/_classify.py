"""Failure classifiers: which exceptions a breaker counts against its dependency.

A classifier takes the exception a call raised and returns True when it says something about
the dependency's health (count it), False when it does not (a caller's bad input: let it pass
through uncounted). Classifiers never see cancellation: breakers catch ``Exception`` only.

Optional libraries (torch, onnxruntime, httpx, grpc, aiohttp, redis) are never imported here;
their errors are recognised by the class names in the exception's MRO, by ``code()`` for gRPC
errors, and by message for the out-of-memory ``RuntimeError`` s of the ML runtimes. An
exception raised ``from`` another one (``__cause__``) and an exception group are classified by
what they carry, a few levels deep. A :class:`ragguard.DeadlineExceeded` is never matched, whatever
it was raised from: the caller's budget ran out, which says nothing about the dependency.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable

from .._errors import BreakerOpen, DeadlineExceeded, Overloaded, QuotaExceeded

__all__ = ["counts_by_default", "is_connection_error", "is_out_of_memory", "is_timeout"]

_MAX_DEPTH = 4
_MAX_MESSAGE = 4096

_TIMEOUT_NAMES = frozenset({
    "TooSlowError",            # trio.move_on/fail_after
    "TimeoutException",        # httpx / httpcore base of every timeout
    "ConnectTimeout", "ReadTimeout", "WriteTimeout", "PoolTimeout",
    "ServerTimeoutError",      # aiohttp
})

_CONNECTION_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNREFUSED", "ECONNRESET", "ECONNABORTED", "EPIPE", "ENOTCONN", "ESHUTDOWN",
        "ENETUNREACH", "ENETDOWN", "ENETRESET", "EHOSTUNREACH", "EHOSTDOWN",
    )
    if hasattr(errno, name)
)

_CONNECTION_NAMES = frozenset({
    "ConnectError", "ConnectTimeout", "PoolTimeout", "RemoteProtocolError",  # httpx / httpcore
    "ClientConnectionError", "ClientConnectorError", "ServerDisconnectedError",  # aiohttp
    "ServiceUnavailable",      # google.api_core
    "PoolExhaustedError", "PoolExhausted", "PoolError",  # psycopg / urllib3
    "gaierror",                # name resolution failed: the store is unreachable
})

_CONNECTION_MESSAGES = (
    "connect call failed",     # asyncio, several addresses refused ("Multiple exceptions: ...")
    "pool exhausted",
    "too many connections",    # redis ConnectionPool(max_connections=...)
    "no connection available", # redis BlockingConnectionPool timeout
    "connection refused",
    "connection reset",
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


def _mro_names(exc: BaseException) -> list[str]:
    return [cls.__name__ for cls in type(exc).__mro__]


def _mro_modules(exc: BaseException) -> list[str]:
    return [cls.__module__ or "" for cls in type(exc).__mro__]


def _grpc_code_name(exc: BaseException) -> str | None:
    """The name of ``exc.code()`` for gRPC errors (``"UNAVAILABLE"``...), else None."""
    code = getattr(exc, "code", None)
    if not callable(code) or not callable(getattr(exc, "details", None)):
        return None
    try:
        status = code()
    except Exception:
        return None
    name = getattr(status, "name", None)
    return name if isinstance(name, str) else None


def _message(exc: BaseException) -> str:
    try:
        return str(exc)[:_MAX_MESSAGE].lower()
    except Exception:
        return ""


def _is_redis(exc: BaseException, name: str) -> bool:
    redis_exceptions = sys.modules.get("redis.exceptions")
    if redis_exceptions is not None:
        cls = getattr(redis_exceptions, name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return True
    return any(
        cls.__name__ == name and (cls.__module__ or "").startswith("redis")
        for cls in type(exc).__mro__
    )


def _carried(
    exc: BaseException, match: Callable[[BaseException], bool], depth: int = 0
) -> bool:
    if isinstance(exc, DeadlineExceeded):
        return False  # the caller's budget ran out: whatever it was raised from, not the dependency
    if match(exc):
        return True
    if depth >= _MAX_DEPTH:
        return False
    if isinstance(exc, BaseExceptionGroup):
        return any(_carried(e, match, depth + 1) for e in exc.exceptions)
    cause = exc.__cause__
    return cause is not None and _carried(cause, match, depth + 1)


def _timeout(exc: BaseException) -> bool:
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError, socket.timeout, anyio's fail_after
        return True
    if _is_redis(exc, "TimeoutError"):
        return True
    if not _TIMEOUT_NAMES.isdisjoint(_mro_names(exc)):
        return True
    return _grpc_code_name(exc) == "DEADLINE_EXCEEDED"


def _connection(exc: BaseException) -> bool:
    if isinstance(exc, ConnectionError):  # refused, reset, aborted, broken pipe
        return True
    if isinstance(exc, OSError):
        if exc.errno in _CONNECTION_ERRNOS:
            return True
        if exc.errno is None and any(m in _message(exc) for m in _CONNECTION_MESSAGES):
            return True
    if _is_redis(exc, "ConnectionError") or _is_redis(exc, "TimeoutError"):
        return True
    if not _CONNECTION_NAMES.isdisjoint(_mro_names(exc)):
        return True
    if _grpc_code_name(exc) == "UNAVAILABLE":
        return True
    names = _mro_names(exc)
    if any("Pool" in n or "Connection" in n for n in names[:-2]):
        message = _message(exc)
        return any(m in message for m in _CONNECTION_MESSAGES)
    return False


def _oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return True
    if not _OOM_NAMES.isdisjoint(_mro_names(exc)):
        return True
    if _grpc_code_name(exc) == "RESOURCE_EXHAUSTED" and "memory" in _message(exc):
        return True
    if isinstance(exc, RuntimeError) or any(m.startswith(_ML_MODULES) for m in _mro_modules(exc)):
        message = _message(exc)
        return any(m in message for m in _OOM_MESSAGES)
    return False


def is_timeout(exc: BaseException) -> bool:
    """True when ``exc`` says a call ran out of time.

    Matches builtin :class:`TimeoutError` (``asyncio.TimeoutError``, ``socket.timeout`` and
    anyio's ``fail_after`` are that class), trio's ``TooSlowError``, redis ``TimeoutError``,
    httpx/httpcore timeouts (``TimeoutException`` and subclasses), aiohttp
    ``ServerTimeoutError``, and gRPC errors whose ``code()`` is ``DEADLINE_EXCEEDED``.
    """
    return _carried(exc, _timeout)


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` says the dependency could not be reached or dropped the connection.

    Matches builtin :class:`ConnectionError` (refused, reset, aborted, broken pipe),
    ``OSError`` with a connection errno (``ECONNREFUSED``, ``ECONNRESET``, ``EPIPE``,
    ``ENETUNREACH``, ``EHOSTUNREACH``...) or asyncio's "Connect call failed", redis
    ``ConnectionError``/``TimeoutError`` (pool exhausted included), gRPC ``UNAVAILABLE``,
    httpx ``ConnectError``/``ConnectTimeout``/``PoolTimeout``, aiohttp connection errors,
    name-resolution failures, and pool-exhausted errors of connection pools.
    """
    return _carried(exc, _connection)


def is_out_of_memory(exc: BaseException) -> bool:
    """True when ``exc`` says the call ran out of (host or accelerator) memory.

    Matches :class:`MemoryError`, ``OSError(ENOMEM)``, torch's ``OutOfMemoryError``,
    tensorflow's ``ResourceExhaustedError``, and ``RuntimeError`` s (or errors raised by torch,
    onnxruntime, tensorflow, jax) whose message says "out of memory", "can't allocate memory",
    "failed to allocate memory" (onnxruntime), ``CUBLAS_STATUS_ALLOC_FAILED`` or
    ``std::bad_alloc``.
    """
    return _carried(exc, _oom)


def counts_by_default(exc: BaseException) -> bool:
    """The classifier of a plain :class:`CircuitBreaker`: every error counts except the caller's.

    Not counted: ``ValueError`` (``ragguard.InvalidInput`` included) and ``TypeError`` (bad
    input), rejections by other ragguard layers (``BreakerOpen``, ``QuotaExceeded``,
    ``Overloaded``) that never reached the dependency, and ``DeadlineExceeded`` (the caller's
    budget, not the dependency).
    """
    return not isinstance(exc, _NOT_COUNTED)


_NOT_COUNTED = (ValueError, TypeError, BreakerOpen, QuotaExceeded, Overloaded, DeadlineExceeded)
"""What :func:`counts_by_default` passes through: the caller's bad input, ragguard's rejections
(one tuple built at import, not one per failed call)."""
