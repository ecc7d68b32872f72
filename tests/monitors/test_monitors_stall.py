"""The stall detector on a real loop: asyncio with debug off and on, and uvloop."""

from __future__ import annotations

import asyncio
import copy
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from monitors_helpers import LOOPS, Collected, Span, Waits, run_on

from ragguard import ConfigError
from ragguard.monitors import LoopStall, StallDetector


def _block_200ms() -> None:
    time.sleep(0.2)


def _cb_10ms() -> None:
    time.sleep(0.01)


async def _settle() -> None:
    for _ in range(3):  # let the bus deliver (call_soon) after the stall ends
        await asyncio.sleep(0.01)


# A stall's duration is checked against the blocking stretch as it really ran (a 200 ms sleep
# overshoots on a loaded machine) and may exceed it by what the loop thread then waited for a CPU
# before the loop came back (measured, 0 where Linux's schedstat is missing): the detector sees
# the whole lag, as a service would. In idle mode the watchdog finds a stall at its next look, one
# check interval into it at most, later by what the watchdog thread itself waited for a CPU
# (measured too): a stall's start, and so its duration, may be short by that much on a loaded host.


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", LOOPS)
def test_one_200ms_sleep_is_one_stall_naming_the_blocking_frame(kind: str, collected: Collected) -> None:
    blocked = Span()
    waited = Waits()

    async def main() -> StallDetector:
        async with StallDetector(bus=collected.bus) as detector:
            await asyncio.sleep(0.06)
            waited.mark(detector)
            with blocked:
                _block_200ms()
            await _settle()
            waited.mark(detector)
        return detector

    detector = run_on(kind, main)
    stalls = collected.of(LoopStall)
    assert len(stalls) == 1, stalls
    (stall,) = stalls
    shortest, longest = blocked.seconds - 0.03 - waited.watchdog_s, blocked.seconds + 0.06 + waited.loop_s
    assert shortest <= stall.duration_s <= longest
    assert stall.function == "_block_200ms"
    assert stall.filename == __file__
    assert stall.lineno == _block_200ms.__code__.co_firstlineno + 1
    assert stall.frame == f"{__file__}:{stall.lineno} in _block_200ms"
    assert stall.samples >= 5
    assert stall.at - stall.started_at == pytest.approx(stall.duration_s)
    assert detector.stalls == 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", LOOPS)
def test_ten_10ms_callbacks_in_one_iteration_are_one_stall(kind: str, collected: Collected) -> None:
    ran: list[Span] = []
    waited = Waits()

    def timed_cb_10ms() -> None:
        with Span() as span:
            _cb_10ms()
        ran.append(span)

    async def main() -> None:
        async with StallDetector(bus=collected.bus) as detector:
            await asyncio.sleep(0.06)
            loop = asyncio.get_running_loop()
            for _ in range(10):
                loop.call_soon(timed_cb_10ms)
            waited.mark(detector)
            await asyncio.sleep(0)  # the ten run back to back in the next iteration
            await _settle()
            waited.mark(detector)

    run_on(kind, main)
    stalls = collected.of(LoopStall)
    assert len(stalls) == 1, stalls
    assert len(ran) == 10
    blocked = ran[-1].ended - ran[0].started
    assert blocked - 0.025 - waited.watchdog_s <= stalls[0].duration_s <= blocked + 0.04 + waited.loop_s
    assert stalls[0].function == "_cb_10ms"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", LOOPS)
def test_probe_queued_between_the_callbacks_does_not_split_the_stall(kind: str, collected: Collected) -> None:
    # The task step queuing the ten callbacks lets go of the GIL for 27 ms after the first (as
    # asyncio's debug mode does, stat-ing source files for each handle): under the 50 ms
    # threshold, yet long enough for the watchdog's 10 ms look to see the loop running code, so its
    # probe lands in the ready queue between the first callback and the nine others. Answering it
    # there would cut the stall after the first callback and catch the rest 10 ms late or more.
    ran: list[tuple[float, float]] = []
    waited = Waits()

    def cb_10ms() -> None:
        started = time.monotonic()
        time.sleep(0.01)
        ran.append((started, time.monotonic()))

    async def main() -> StallDetector:
        options = {"threshold_s": 0.05, "check_interval_s": 0.01, "sample_interval_s": 0.001}
        async with StallDetector(bus=collected.bus, **options) as detector:
            await asyncio.sleep(0.06)
            loop = asyncio.get_running_loop()
            waited.mark(detector)
            loop.call_soon(cb_10ms)
            time.sleep(0.027)
            for _ in range(9):
                loop.call_soon(cb_10ms)
            await asyncio.sleep(0)
            await _settle()
            waited.mark(detector)
        return detector

    detector = run_on(kind, main)
    stalls = collected.of(LoopStall)
    assert len(stalls) == 1, stalls
    (stall,) = stalls
    assert len(ran) == 10
    # The whole blocked stretch: from at most one check interval (+ slack, + what the watchdog
    # waited for a CPU) into the first callback to the end of the last one.
    assert stall.started_at <= ran[0][0] + 0.016 + waited.watchdog_s, (stall, ran[0], waited.marks)
    assert stall.at >= ran[-1][1], (stall, ran[-1])
    assert stall.function == "cb_10ms"
    assert detector.probes >= 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", LOOPS)
