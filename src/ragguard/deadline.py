"""Request deadlines that only shrink as a request moves through the pipeline.

A deadline is an absolute point on the :func:`time.monotonic` clock held in a context variable,
so it follows the request into child tasks. ``deadline(s)`` nests: the inner one can shorten the
budget, never extend it. Guarded stages read :func:`remaining` and give each attempt
``min(stage timeout, remaining)``; the block itself is not interrupted by ``deadline`` (only
guarded calls inside it are bounded), which matches how gRPC deadlines propagate.
"""

from __future__ import annotations

import math
import time
from contextvars import ContextVar, Token
from types import TracebackType

from ._errors import ConfigError
from ._validate import shown

__all__ = ["current_deadline", "deadline", "remaining"]

_deadline: ContextVar[float | None] = ContextVar("ragguard_deadline", default=None)
_monotonic = time.monotonic


def remaining() -> float | None:
    """Seconds left in the current deadline (>= 0.0), or None when no deadline is set."""
    at = _deadline.get()
    if at is None:
        return None
    left = at - _monotonic()
    return left if left > 0.0 else 0.0


def current_deadline() -> float | None:
    """The current deadline as an absolute :func:`time.monotonic` value, or None."""
    return _deadline.get()


class deadline:
    """Give the enclosed block at most ``seconds`` (a float >= 0, or None for no limit).

    Usable as ``with`` and ``async with``. A nested deadline never extends an outer one; None
    keeps the outer deadline unchanged. Raises :class:`~ragguard.ConfigError` (a ValueError)
    for a negative or NaN value.
    """

    __slots__ = ("_seconds", "_token", "expires_at")

    def __init__(self, seconds: float | None) -> None:
        if seconds is not None:
            if isinstance(seconds, (str, bytes, bool)):  # float() would take "2" and True
                raise ConfigError(f"deadline: seconds must be a number or None, got {shown(seconds)}")
            try:
                seconds = float(seconds)
            except OverflowError:  # an int past any float (10**400)
                raise ConfigError(
                    f"deadline: seconds must be a float-sized number or None, got {shown(seconds)}"
                ) from None
            except (TypeError, ValueError):
                rule = "deadline: seconds must be a number or None"
                raise ConfigError(f"{rule}, got {shown(seconds)}") from None
            if math.isnan(seconds) or seconds < 0:
                raise ConfigError(f"deadline: seconds must be >= 0, got {shown(seconds)}")
        self._seconds = seconds
        self._token: Token[float | None] | None = None
        self.expires_at: float | None = None

    def __enter__(self) -> deadline:
        if self._token is not None:
            raise RuntimeError("deadline(...) is not reentrant; create a new one per block")
        outer = _deadline.get()
        at = outer
        if self._seconds is not None and not math.isinf(self._seconds):
            mine = _monotonic() + self._seconds
            if outer is None or mine < outer:
                at = mine
        self.expires_at = at
        self._token = _deadline.set(at)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token, self._token = self._token, None
        if token is not None:
            _deadline.reset(token)

    async def __aenter__(self) -> deadline:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def remaining(self) -> float | None:
        """Seconds left in this block's effective deadline, or None without one."""
        if self.expires_at is None:
            return None
        return max(0.0, self.expires_at - _monotonic())
