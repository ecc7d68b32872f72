"""The circuit breaker alone, closed and open, beside the peers users pick, in one interleaved run.

    .venv/bin/python benchmarks/breaker_micro.py [--ops 5000] [--rounds 15] [--against COMMIT]

Closed: a successful call through each breaker, as each library documents it (purgatory with the
breaker fetched once, not per call). Open: a rejected call, caught. pybreaker is left out: its
``call_async`` runs only under Tornado's coroutines. CPU time of the loop's thread per call.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import aiobreaker
import circuitbreaker
from hyx.circuitbreaker import consecutive_breaker
from purgatory import AsyncCircuitBreakerFactory

import _against
import _bench
import ragguard
from _bench import Contender


async def ok() -> int:
    return 1


async def refused() -> int:
    raise ConnectionRefusedError("down")


async def ragguard_contenders(mod: Any) -> tuple[Any, Any]:
    """A closed breaker's call and a rejected one's, with ``mod``'s breakers."""
    ours = mod.breakers.CircuitBreaker("bench")
    opened = mod.breakers.VectorStoreUnavailableBreaker("bench-open", open_for_s=3600, minimum_calls=1)
    for _ in range(3):
        try:
            await opened.call(refused)
        except (ConnectionRefusedError, mod.BreakerOpen):
            pass

    async def rejected() -> None:
        try:
            await opened.call(ok)
        except mod.BreakerOpen:
            pass

    return (lambda: ours.call(ok)), rejected


async def main(ops: int, rounds: int, against: str | None = None) -> int:
    _bench.header()
    old = _against.load(against)
    ours_ok, ours_rejected = await ragguard_contenders(ragguard)
    aio = aiobreaker.CircuitBreaker(fail_max=5)
    cb_ok = circuitbreaker.CircuitBreaker(failure_threshold=5, recovery_timeout=30)(ok)
    purgatory = await AsyncCircuitBreakerFactory(default_threshold=5).get_breaker("bench")
    hyx_ok = consecutive_breaker(failure_threshold=5)(ok)

    async def purgatory_ok() -> Any:
        async with purgatory:
            return await ok()

    class Plain(Exception):
        pass

    async def plain() -> None:
        raise Plain

    async def floor() -> None:
        try:
            await plain()
        except Plain:
            pass

    aio_open = aiobreaker.CircuitBreaker(fail_max=1, timeout_duration=__import__("datetime").timedelta(hours=1))
    try:
        await aio_open.call_async(refused)
    except Exception:
        pass

    async def aio_rejected() -> None:
        try:
            await aio_open.call_async(ok)
        except aiobreaker.CircuitBreakerError:
            pass

    contenders = [
        Contender("bare await", "the call alone", ok),
        Contender("ragguard CircuitBreaker.call", "closed, sliding count window, slow-call timing", ours_ok),
        Contender("circuitbreaker", "closed, decorator (consecutive failures)", cb_ok),
        Contender("purgatory", "closed, async with (breaker fetched once)", purgatory_ok),
        Contender("aiobreaker", "closed, call_async", lambda: aio.call_async(ok)),
        Contender("hyx consecutive_breaker", "closed, decorator", hyx_ok),
        Contender("floor: raise+catch", "raise a plain exception through a coroutine, catch it", floor),
        Contender("ragguard rejected (open)", "BreakerOpen raised and caught", ours_rejected),
        Contender("aiobreaker rejected (open)", "CircuitBreakerError raised and caught", aio_rejected),
    ]  # fmt: skip
    mine = ["ragguard CircuitBreaker.call", "ragguard rejected (open)"]
    if old is not None and against is not None:
        old_ok, old_rejected = await ragguard_contenders(old)
        contenders += [Contender(_against.named(mine[0], against), f"closed, at {against}", old_ok),
                       Contender(_against.named(mine[1], against), f"rejected, at {against}", old_rejected)]
    results = await _bench.run_async(contenders, ops=ops, rounds=rounds)
    _bench.print_table(results, "breaker alone", against=["ragguard CircuitBreaker.call"], unit="call")
    peers = ["circuitbreaker", "purgatory", "aiobreaker", "hyx consecutive_breaker"]
    cheapest = min(peers, key=results.median)
    targets = [
        _bench.ratio_target(results, f"closed breaker vs the cheapest peer ({cheapest})",
                            "ragguard CircuitBreaker.call", cheapest, 1.0),
        _bench.ratio_target(results, "rejection vs the floor of raising a plain exception",
                            "ragguard rejected (open)", "floor: raise+catch", 1.5),
    ]  # fmt: skip
    if old is not None and against is not None:
        targets += _against.targets(results, mine, against)
    _bench.print_targets(targets)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=15)
    _against.add_argument(parser)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.ops, args.rounds, args.against)))
