"""Time as a parameter.

Every breaker, quota and limiter takes a ``clock``: a callable returning monotonic seconds as a
float. Production uses :func:`time.monotonic`; tests use :class:`FakeClock` and advance it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Clock", "FakeClock", "monotonic"]

Clock = Callable[[], float]
monotonic: Clock = time.monotonic


class FakeClock:
    """A manual monotonic clock for tests: ``clock()`` returns the current time in seconds.

    >>> clock = FakeClock()
    >>> clock.advance(2.5)
    >>> clock()
    2.5
    """

    __slots__ = ("now",)

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0); raises ValueError when negative."""
        if seconds < 0:
            raise ValueError(f"FakeClock.advance: seconds must be >= 0, got {seconds}")
        self.now += seconds

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now})"
