"""Micro-benchmark of the circuit breaker core: nanoseconds per call, beside baselines.

Runs in one asyncio loop, in the same process and run:

* bare ``await fn()`` (the floor),
* aiobreaker 1.2 ``call_async`` (closed, success): the target to match or beat,
* ragguard ``CircuitBreaker.call`` closed + success (count and time windows),
* ragguard ``acquire()/on_result()`` (what ``@guard`` calls) closed + success,
* ragguard ``call`` and ``acquire`` rejected while open (target: under 1 µs),
* aiobreaker ``call_async`` rejected while open.

Each figure is the median of ``--repeats`` rounds of ``--n`` calls. Usage::

    python benchmarks/breaker_micro.py [--n 20000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

import aiobreaker

from ragguard import BreakerOpen
from ragguard.breakers import CircuitBreaker


async def ok() -> int:
    return 1


async def fail() -> int:
    raise ConnectionRefusedError("down")


async def _round(body: Callable[[], Awaitable[None]], n: int) -> float:
    start = time.perf_counter_ns()
    await body()
    return (time.perf_counter_ns() - start) / n


async def measure(make_body: Callable[[int], Callable[[], Awaitable[None]]], n: int, repeats: int) -> float:
    body = make_body(n)
    await _round(body, min(n, 2000))  # warm-up
    return statistics.median([await _round(body, n) for _ in range(repeats)])


def bare(n: int) -> Callable[[], Awaitable[None]]:
    async def body() -> None:
        for _ in range(n):
            await ok()

    return body


def ragguard_call(breaker: CircuitBreaker) -> Callable[[int], Callable[[], Awaitable[None]]]:
    def make(n: int) -> Callable[[], Awaitable[None]]:
        call = breaker.call

        async def body() -> None:
            for _ in range(n):
                await call(ok)

        return body

    return make


def ragguard_low_level(breaker: CircuitBreaker) -> Callable[[int], Callable[[], Awaitable[None]]]:
    def make(n: int) -> Callable[[], Awaitable[None]]:
        clock = breaker.clock

        async def body() -> None:
            for _ in range(n):
                token = breaker.acquire()
                start = clock()
                await ok()
                now = clock()
                breaker.on_result(token, now - start, None, now)

        return body

    return make


def ragguard_rejected(breaker: CircuitBreaker) -> Callable[[int], Callable[[], Awaitable[None]]]:
    def make(n: int) -> Callable[[], Awaitable[None]]:
        call = breaker.call

        async def body() -> None:
            for _ in range(n):
                try:
                    await call(ok)
                except BreakerOpen:
                    pass

        return body

    return make


def ragguard_acquire_rejected(breaker: CircuitBreaker) -> Callable[[int], Callable[[], Awaitable[None]]]:
    def make(n: int) -> Callable[[], Awaitable[None]]:
        acquire = breaker.acquire

        async def body() -> None:
            for _ in range(n):
                try:
                    acquire()
                except BreakerOpen:
                    pass

        return body

    return make


def aiobreaker_call(cb: aiobreaker.CircuitBreaker) -> Callable[[int], Callable[[], Awaitable[None]]]:
    def make(n: int) -> Callable[[], Awaitable[None]]:
        call = cb.call_async

        async def body() -> None:
            for _ in range(n):
                await call(ok)

        return body

    return make


def aiobreaker_rejected(cb: aiobreaker.CircuitBreaker) -> Callable[[int], Callable[[], Awaitable[None]]]:
    def make(n: int) -> Callable[[], Awaitable[None]]:
        call = cb.call_async

        async def body() -> None:
            for _ in range(n):
                try:
                    await call(ok)
                except aiobreaker.CircuitBreakerError:
                    pass

        return body

    return make


async def main(n: int, repeats: int) -> None:
    count_breaker = CircuitBreaker("bench-count", minimum_calls=10, window_size=100)
    time_breaker = CircuitBreaker("bench-time", window_type="time", window_size=60, minimum_calls=10)
    open_breaker = CircuitBreaker("bench-open", minimum_calls=1, window_size=1, open_for_s=3600)
    try:
        await open_breaker.call(fail)
    except ConnectionRefusedError:
        pass
    assert open_breaker.state == "open"

    aio_closed = aiobreaker.CircuitBreaker(fail_max=5, timeout_duration=timedelta(hours=1))
    aio_open = aiobreaker.CircuitBreaker(fail_max=1, timeout_duration=timedelta(hours=1))
    aio_open.open()

    baseline = await measure(bare, n, repeats)
    aio = await measure(aiobreaker_call(aio_closed), n, repeats)
    rows = [
        ("bare await", baseline),
        ("aiobreaker call_async, closed", aio),
        ("ragguard call, closed, count window", await measure(ragguard_call(count_breaker), n, repeats)),
        ("ragguard call, closed, time window", await measure(ragguard_call(time_breaker), n, repeats)),
        ("ragguard acquire/on_result, closed", await measure(ragguard_low_level(count_breaker), n, repeats)),
        ("aiobreaker call_async, open (rejected)", await measure(aiobreaker_rejected(aio_open), n, repeats)),
        ("ragguard call, open (rejected)", await measure(ragguard_rejected(open_breaker), n, repeats)),
        ("ragguard acquire, open (rejected)",
         await measure(ragguard_acquire_rejected(open_breaker), n, repeats)),
    ]
    print(f"{'case':<42}{'ns/call':>10}{'x bare':>9}{'x aiobreaker':>14}")
    for label, ns in rows:
        print(f"{label:<42}{ns:>10.0f}{ns / baseline:>9.1f}{ns / aio:>14.2f}")
    print(f"(n={n} calls per round, median of {repeats} rounds, one asyncio loop)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="calls per round (1..1,000,000)")
    parser.add_argument("--repeats", type=int, default=7, help="rounds per case (1..100)")
    args = parser.parse_args()
    if not 1 <= args.n <= 1_000_000 or not 1 <= args.repeats <= 100:
        parser.error("--n must be in 1..1,000,000 and --repeats in 1..100")
    asyncio.run(main(args.n, args.repeats))
