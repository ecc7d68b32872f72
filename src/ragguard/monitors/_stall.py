"""Event-loop stall detector: a watchdog thread that looks at the loop and probes it when busy.

Every ``check_interval_s`` (the heartbeat, 20 ms by default) the watchdog thread looks at the
loop thread's innermost frame (``sys._current_frames()``). A loop waiting in its selector is idle
and costs nothing more: most heartbeats of an I/O-bound service end there, without waking the
loop. A loop running code is sent a probe (``call_soon_threadsafe``); the probe runs when the
loop finishes its current iteration, and its lag is how long the loop went without serving I/O.
While the probe is pending longer than ``threshold_s`` the watchdog samples the loop's stack
every ``sample_interval_s``, so the :class:`LoopStall` event names the blocking code (the
application frame seen most often), not only its length.

Measured from the heartbeat that first saw the loop busy, a reported duration is at most one
``check_interval_s`` short of the true stall. Every stall longer than ``threshold_s +
check_interval_s`` is caught; a shorter one only when a heartbeat lands in its first part.
On uvloop an idle loop waits in C code that shows no Python frame, so idle and "running C code"
look alike and such heartbeats probe the loop (slightly more cost; a process descheduled for
longer than ``threshold_s`` can then read as a stall). The detector uses only public asyncio
calls and a thread, so it behaves the same with asyncio's debug mode on or off, and on uvloop.
"""

from __future__ import annotations

import asyncio
import os
import site
import sys
import sysconfig
import threading
import time
from collections import Counter
from types import FrameType, TracebackType
from typing import Any

from .. import events
from .._errors import ConfigError
from ._events import LoopStall

__all__ = ["StallDetector"]

_MAX_STACK = 12
_Site = tuple[str, int, str]


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:  # pragma: no cover - old virtualenv's site module
        pass
    dirs.add(os.path.dirname(os.__file__))
    return tuple(sorted(os.path.join(os.path.realpath(d), "") for d in dirs if d))


_LIBRARY_DIRS = _library_dirs()
_OWN_DIR = os.path.join(os.path.dirname(os.path.realpath(__file__)), "")
_LOOP_DIRS = (
    os.path.join(os.path.dirname(os.path.realpath(asyncio.__file__)), ""),
    os.path.join("uvloop", ""),
)
_is_app_cache: dict[str, bool] = {}
_OPAQUE: _Site = ("", 0, "")
_OPAQUE_TEXT = "(C code run by the loop: no Python frame to name)"


def _is_app(filename: str) -> bool:
    """True for application code: not the stdlib, not an installed library, not this module."""
    known = _is_app_cache.get(filename)
    if known is None:
        real = os.path.realpath(filename) if not filename.startswith("<") else filename
        known = not (real.startswith(_LIBRARY_DIRS) or real.startswith(_OWN_DIR) or filename.startswith("<"))
        if len(_is_app_cache) < 4096:
            _is_app_cache[filename] = known
    return known


def _is_loop_machinery(filename: str) -> bool:
    return filename.endswith("selectors.py") or any(d in filename for d in _LOOP_DIRS)


def _describe(site_: _Site) -> str:
    filename, lineno, function = site_
    return f"{filename}:{lineno} in {function}"