def test_idle_loop_waiting_on_io_reports_nothing(kind: str, collected: Collected) -> None:
    async def main() -> StallDetector:
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        try:
            async with StallDetector(bus=collected.bus) as detector:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(reader.read(1), timeout=1.5)  # nothing ever arrives
                writer.close()
                await _settle()
            return detector
        finally:
            listener.close()

    detector = run_on(kind, main)
    assert collected.of(LoopStall) == []
    assert detector.stalls == 0
    if kind != "uvloop":  # an idle asyncio loop is seen in its selector: never woken by a probe
        assert detector.probes <= 2


def test_options_are_validated() -> None:
    for bad in (
        {"threshold_s": 0},
        {"threshold_s": -1.0},
        {"check_interval_s": float("nan")},
        {"sample_interval_s": float("inf")},
        {"threshold_s": True},
    ):
        with pytest.raises(ConfigError):
            StallDetector(**bad)  # type: ignore[arg-type]


def test_start_needs_a_running_loop_and_only_once() -> None:
    with pytest.raises(RuntimeError):
        StallDetector().start()

    async def main() -> None:
        detector = StallDetector().start()
        with pytest.raises(RuntimeError):
            detector.start()
        detector.stop()
        detector.stop()  # idempotent

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_no_listener_counts_but_builds_no_event() -> None:
    waited = Waits()

    async def main() -> StallDetector:
        from ragguard import events

        quiet = events.EventBus()
        async with StallDetector(bus=quiet) as detector:
            await asyncio.sleep(0.05)
            waited.mark(detector)
            time.sleep(0.2)  # long enough that a watchdog waiting for a CPU still catches it
            await _settle()
            waited.mark(detector)
        return detector

    detector = asyncio.run(main())
    assert detector.stalls == 1
    assert detector.max_lag_s >= 0.2 - 0.02 - waited.watchdog_s  # one check interval short at most


