"""Cost of ragguard's monitors, each figure beside an unmonitored baseline from the same run.

1. Idle loop (the common case of an I/O-bound service): CPU seconds per wall second the process
   burns with the stall detector on, minus the same without it = share of one core it costs.
2. Busy loop (a CPU-heavy asyncio workload of many short tasks): wall time with / without the
   detector (a ratio; 1.00 = free), and the watchdog thread's own CPU time.
3. Redis pool bookkeeping: PINGs through a monitored pool vs a plain redis-py pool on a local
   redis-server (skipped when redis-server is missing).

Run: .venv/bin/python benchmarks/monitors_overhead.py [--idle-s 3] [--rounds 3]
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


async def _run_busy(tasks: int, steps: int, detector_on: bool) -> tuple[float, float, int]:
    """(wall s, watchdog CPU s, stalls) of one busy run."""
    detector = StallDetector().start() if detector_on else None
    thread = detector._thread if detector else None
    w0 = _thread_cpu_s(thread)
    t0 = time.perf_counter()
    try:
        await _busy_workload(tasks, steps)
        return time.perf_counter() - t0, _thread_cpu_s(thread) - w0, detector.stalls if detector else 0
    finally:
        if detector:
            detector.stop()


async def _busy(rounds: int) -> None:
    # 40 tasks: loop iterations of ~1 ms, a healthy busy service; 400 tasks: ~10 ms, a stalling one
    for tasks, steps, label in ((40, 800, "healthy"), (400, 80, "stalling")):
        base, mon, wd, stalls = [], [], [], []
        for _ in range(rounds):  # interleaved, so drift on a shared machine hits both alike
            base.append((await _run_busy(tasks, steps, False))[0])
            t, w, n = await _run_busy(tasks, steps, True)
            mon.append(t)
            wd.append(w)
            stalls.append(n)
        b, m = statistics.median(base), statistics.median(mon)
        print(
            f"busy loop   {label:8s} ({tasks} tasks) baseline {b * 1000:7.1f} ms | with detector "
            f"{m * 1000:7.1f} ms | ratio {m / b:.3f} | watchdog CPU {statistics.median(wd) / m * 100:.2f}% "
            f"of the run | stalls reported per run {statistics.median(stalls):.0f}"
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
            f"{(mon_cpu - base_cpu) * 100:.3f}% of a core (watchdog thread alone {wd_cpu * 100:.3f}%)"
        )
        await _busy(rounds)
        await _pool(rounds)
    finally:
        unsubscribe()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-s", type=float, default=3.0, help="seconds of idle loop to measure")
    parser.add_argument("--rounds", type=int, default=3, help="repetitions of the timed workloads")
    args = parser.parse_args()
    if args.idle_s <= 0 or args.rounds < 1:
        parser.error("--idle-s must be > 0 and --rounds >= 1")
    asyncio.run(main(args.idle_s, args.rounds))
