"""The monitors' events, emitted on :data:`ragguard.events.bus` beside the guard's own.

Times (``started_at``, ``at``, ``acquired_at``) are :func:`time.monotonic` seconds unless the
producer was given another ``clock``; durations are seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ConnectionLeak", "LoopStall", "PoolExhausted"]


@dataclass(frozen=True, slots=True)
class LoopStall:
    """The event loop ran no I/O or timers for ``duration_s`` seconds, ending at ``at``.

    ``frame`` names the blocking code as ``"file:line in function"`` (the innermost frame of the
    application seen most often while the stall was in progress, else of an installed library,
    else of ragguard's own, else of Python's own; ``""`` when no sample landed);
    ``stack`` holds up to 12 frames of that sample, innermost first, in the same form.
    ``samples`` is how many stack samples the watchdog took during the stall: 0 when the stall
    ended before the watchdog thread took one (it got no CPU or GIL in time: on a starved
    machine, or for a stall barely over the threshold). ``origin`` says
    whose code ``frame`` is: ``"app"`` (the application's: outside the standard library and
    installed packages; ``ragguard_tools.demo`` counts as an application), ``"library"`` (an installed
    package's, no frame of the application's on the stack), ``"ragguard"`` (ragguard's own code:
    its event bus, quotas, front doors, monitors; no frame of the application's or another
    library's), ``"runtime"`` (only the standard library, asyncio and the loop's machinery on the
    stack: no code of the user's ran, and the loop thread was most likely starved of CPU or paused
    by the garbage collector), or ``""`` (no frame seen).
    ``ran_s`` and ``waited_s`` are the seconds the loop thread ran, and waited runnable for a CPU,
    during the stall (Linux's schedstat, measured from the heartbeat or probe before it, scaled
    down together when they add up to more than ``duration_s``; None elsewhere): a stall mostly
    waited is CPU starvation, one neither run nor waited was the thread blocked (a system call, a
    sleep, the GIL held by another thread).
    """

    duration_s: float
    started_at: float
    at: float
    frame: str
    filename: str
    lineno: int
    function: str
    stack: tuple[str, ...] = ()
    samples: int = 0
    origin: str = ""
    ran_s: float | None = None
    waited_s: float | None = None


@dataclass(frozen=True, slots=True)
class PoolExhausted:
    """Redis pool ``pool`` ran short.

    ``reason`` is ``"headroom"`` (fewer than a third of ``max_connections`` still free),
    ``"slow_acquire"`` (a caller waited ``wait_s`` seconds, from ``started_at`` to ``at``, longer
    than the threshold), ``"timeout"`` (a blocking pool gave up on a caller) or
    ``"too_many_connections"`` (a non-blocking pool refused one).
    """

    pool: str
    reason: str
    in_use: int
    idle: int
    max_connections: int
    waiting: int
    wait_s: float
    started_at: float
    at: float


@dataclass(frozen=True, slots=True)
class ConnectionLeak:
    """A connection of pool ``pool`` has been held ``held_s`` seconds (since ``acquired_at``).

    ``stack`` is where it was acquired, innermost frame first, as ``"file:line in function"``;
    empty unless the pool was created with ``track_leaks=True``.
    """

    pool: str
    held_s: float
    acquired_at: float
    at: float
    stack: tuple[str, ...] = ()