class StallDetector:
    """Reports event-loop stalls longer than ``threshold_s`` as :class:`LoopStall` events.

    ``threshold_s`` (seconds, > 0, default 0.005): a loop iteration this long is a stall.
    ``check_interval_s`` (seconds, > 0, default 0.02): the watchdog's heartbeat period.
    ``sample_interval_s`` (seconds, > 0, default ``threshold_s``): stack sampling period while a
    stall is in progress. Events go to ``bus`` (default :data:`ragguard.events.bus`).
    Stalls are real-time phenomena, so the detector measures ``time.monotonic`` (no injected clock).

    Use ``async with StallDetector():`` or ``start()``/``stop()`` from inside the running loop.
    Raises :class:`ragguard.ConfigError` for a non-positive or non-finite option, RuntimeError
    when started outside a running loop or twice.
    """

    def __init__(
        self,
        *,
        threshold_s: float = 0.005,
        check_interval_s: float = 0.02,
        sample_interval_s: float | None = None,
        bus: events.EventBus | None = None,
    ) -> None:
        self.threshold_s = _positive("threshold_s", threshold_s)
        self.check_interval_s = _positive("check_interval_s", check_interval_s)
        self.sample_interval_s = _positive(
            "sample_interval_s", threshold_s if sample_interval_s is None else sample_interval_s
        )
        self._bus = events.bus if bus is None else bus
        self.stalls = 0
        """Stalls detected so far."""
        self.probes = 0
        """Probes sent to the loop (heartbeats that found it busy)."""
        self.max_lag_s = 0.0
        """The largest probe lag seen, in seconds."""

        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_tid = 0
        self._base_frames: tuple[FrameType, ...] = ()
        self._base_ids: frozenset[int] = frozenset()
        self._samples: list[tuple[_Site, ...]] = []
        self._lock = threading.Lock()
        self._sent = 0.0  # when the pending probe was posted (time.monotonic); 0.0: none pending
        self._wake = threading.Lock()  # held while running; released to stop the watchdog at once
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> StallDetector:
        """Start watching the running loop of the calling thread; returns self."""
        if self._loop is not None:
            raise RuntimeError("StallDetector is already started")
        self._loop = asyncio.get_running_loop()
        self._loop_tid = threading.get_ident()
        self._base_frames = _frames_below_loop(sys._getframe(1))
        self._base_ids = frozenset(id(f) for f in self._base_frames)
        self._sent = 0.0
        self._wake.acquire(blocking=False)
        self._thread = threading.Thread(target=self._watch, name="ragguard-stall-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the watchdog thread; safe to call twice."""
        with self._lock:
            self._sent = 0.0  # an answer still queued on the loop reports nothing
        thread, self._thread = self._thread, None
        if thread is not None:
            self._wake.release()
            if thread is not threading.current_thread():
                thread.join(timeout=1.0)
        self._loop = None
        self._base_frames = ()
        self._base_ids = frozenset()

    async def __aenter__(self) -> StallDetector:
        return self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- the watchdog thread ---------------------------------------------------------------------
    #
    # One wake per heartbeat, nothing posted while the loop idles, and the watchdog never blocks on
    # a probe's answer: a second wake would have to win the GIL back from a busy loop, which costs
    # more CPU than the wake itself. A probe still pending at the next heartbeat means a stall in
    # progress; only then does the watchdog wake more often, to sample the stack.

    def _watch(self) -> None:
        wake, interval = self._wake, self.check_interval_s
        while not wake.acquire(timeout=interval):
            loop = self._loop
            if loop is None or loop.is_closed():
                return
            sent = self._sent
            if sent:
                self._sample_stall(sent)
            elif loop.is_running():
                first = self._sample()
                if first is not None:
                    self._post_probe(loop, first)

    def _post_probe(self, loop: asyncio.AbstractEventLoop, first: tuple[_Site, ...]) -> None:
        self.probes += 1
        with self._lock:
            self._samples = [first]
            self._sent = time.monotonic()
        try:
            loop.call_soon_threadsafe(self._answer)
        except RuntimeError:  # the loop closed meanwhile
            self._sent = 0.0

    def _sample_stall(self, sent: float) -> None:
        """Sample the stack every ``sample_interval_s`` until the probe sent at ``sent`` is answered."""
        wake, interval = self._wake, self.sample_interval_s
        while True:
            sample = self._sample()
            with self._lock:
                if self._sent != sent:
                    return
                if sample is not None:
                    self._samples.append(sample)
            if wake.acquire(timeout=interval):
                wake.release()  # stopping: leave the signal to _watch
                return

    def _sample(self) -> tuple[_Site, ...] | None:
        """The loop thread's stack above the loop, innermost first.

        None when the loop provably waits in its own poll (a Python selector); ``()`` when only
        the frame that runs the loop is visible (uvloop idling or running C code: opaque).
        """
        frame: FrameType | None = sys._current_frames().get(self._loop_tid)
        if frame is None or frame.f_code.co_filename.endswith("selectors.py"):
            return None
        base = self._base_ids
        out: list[_Site] = []
        while frame is not None and len(out) < _MAX_STACK and id(frame) not in base:
            code = frame.f_code
            out.append((code.co_filename, frame.f_lineno or 0, code.co_name))
            frame = frame.f_back
        return tuple(out)

    # -- the loop side ---------------------------------------------------------------------------

    def _answer(self) -> None:
        now = time.monotonic()
        with self._lock:
            sent, self._sent = self._sent, 0.0
            samples, self._samples = self._samples, []
        if not sent:  # stopped meanwhile
            return
        lag = now - sent
        if lag > self.max_lag_s:
            self.max_lag_s = lag
        if lag <= self.threshold_s:
            return
        self.stalls += 1
        if self._bus.active:
            self._bus.emit(_stall_event(sent, now, samples))


def _stall_event(started: float, ended: float, samples: list[tuple[_Site, ...]]) -> LoopStall:
    busy = [s for s in samples if s]
    if busy:
        top = Counter(_pick(stack) for stack in busy).most_common(1)[0][0]
        stack = next(s for s in busy if _pick(s) == top)
        frame = _describe(top)
    else:
        top, stack, frame = _OPAQUE, (), _OPAQUE_TEXT
    return LoopStall(
        duration_s=ended - started,
        started_at=started,
        at=ended,
        frame=frame,
        filename=top[0],
        lineno=top[1],
        function=top[2],
        stack=tuple(_describe(s) for s in stack),
        samples=len(samples),
    )


def _pick(stack: tuple[_Site, ...]) -> _Site:
    """The innermost application frame, else the innermost frame outside the loop's machinery."""
    for site_ in stack:
        if _is_app(site_[0]):
            return site_
    for site_ in stack:
        if not _is_loop_machinery(site_[0]):
            return site_
    return stack[0]


def _frames_below_loop(frame: FrameType | None) -> tuple[FrameType, ...]:
    """The frames under the loop's run call (innermost when the loop idles in C, as on uvloop)."""
    chain: list[FrameType] = []
    while frame is not None:
        chain.append(frame)
        frame = frame.f_back
    coroutine_flags = 0x80 | 0x200  # CO_COROUTINE | CO_ASYNC_GENERATOR
    last = -1
    for i, f in enumerate(chain):
        if f.f_code.co_flags & coroutine_flags:
            last = i
    return tuple(chain[last + 1 :])


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise ConfigError(f"StallDetector: {name} must be a positive number of seconds, got {value!r}")
    return float(value)
