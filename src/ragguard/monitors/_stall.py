"""Event-loop stall detector: a watchdog thread, and a heartbeat on the loop while it is busy.

Two modes, chosen at each loop heartbeat from the time the loop thread wanted a CPU since the
previous one (at least half the time means busy): the CPU time it used plus, on Linux, the time
it waited, runnable, for a CPU (``/proc``'s ``schedstat``), so a busy loop on a machine whose cores
are shared (a loaded host, a throttled container) is still busy; ``time.thread_time`` elsewhere:

* Idle mode (an I/O-bound service). Every ``check_interval_s`` (20 ms by default) the watchdog
  thread looks at the loop thread's innermost frame (``sys._current_frames()``). A loop waiting in
  its selector costs nothing more. A loop running code is sent a probe (``call_soon_threadsafe``)
  and the watchdog goes back to sleep without waiting for the answer; a probe still pending at the
  next heartbeat means a stall in progress, and the stack is sampled every ``sample_interval_s``
  until the probe is answered. The probe's lag, from the heartbeat that saw the loop busy, is the
  stall's duration. The loop itself only beats every 0.25 s, to re-check the mode.
* Busy mode (a CPU-heavy loop). The loop beats every ``check_interval_s`` (``call_later``) and
  measures each beat's lateness itself; each beat hands the GIL to the watchdog (wakes it and waits
  at most 1 ms for it), and the watchdog only samples the stack once a beat is half of
  ``threshold_s`` overdue (samples are kept only when the beat turns out a stall). A watchdog
  waking on its own timer could not win the GIL from a busy loop (released and taken back at
  every select) and would spin in futile wake-ups, burning a few % of a core.

A probe or timer that reaches the loop does not answer at once: it notes the time and re-queues
the beat (``call_soon``) behind every callback already ready, so a stall ends only when the loop
is back at its poll (at the beat; at the arrival when both the arrival's lag and the beat's delay
after it are under ``threshold_s``). Otherwise a probe landing between two callbacks of one
blocked iteration (the watchdog posts it whenever the loop thread lets go of the GIL, e.g. as
asyncio's debug mode stats source files for each new handle), or a timer run between two due
timers, would split one stall in two.

A stall's event also says, on Linux, how long the loop thread ran (``ran_s``) and how long it
waited, runnable, for a CPU (``waited_s``) over the stall (measured from the heartbeat or probe
before it, scaled down together to the stall's length when they add up to more): a stall the
thread spent mostly waiting for a CPU is CPU starvation (a loaded host, a throttled container),
whatever frame it was caught in; one it spent
neither running nor waiting for a CPU was blocked (a system call, a sleep, another thread holding
the GIL). Samples that land in this detector's own beat (which is what ends a stall) are dropped.

A stall's event names the frame seen most often in its samples, chosen in each sample as the
innermost frame of the application (outside the standard library, installed packages and the
loop's machinery: the user's code that called into them), else the innermost frame of an installed
library, else of ragguard's own code, else the innermost frame of Python's own (``origin``
says which: a stall whose stack holds only the standard library and asyncio ran no code of the
user's, and usually means the loop thread was starved of CPU or paused by the garbage
collector). A reported duration is
at most one ``check_interval_s`` short of the true stall (plus, on a loaded host, what the watchdog
thread waited for a CPU before it looked); every stall longer than ``threshold_s +
check_interval_s`` is caught, a shorter one only when a heartbeat falls in its first part. When a
loop turns busy, busy mode starts at its next heartbeat (within 0.25 s); until then a busy loop
can keep the watchdog from looking, and costs it a few % of a core. A busy-mode beat that finds
the loop just gone idle measures the process's wake-up delay (a process descheduled longer than
``threshold_s`` then reads as a stall). On uvloop an idle loop waits in C code that shows no Python
frame; the watchdog probes such a loop only when its thread used CPU since the last heartbeat
(where ``time.pthread_getcpuclockid`` exists, else always), so a C callback blocking without CPU
and without a Python frame goes unseen there. The detector uses only public asyncio calls and a
thread, so it behaves the same with asyncio's debug mode on or off, and on uvloop.
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
from types import CodeType, FrameType, TracebackType

from .. import _validate as v
from .. import events
from ._events import LoopStall

__all__ = ["StallDetector"]

_MAX_STACK = 12  # frames an event shows
_MAX_WALK = 64  # frames a sample holds: the user's frame can lie under a deep library stack
_BUSY_CPU_SHARE = 0.5  # a loop thread using this share of a core is busy
_IDLE_BEAT_S = 0.25  # heartbeat period while the loop is idle: re-checks the mode only
_HANDOFF_S = 0.001  # longest a busy beat waits for the watchdog to take the GIL
_Site = tuple[str, int, str]
_Stat = tuple[float, float]  # seconds the loop thread ran, and waited runnable for a CPU


APP, LIBRARY, RAGGUARD, RUNTIME = "app", "library", "ragguard", "runtime"
"""A frame's origin: the application's code, an installed package's, ragguard's own (its event
bus, quotas, front doors, monitors; not ``ragguard_tools.demo``, the demo's application), or Python's
own (the standard library, asyncio, the loop's machinery)."""


def _dirs(*paths: str) -> tuple[str, ...]:
    return tuple(sorted({os.path.join(os.path.realpath(d), "") for d in paths if d}))


def _site_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = [paths.get("purelib", ""), paths.get("platlib", "")]
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # pragma: no cover - old virtualenv's site module
        pass
    try:
        dirs.append(site.getusersitepackages())
    except AttributeError:  # pragma: no cover
        pass
    return _dirs(*dirs)


_SITE_DIRS = _site_dirs()
_STDLIB_DIRS = _dirs(
    sysconfig.get_paths().get("stdlib", ""),
    sysconfig.get_paths().get("platstdlib", ""),
    os.path.dirname(os.__file__),
)
_THIS_FILE = __file__  # a sample in the detector's own beat says nothing about what blocked
_PACKAGES_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
_RAGGUARD_DIRS = tuple(os.path.join(_PACKAGES_DIR, name, "") for name in ("ragguard", "ragguard_tools"))
_DEMO_DIR = os.path.join(_PACKAGES_DIR, "ragguard_tools", "demo", "")  # its tools are ragguard's
_LOOP_DIRS = (
    os.path.join(os.path.dirname(os.path.realpath(asyncio.__file__)), ""),
    os.path.join("uvloop", ""),
)
_origin_cache: dict[str, str] = {}
_OPAQUE: _Site = ("", 0, "")
_OPAQUE_TEXT = "(C code run by the loop: no Python frame to name)"
_RANK = {APP: 0, LIBRARY: 1, RAGGUARD: 2, RUNTIME: 3}
_LOOP_RANK = 4


def _origin(filename: str) -> str:
    """Where ``filename``'s code comes from: :data:`APP`, :data:`LIBRARY`, :data:`RAGGUARD` or
    :data:`RUNTIME`.

    ragguard is looked for first (installed or not), then installed packages: outside a virtual
    environment site-packages lies inside the standard library's folder. uvloop, installed, is
    the loop's machinery: RUNTIME.
    """
    known = _origin_cache.get(filename)
    if known is None:
        known = _classify(filename)
        if len(_origin_cache) < 4096:
            _origin_cache[filename] = known
    return known


def _classify(filename: str) -> str:
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>: no file of the user's
        return RUNTIME if filename.startswith("<frozen") else LIBRARY
    if _is_loop_machinery(filename):
        return RUNTIME
    real = os.path.realpath(filename)
    if real.startswith(_RAGGUARD_DIRS):
        return APP if real.startswith(_DEMO_DIR) else RAGGUARD
    if real.startswith(_SITE_DIRS):
        return LIBRARY
    if real.startswith(_STDLIB_DIRS):
        return RUNTIME
    return APP


def _is_app(filename: str) -> bool:
    """True for application code: not the stdlib, not an installed library, not ragguard's."""
    return _origin(filename) == APP


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
        self.threshold_s = v.seconds("threshold_s", threshold_s)
        self.check_interval_s = v.seconds("check_interval_s", check_interval_s)
        self.sample_interval_s = v.seconds(
            "sample_interval_s", threshold_s if sample_interval_s is None else sample_interval_s
        )
        self._bus = events.bus if bus is None else bus
        self.stalls = 0
        """Stalls detected so far."""
        self.probes = 0
        """Probes sent to the loop (idle-mode heartbeats that found it running code)."""
        self.max_lag_s = 0.0
        """The largest heartbeat lag seen, in seconds."""

        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_tid = 0
        self._loop_cpu_clock: int | None = None
        self._demand_fd: int | None = None  # the loop thread's /proc schedstat, while started
        # The frames under the loop (id -> code): a sample stops there. The code is checked too:
        # the frame that ran start()'s callback is gone once it returns, and a later frame (a
        # sample's innermost one, even) can reuse its id, which cut samples short at random.
        self._base: dict[int, CodeType] = {}
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # Shared between the loop and the watchdog (written under _lock, read as single attributes):
        self._seq = 0  # heartbeats run on the loop (and stops) so far; a change ends a stall's sampling
        self._due = 0.0  # when the pending beat became runnable (time.monotonic); 0.0: none
        self._probe_sent = 0.0  # when the pending probe was posted; 0.0: none
        self._busy = False  # busy mode: the loop beats every check_interval_s and hands over
        self._samples: list[tuple[_Site, ...]] = []
        self._handoff = threading.Lock()  # held; a busy beat (or stop) releases it to wake the watchdog
        self._resume = threading.Lock()  # held; the watchdog releases it to let a handing-over beat go on
        # Loop side only:
        self._timer: asyncio.TimerHandle | None = None
        self._beat_at = 0.0
        self._beat_cpu = 0.0
        self._beat_stat: _Stat | None = None  # the loop thread's schedstat at the last beat
        self._probe_stat: _Stat | None = None  # ... when the pending probe was posted

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> StallDetector:
        """Start watching the running loop of the calling thread; returns self."""
        if self._loop is not None:
            raise RuntimeError("StallDetector is already started")
        self._loop = loop = asyncio.get_running_loop()
        self._loop_tid = threading.get_ident()
        self._loop_cpu_clock = _cpu_clock_of(self._loop_tid)
        self._demand_fd = _open_schedstat()
        self._base = {id(f): f.f_code for f in _frames_below_loop(sys._getframe(1))}
        self._handoff.acquire(blocking=False)
        self._resume.acquire(blocking=False)
        with self._lock:
            self._probe_sent = 0.0
            self._busy = False
            self._samples = []
            stat = self._stat()
            self._schedule(loop, time.monotonic(), _demand(stat), stat, _IDLE_BEAT_S)
        self._thread = threading.Thread(target=self._watch, name="ragguard-stall-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching; safe to call twice. The watchdog thread exits within a heartbeat."""
        with self._lock:
            self._due = self._probe_sent = 0.0
            self._seq += 1  # timers, probes and beats still queued answer nothing
            self._busy = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._thread is not None:
            self._thread = None
            _release(self._handoff)
        fd, self._demand_fd = self._demand_fd, None  # first: the watchdog may read it meanwhile
        if fd is not None:
            os.close(fd)
        self._loop = None
        self._base = {}

    async def __aenter__(self) -> StallDetector:
        return self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- the loop side ---------------------------------------------------------------------------
    #
    # A heartbeat chain (call_later) runs on the loop. While the loop is busy (its thread used at
    # least half of a core since the previous beat) it beats every check_interval_s, measures its
    # own lateness, and at each beat hands the GIL to the watchdog: it wakes the watchdog and
    # waits (at most _HANDOFF_S) until the watchdog ran. Without that hand-over a watchdog waking
    # on its own timer could not win the GIL from a busy loop (released and retaken at every
    # select) and would spin in futile wake-ups, burning a few % of a core while seeing nothing.
    # While the loop is idle the chain only beats every _IDLE_BEAT_S to re-check the mode. Timer
    # and probe go through _arrive, which queues the beat itself behind every ready callback.

    def _schedule(
        self, loop: asyncio.AbstractEventLoop, now: float, cpu: float, stat: _Stat | None, interval: float
    ) -> None:
        self._beat_at, self._beat_cpu, self._beat_stat = now, cpu, stat
        self._due = now + interval
        self._timer = loop.call_later(interval, self._arrive, self._seq)

    def _arrive(self, seq: int) -> None:
        """The timer or a probe reached the loop: queue the beat behind every ready callback.

        Reaching the loop is not the end of a stall: the probe (posted from the watchdog thread)
        can land in the ready queue between callbacks of one blocked iteration, and the timer can
        run between two due timers, or before the ready callbacks on uvloop. ``call_soon`` from
        here runs after all the callbacks already ready, so the beat sees the loop back at its
        poll. ``seq`` is the beat this arrival answers; the later of timer and probe is ignored.
        """
        loop = self._loop
        if loop is not None and seq == self._seq:
            loop.call_soon(self._beat, seq, time.monotonic())

    def _beat(self, seq: int, arrived: float) -> None:
        now, stat = time.monotonic(), self._stat()
        cpu = _demand(stat)
        loop = self._loop
        with self._lock:
            if loop is None or seq != self._seq:
                return  # stopped, or the other arrival (timer or probe) already beat
            if self._probe_sent:  # answers the probe, whichever of probe and timer came first
                due, reporting, self._probe_sent = self._probe_sent, True, 0.0
                before = self._probe_stat
            else:
                due, reporting = self._due, self._busy
                before = self._beat_stat
            # The stall lasts until now when the arrival was already late (a stall in progress,
            # maybe mid-iteration) or the loop stayed blocked after it (the arrival ran between
            # the callbacks of a long iteration). When both are short, the loop was back at its
            # poll around the arrival: two short iterations never add up to a stall.
            late = arrived - due > self.threshold_s or now - arrived > self.threshold_s
            ended = now if late else arrived
            self._seq += 1
            samples, self._samples = self._samples, []
            busy = cpu - self._beat_cpu >= _BUSY_CPU_SHARE * (now - self._beat_at)
            self._busy = busy
            if self._timer is not None:
                self._timer.cancel()
            self._schedule(loop, now, cpu, stat, self.check_interval_s if busy else _IDLE_BEAT_S)
        if busy:
            _release(self._handoff)
            self._resume.acquire(timeout=_HANDOFF_S)
        if not reporting:
            return
        lag = ended - due
        if lag > self.max_lag_s:
            self.max_lag_s = lag
        if lag <= self.threshold_s:
            return
        self.stalls += 1
        if self._bus.active:
            self._bus.emit(_stall_event(due, ended, samples, _spent(before, stat)))

    # -- the watchdog thread ---------------------------------------------------------------------

    def _watch(self) -> None:
        me = threading.current_thread()
        handoff, interval, threshold = self._handoff, self.check_interval_s, self.threshold_s
        cpu_seen = (time.monotonic(), self._loop_cpu())
        running = True
        while True:
            with self._lock:
                seq, busy, due = self._seq, self._busy and running, self._due
            # Busy: sample from half the threshold past the beat's due time, so a stall just over
            # the threshold is still caught (a sample is kept only if the beat turns out late).
            wait = max(0.0, due + threshold / 2 - time.monotonic()) if busy else interval
            if handoff.acquire(timeout=wait):
                if self._thread is not me:
                    return
                _release(self._resume)
                continue
            loop = self._loop
            if self._thread is not me or loop is None or loop.is_closed():
                return
            running = loop.is_running()
            if busy:
                if self._seq == seq and running:  # the beat is overdue: a stall in progress
                    self._sample_stall(seq)
                continue
            if self._probe_sent:  # the probe posted at the previous heartbeat is still pending
                self._sample_stall(seq)
                continue
            if not running:
                continue
            first = self._sample()
            if first == () and self._loop_cpu_clock is not None:
                # Only the loop's own frame shows (uvloop): idle in C, or running C code. Probe
                # only when the loop thread used CPU since the last look.
                last, cpu_seen = cpu_seen, (time.monotonic(), self._loop_cpu())
                if cpu_seen[1] - last[1] < _BUSY_CPU_SHARE * (cpu_seen[0] - last[0]):
                    continue
            if first is not None:
                self._post_probe(loop, first)

    def _post_probe(self, loop: asyncio.AbstractEventLoop, first: tuple[_Site, ...]) -> None:
        self.probes += 1
        stat = _read_stat(self._demand_fd)
        with self._lock:
            self._samples = [first]
            self._probe_stat = stat
            self._probe_sent = time.monotonic()
            seq = self._seq
        try:
            loop.call_soon_threadsafe(self._arrive, seq)
        except RuntimeError:  # the loop closed meanwhile
            self._probe_sent = 0.0

    def _sample_stall(self, seq: int) -> None:
        """Sample the stack every ``sample_interval_s`` until the loop's next heartbeat (seq + 1)."""
        me = threading.current_thread()
        while True:
            sample = self._sample()
            with self._lock:
                if self._seq != seq:
                    return
                if sample is not None:
                    self._samples.append(sample)
            if self._handoff.acquire(timeout=self.sample_interval_s):
                if self._thread is me:
                    _release(self._resume)
                return

    def _sample(self) -> tuple[_Site, ...] | None:
        """The loop thread's stack above the loop, innermost first.

        None when the loop provably waits in its own poll (a Python selector) or runs this
        detector's beat (which is what ends a stall: a sample there names nothing that blocked);
        ``()`` when only the frame that runs the loop is visible (uvloop idling or running C
        code: opaque).
        """
        frame: FrameType | None = sys._current_frames().get(self._loop_tid)
        if frame is None or frame.f_code.co_filename.endswith("selectors.py"):
            return None
        base = self._base
        out: list[_Site] = []
        while frame is not None and len(out) < _MAX_WALK and base.get(id(frame)) is not frame.f_code:
            code = frame.f_code
            if code.co_filename == _THIS_FILE:
                return None  # the detector's own beat, which ends a stall: nothing that blocked
            out.append((code.co_filename, frame.f_lineno or 0, code.co_name))
            frame = frame.f_back
        return tuple(out)

    def _stat(self) -> _Stat | None:
        """The loop thread's schedstat (seconds run, seconds waited runnable for a CPU), read on
        the loop thread; None where it is missing (the file is closed at the first failure)."""
        fd = self._demand_fd
        stat = _read_stat(fd)
        if stat is None and fd is not None:
            self._demand_fd = None
            os.close(fd)
        return stat

    def _loop_cpu(self) -> float:
        clock = self._loop_cpu_clock
        if clock is None:
            return 0.0
        try:
            return time.clock_gettime(clock)
        except OSError:  # the loop thread ended
            return 0.0


def _cpu_clock_of(thread_id: int) -> int | None:
    """The CPU-time clock of a thread, where the platform has one (Linux, most Unixes)."""
    try:
        clock = time.pthread_getcpuclockid(thread_id)
        time.clock_gettime(clock)
    except (AttributeError, OSError):
        return None
    return clock


def _open_schedstat() -> int | None:
    """The calling thread's ``/proc/thread-self/schedstat`` (Linux: nanoseconds run, nanoseconds
    waited on a run queue, time slices) opened for ``os.pread``, or None where it is missing."""
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    except OSError:
        return None
    try:
        int(os.pread(fd, 64, 0).split()[1])
    except (OSError, ValueError, IndexError):
        os.close(fd)
        return None
    return fd


def _read_stat(fd: int | None) -> _Stat | None:
    """(seconds run, seconds waited runnable for a CPU) of the thread whose ``schedstat`` ``fd``
    is, from any thread; None without it."""
    if fd is None:
        return None
    try:
        ran_ns, waited_ns = os.pread(fd, 64, 0).split()[:2]
        return int(ran_ns) / 1e9, int(waited_ns) / 1e9
    except (OSError, ValueError):
        return None


def _demand(stat: _Stat | None) -> float:
    """Seconds the calling (loop) thread ran or waited, runnable, for a CPU: its schedstat's
    first two numbers where it has one, else its CPU time."""
    return time.thread_time() if stat is None else stat[0] + stat[1]


def _spent(before: _Stat | None, after: _Stat | None) -> _Stat | None:
    if before is None or after is None:
        return None
    return max(0.0, after[0] - before[0]), max(0.0, after[1] - before[1])


def _release(lock: threading.Lock) -> None:
    try:
        lock.release()
    except RuntimeError:  # already released, and not yet taken back
        pass


def _stall_event(
    started: float, ended: float, samples: list[tuple[_Site, ...]], spent: _Stat | None = None
) -> LoopStall:
    busy = [s for s in samples if s]
    origin = ""
    if busy:
        top = Counter(_pick(stack) for stack in busy).most_common(1)[0][0]
        stack = next(s for s in busy if _pick(s) == top)[:_MAX_STACK]
        frame = _describe(top)
        origin = _origin(top[0]) if top[0] else RUNTIME
    elif samples:
        top, stack, frame = _OPAQUE, (), _OPAQUE_TEXT
    else:  # the stall ended before the watchdog's first sample (see LoopStall.samples)
        top, stack, frame = _OPAQUE, (), ""
    duration = ended - started
    ran_s = waited_s = None
    if spent is not None:  # measured from the beat (or probe) before the stall: scaled to the stall
        ran_s, waited_s = spent
        over = (ran_s + waited_s) / duration if duration > 0 else 0.0
        if over > 1.0:
            ran_s, waited_s = ran_s / over, waited_s / over
    return LoopStall(
        duration_s=duration,
        started_at=started,
        at=ended,
        frame=frame,
        filename=top[0],
        lineno=top[1],
        function=top[2],
        stack=tuple(_describe(s) for s in stack),
        samples=len(samples),
        origin=origin,
        ran_s=ran_s,
        waited_s=waited_s,
    )


def _pick(stack: tuple[_Site, ...]) -> _Site:
    """The innermost application frame (the user's code that called into a library or the
    standard library), else the innermost frame of an installed library, else of ragguard,
    else the innermost frame outside the loop's machinery, else the innermost."""
    best: _Site | None = None
    best_rank = _LOOP_RANK + 1
    for site_ in stack:
        origin = _origin(site_[0])
        if origin == APP:
            return site_
        rank = _LOOP_RANK if origin == RUNTIME and _is_loop_machinery(site_[0]) else _RANK[origin]
        if rank < best_rank:
            best, best_rank = site_, rank
    return stack[0] if best is None else best


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