def _spin_60ms() -> None:
    end = time.perf_counter() + 0.06
    while time.perf_counter() < end:  # CPU-bound: holds the GIL, unlike time.sleep
        pass


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", LOOPS)
def test_cpu_bound_stall_in_a_busy_loop_is_caught_and_named(kind: str, collected: Collected) -> None:
    async def busy_for(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:  # bounded: short CPU slices, a healthy busy loop
            sum(range(200))
            await asyncio.sleep(0)

    spun = Span()
    waited = Waits()

    async def main() -> StallDetector:
        async with StallDetector(bus=collected.bus) as detector:
            workers = [asyncio.create_task(busy_for(0.7)) for _ in range(4)]
            await asyncio.sleep(0.4)  # busy mode by now (heartbeats every 20 ms, GIL handed over)
            waited.mark(detector)
            with spun:
                _spin_60ms()
            await asyncio.gather(*workers)
            await _settle()
            waited.mark(detector)
        return detector

    detector = run_on(kind, main)
    named = [s for s in collected.of(LoopStall) if s.function == "_spin_60ms"]
    assert len(named) == 1, collected.of(LoopStall)
    assert spun.seconds - 0.025 <= named[0].duration_s <= spun.seconds + 0.04 + waited.loop_s
    assert named[0].filename == __file__
    assert detector.probes <= 3  # busy mode measures with heartbeats, not probes


class _SleepsWhenCopied:
    """copy.deepcopy rebuilds it by calling time.sleep(0.2): the stdlib's copy.py blocks, called
    from deep inside copy.py's own recursion."""

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        return (time.sleep, (0.2,))


def _copy_deep_nest() -> None:
    nest: list[object] = [_SleepsWhenCopied()]
    for _ in range(12):  # 24 frames of copy.py between this function and the sleep
        nest = [nest]
    copy.deepcopy(nest)


@pytest.mark.timeout(30)
def test_the_users_frame_under_a_deep_stdlib_stack_is_named(collected: Collected) -> None:
    # user report: doctor blamed a stdlib frame; the application's frame that called into the
    # stdlib lay deeper than the 12 frames a sample kept
    async def main() -> None:
        async with StallDetector(bus=collected.bus):
            await asyncio.sleep(0.06)
            _copy_deep_nest()
            await _settle()

    run_on("asyncio", main)
    (stall,) = collected.of(LoopStall)
    assert stall.function == "_copy_deep_nest" and stall.filename == __file__, stall
    assert stall.origin == "app"
    assert len(stall.stack) == 12 and stall.stack[0].endswith("in _reconstruct")  # innermost first


@pytest.mark.timeout(30)
def test_a_stall_with_only_the_stdlib_on_the_stack_is_a_runtime_stall(collected: Collected) -> None:
    async def main() -> None:
        async with StallDetector(bus=collected.bus):
            await asyncio.sleep(0.06)
            asyncio.get_running_loop().call_soon(threading.Event().wait, 0.2)  # no frame of ours
            await asyncio.sleep(0.01)
            await _settle()

    run_on("asyncio", main)
    (stall,) = collected.of(LoopStall)
    assert stall.origin == "runtime", stall
    assert stall.filename == threading.__file__ and stall.function == "wait", stall
    mine = Collected()  # the plain case: the application's own frame

    async def blocked() -> None:
        async with StallDetector(bus=mine.bus):
            await asyncio.sleep(0.06)
            _block_200ms()
            await _settle()

    run_on("asyncio", blocked)
    assert [s.origin for s in mine.of(LoopStall)] == ["app"]


@pytest.mark.timeout(30)
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not os.path.exists("/proc/thread-self/schedstat"),
                    reason="Linux only: CPU affinity and /proc schedstat")
def test_a_busy_loop_on_a_shared_core_is_still_busy(collected: Collected) -> None:
    """Two other processes spin on the loop's core, so the loop thread gets about a third of it:
    less than the half a core the mode switch asks of its own CPU time, but it wants the CPU all
    the time. Its busy mode must hold (few probes, the stall caught whole), as on a loaded host."""
    core = min(os.sched_getaffinity(0))
    spin = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    saved = os.sched_getaffinity(0)
    spun = Span()
    waited = Waits()

    async def busy_for(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            sum(range(200))
            await asyncio.sleep(0)

    async def main() -> StallDetector:
        async with StallDetector(bus=collected.bus) as detector:
            workers = [asyncio.create_task(busy_for(1.2)) for _ in range(4)]
            await asyncio.sleep(0.8)
            waited.mark(detector)
            with spun:
                _spin_60ms()
            await asyncio.gather(*workers)
            await _settle()
            waited.mark(detector)
        return detector

    try:
        time.sleep(0.1)  # the hogs run
        os.sched_setaffinity(0, {core})  # this thread: the loop's (the watchdog inherits it)
        detector = run_on("asyncio", main)
    finally:
        os.sched_setaffinity(0, saved)
        for hog in hogs:
            hog.kill()
            hog.wait()
    named = [s for s in collected.of(LoopStall) if s.function == "_spin_60ms"]
    assert len(named) == 1, collected.of(LoopStall)
    assert spun.seconds - 0.025 <= named[0].duration_s <= spun.seconds + 0.04 + waited.loop_s
    assert detector.probes <= 3  # busy mode: heartbeats, not probes


def test_a_stalls_ran_and_waited_seconds_never_add_up_to_more_than_the_stall() -> None:
    from ragguard.monitors._stall import _stall_event

    # measured from the heartbeat before the stall: 60 ms of run and wait for a 40 ms stall
    stall = _stall_event(1.0, 1.04, [], (0.015, 0.045))
    assert stall.ran_s == pytest.approx(0.01) and stall.waited_s == pytest.approx(0.03)  # the same 1:3
    assert _stall_event(1.0, 1.04, [], (0.004, 0.02)).waited_s == pytest.approx(0.02)  # under: as measured
    assert _stall_event(1.0, 1.04, []).waited_s is None  # no schedstat: unknown
