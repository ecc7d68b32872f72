"""Cost of ragguard's monitors, each figure beside an unmonitored baseline from the same run.

1. Idle loop (the common case of an I/O-bound service): CPU seconds per wall second the process
   burns with the stall detector on, minus the same without it = share of one core it costs, split
   into the watchdog thread and the loop thread (its idle heartbeats).
2. Busy loop (a CPU-heavy asyncio workload of many short tasks): wall time with / without the
   detector (a ratio; 1.00 = free), the watchdog thread's CPU and the loop thread's CPU with /
   without. "from start" includes the detector's first idle-mode heartbeat (it switches to busy
   mode within 0.25 s); "steady" starts it 0.3 s before the measured run.
3. Redis pool bookkeeping: PINGs through a monitored pool vs a plain redis-py pool on a local
   redis-server (skipped when redis-server is missing).

Run: .venv/bin/python benchmarks/monitors_overhead.py [--idle-s 3] [--rounds 5] [--loop uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

from ragguard import events
from ragguard.monitors import MonitoredBlockingConnectionPool, StallDetector


def _thread_cpu_s(thread: threading.Thread | None) -> float:
    if thread is None or thread.ident is None:
        return 0.0
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (AttributeError, OSError):  # not Linux, or the thread ended
        return float("nan")


async def _idle(seconds: float, monitored: bool) -> tuple[float, float]:
    """(process CPU s per wall s, watchdog thread CPU s per wall s) over an idle loop."""
    detector = StallDetector().start() if monitored else None
    try:
        await asyncio.sleep(0.05)
        thread = detector._thread if detector else None
        cpu0, wall0, w0 = time.process_time(), time.monotonic(), _thread_cpu_s(thread)
        await asyncio.sleep(seconds)
        wall = time.monotonic() - wall0
        return (time.process_time() - cpu0) / wall, (_thread_cpu_s(thread) - w0) / wall
    finally:
        if detector:
            detector.stop()


def _cpu_chunk() -> int:
    return sum(i * i for i in range(300))


async def _busy_workload(tasks: int, steps: int = 100) -> None:
    async def worker() -> None:
        for _ in range(steps):
            _cpu_chunk()
            await asyncio.sleep(0)

    await asyncio.gather(*(worker() for _ in range(tasks)))


async def _run_busy(
    tasks: int, steps: int, detector_on: bool, warm_s: float
) -> tuple[float, float, float, int]:
    """(wall s, watchdog CPU s, loop thread CPU s, stalls) of one busy run."""
    detector = StallDetector().start() if detector_on else None
    try:
        if warm_s:
            await _busy_workload(tasks, max(1, int(steps * warm_s / 0.4)))
        thread = detector._thread if detector else None
        w0, l0, stalls0 = _thread_cpu_s(thread), time.thread_time(), detector.stalls if detector else 0
        t0 = time.perf_counter()
        await _busy_workload(tasks, steps)
        wall = time.perf_counter() - t0
        stalls = detector.stalls - stalls0 if detector else 0
        return wall, _thread_cpu_s(thread) - w0, time.thread_time() - l0, stalls
    finally:
        if detector:
            detector.stop()


async def _busy(rounds: int) -> None:
    # 40 tasks: loop iterations of ~1 ms, a healthy busy service; 400 tasks: ~10 ms, a stalling one
    for tasks, steps, label in ((40, 800, "healthy"), (400, 80, "stalling")):
        for warm_s, when in ((0.0, "from start"), (0.3, "steady")):
            base, base_cpu, mon, mon_cpu, wd, stalls = [], [], [], [], [], []
            for _ in range(rounds):  # interleaved, so drift on a shared machine hits both alike
                t, _, c, _ = await _run_busy(tasks, steps, False, warm_s)
                base.append(t)
                base_cpu.append(c)
                t, w, c, n = await _run_busy(tasks, steps, True, warm_s)
                mon.append(t)
                mon_cpu.append(c)
                wd.append(w / t)
                stalls.append(n)
            b, m = statistics.median(base), statistics.median(mon)
            print(
                f"busy loop   {label:8s} ({tasks} tasks, {when:10s}) baseline {b * 1000:6.1f} ms | with "
                f"detector {m * 1000:6.1f} ms | ratio {m / b:.3f} | watchdog CPU "
                f"{statistics.median(wd) * 100:.2f}% of a core | loop thread CPU ratio "
                f"{statistics.median(mon_cpu) / statistics.median(base_cpu):.3f} | stalls per run "
                f"{statistics.median(stalls):.0f}"
            )


async def _pool(rounds: int, n: int = 3000) -> None:
    try:
        from ragguard.chaos._redis_server import RedisServer, RedisServerUnavailable
    except ImportError:
        print("redis pool  skipped (ragguard.chaos not available)")
        return
    import redis.asyncio as aioredis

    try:
        server = RedisServer()
        server.start()
    except (RedisServerUnavailable, OSError) as exc:
        print(f"redis pool  skipped ({exc})")
        return
    try:
        plain = aioredis.Redis(
            connection_pool=aioredis.BlockingConnectionPool(
                host=server.host, port=server.port, max_connections=8
            )
        )
        monitored = aioredis.Redis(
            connection_pool=MonitoredBlockingConnectionPool(
                host=server.host, port=server.port, max_connections=8, pool_name="bench"
            )
        )

        async def run(client: aioredis.Redis) -> float:
            async def one() -> None:
                for _ in range(n // 8):
                    await client.ping()

            t0 = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(8)))
            return time.perf_counter() - t0

        await run(plain)
        await run(monitored)
        p = statistics.median([await run(plain) for _ in range(rounds)])
        m = statistics.median([await run(monitored) for _ in range(rounds)])
        print(
            f"redis pool  plain {p / n * 1e6:7.1f} us/PING | monitored {m / n * 1e6:7.1f} us/PING "
            f"| ratio {m / p:.3f}"
        )
        await plain.aclose()
        await monitored.aclose()
    finally:
        server.stop()


async def main(idle_s: float, rounds: int) -> None:
    unsubscribe = events.bus.subscribe(lambda e: None)  # count event delivery in the cost
    try:
        base_cpu, _ = await _idle(idle_s, False)
        mon_cpu, wd_cpu = await _idle(idle_s, True)
        print(
            f"idle loop   baseline {base_cpu * 100:.3f}% of a core | with detector (defaults: "
            f"threshold 5 ms, heartbeat 20 ms) {mon_cpu * 100:.3f}% | cost "
            f"{(mon_cpu - base_cpu) * 100:.3f}% of a core (watchdog thread {wd_cpu * 100:.3f}%, "
            f"loop thread {(mon_cpu - base_cpu - wd_cpu) * 100:.3f}%)"
        )
        await _busy(rounds)
        await _pool(rounds)
    finally:
        unsubscribe()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-s", type=float, default=3.0, help="seconds of idle loop to measure")
    parser.add_argument("--rounds", type=int, default=5, help="repetitions of the timed workloads")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio", help="event loop")
    args = parser.parse_args()
    if args.idle_s <= 0 or args.rounds < 1:
        parser.error("--idle-s must be > 0 and --rounds >= 1")
    if args.loop == "uvloop":
        import uvloop

        print("loop: uvloop")
        uvloop.run(main(args.idle_s, args.rounds))
    else:
        asyncio.run(main(args.idle_s, args.rounds))
