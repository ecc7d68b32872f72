"""The failure path: a call whose dependency refuses every attempt, 3 attempts, beside a hand-written
retry loop, main before issue 30 (or another commit: ``--against``), the pre-redesign code and the
stock libraries, in one interleaved run.

    .venv/bin/python benchmarks/failure_path.py [--ops 1000] [--rounds 15] [--against 9b27c28]

The bare hand-written loop does less than the full stack (no quota, deadline, attempt timer,
breaker or classification): ``hand_equal`` writes the full stack's work by hand, and the target
compares the full stack with it (and, stricter, with its variant that arms one timer per call).
Every contender makes 3 attempts at a coroutine raising ConnectionRefusedError (the full stack once
more with httpx's ConnectError, which its package's classifier reads), with a zero backoff
(one ``asyncio.sleep(0)`` between attempts), and ends with the error (no fallback); breakers are
configured so that they never open (they count, they do not reject). CPU time of the loop's thread
per failed call, median over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import sys
import time
from typing import Any

import aiobreaker
import httpx
import tenacity

import _against
import _baseline
import _bench
import ragguard
from _bench import Contender


async def refused(x: int = 1) -> int:
    raise ConnectionRefusedError("the store is down")


_REQUEST = httpx.Request("GET", "http://127.0.0.1:9/search")


async def refused_httpx(x: int = 1) -> int:
    """What an HTTP client's refused connection raises: an error its package's classifier reads
    (ragguard's own table knows ConnectionRefusedError by its type alone)."""
    raise httpx.ConnectError("All connection attempts failed", request=_REQUEST)


def _stage(mod: Any, *, full: bool, fn: Any = refused) -> Any:
    retry = mod.RetryPolicy(
        attempts=3, retry_on=("connection",), initial_backoff_s=0.0, jitter_s=0.0, budget_min_per_s=1e6
    )
    # a one-second time window that needs a million calls before it judges: it counts, never opens
    never_opens = mod.BreakerPolicy(kind="generic", window_type="time", window_size=1, minimum_calls=1_000_000)
    stage = mod.StagePolicy(
        timeout_s=2.0 if full else None,
        min_attempt_s=0.0,
        retry=retry,
        breaker=never_opens if full else mod.BreakerPolicy(kind="none"),
    )
    policy = mod.Policy(
        stages={"s": stage}, tenants={"acme": mod.TenantQuota(max_concurrency=64, rate_per_s=1e7, timeout_s=0.8)}
    )
    g = mod.Guard(policy, sleep=asyncio.sleep)
    call = g.guard("s")(fn)

    async def body() -> None:
        try:
            if full:
                async with g.tenant("acme"):
                    await call(1)
            else:
                await call(1)
        except (ConnectionRefusedError, httpx.ConnectError):
            pass

    return body, None


async def hand_loop() -> None:
    for attempt in range(3):
        try:
            await refused(1)
            return
        except ConnectionRefusedError:
            if attempt == 2:
                return
            await asyncio.sleep(0)


_KINDS = {ConnectionRefusedError: "failure", ConnectionResetError: "failure", TimeoutError: "timeout"}
"""The hand-written classification: an outcome per error type (as ragguard's table reads a
built-in error), the error's class hierarchy walked once for a type the table has not seen."""


def _kind_of(exc: BaseException) -> str:
    kind = _KINDS.get(type(exc))
    if kind is None:
        kind = next((_KINDS[k] for k in type(exc).__mro__ if k in _KINDS), "unknown")
        _KINDS[type(exc)] = kind
    return kind


class _Window:
    """The hand-written breaker's count: calls and failures in the current second."""

    __slots__ = ("calls", "failures", "open", "second")

    def __init__(self) -> None:
        self.second, self.calls, self.failures, self.open = -1, 0, 0, False

    def count(self, now: float, failed: bool, min_calls: int, threshold: float) -> None:
        second = int(now)
        if second != self.second:
            self.second, self.calls, self.failures = second, 0, 0
        self.calls += 1
        if failed:
            self.failures += 1
        if self.calls >= min_calls and self.failures >= threshold * self.calls:
            self.open = True


def hand_equal(*, timer_per_attempt: bool = True) -> Any:
    """The full stack's work written by hand, as lean as a careful engineer would write it: the
    tenant's concurrency slot and rate token (GCRA) and its 0.8 s deadline in a context variable
    (the tenant in another); a retry budget counting calls and retries per second; per attempt, a
    breaker permit, an attempt timer (``loop.call_at`` cancelling the task at min(2 s, the
    deadline), cancelled after), the error classified by its type, the breaker's count of calls
    and failures in its one-second window (judged once it has seen its minimum of calls), then the
    retry's decision: a retryable kind, attempts left, the deadline's time left, the budget;
    sleep(0) between attempts. ``timer_per_attempt=False``: one timer for the whole call, at the
    deadline (what bounds every attempt here, the deadline being shorter than the attempt
    timeout: a shortcut the stage cannot take in general)."""
    clock = time.monotonic
    deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("deadline", default=None)
    tenant_of: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)
    interval, burst, max_slots = 1 / 1e7, 1.0, 64
    slots, tat = [0], [0.0]
    window, spent = _Window(), _Window()  # the breaker's, and the retry budget's (calls, retries)

    async def attempts(at: float, cancel: Any) -> None:
        loop = asyncio.get_running_loop()
        spent.count(clock(), False, 1 << 62, 1.0)
        for attempt in range(1, 4):
            if window.open:
                raise RuntimeError("breaker open")
            timer = loop.call_at(min(clock() + 2.0, at), cancel) if timer_per_attempt else None
            try:
                await refused(1)
                if timer is not None:
                    timer.cancel()
                window.count(clock(), False, 1_000_000, 0.5)
                return
            except ConnectionRefusedError as exc:
                if timer is not None:
                    timer.cancel()
                kind = _kind_of(exc)
                now = clock()
                window.count(now, kind in ("failure", "timeout"), 1_000_000, 0.5)
                if kind != "failure" or attempt == 3 or at - now < 0.001:
                    raise
                if spent.failures + 1 > 0.2 * spent.calls + 1e6:  # (failures: the retries taken)
                    raise
                spent.failures += 1
            await asyncio.sleep(0)

    async def body() -> None:
        now = clock()
        if slots[0] >= max_slots or max(tat[0], now) - now > burst:
            raise RuntimeError("over quota")
        tat[0] = max(tat[0], now) + interval
        slots[0] += 1
        at = now + 0.8
        token, who = deadline.set(at), tenant_of.set("acme")
        cancel = asyncio.current_task().cancel  # type: ignore[union-attr]
        timer = None if timer_per_attempt else asyncio.get_running_loop().call_at(at, cancel)
        try:
            await attempts(at, cancel)
        except ConnectionRefusedError:
            pass
        finally:
            if timer is not None:
                timer.cancel()
            tenant_of.reset(who)
            deadline.reset(token)
            slots[0] -= 1

    return body


async def tenacity_loop() -> None:
    try:
        async for attempt in tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(3), retry=tenacity.retry_if_exception_type(ConnectionError),
            sleep=asyncio.sleep, reraise=True,
        ):  # fmt: skip
            with attempt:
                await refused(1)
    except ConnectionRefusedError:
        pass


def natural() -> Any:
    breaker = aiobreaker.CircuitBreaker(fail_max=10**9)
    sem = asyncio.Semaphore(64)

    async def body() -> None:
        try:
            async with asyncio.timeout(0.8), sem:
                async for attempt in tenacity.AsyncRetrying(
                    stop=tenacity.stop_after_attempt(3), retry=tenacity.retry_if_exception_type(ConnectionError),
                    sleep=asyncio.sleep, reraise=True,
                ):  # fmt: skip
                    with attempt:
                        async with asyncio.timeout(2.0):
                            await breaker.call_async(refused, 1)
        except ConnectionRefusedError:
            pass

    return body


async def main(ops: int, rounds: int, against: str | None = None) -> int:
    _bench.header()
    newer = _against.load(against)
    old, note = _baseline.load()
    _bench.console.print(note, markup=False)
    retry_only, _ = _stage(ragguard, full=False)
    full, _ = _stage(ragguard, full=True)
    contenders = [
        Contender("hand-written loop", "for attempt in range(3): try/except, sleep(0)", hand_loop),
        Contender("hand-written, equal work", "the full stack's work by hand (hand_equal): quota, "
                  "deadline, budget, a timer, breaker count and classification per attempt", hand_equal()),
        Contender("hand-written, equal work, one timer", "the same, one timer per call at the deadline",
                  hand_equal(timer_per_attempt=False)),
        Contender("tenacity AsyncRetrying", "one per call, stop after 3, sleep(0)", tenacity_loop),
        Contender("ragguard retry stage", "a stage with retries only (3 attempts)", retry_only),
        Contender("ragguard full stack", "tenant quota+deadline, retry, breaker, 2 s attempt timeout",
                  full),
        Contender("ragguard full stack, httpx error", "the same, each attempt raising httpx.ConnectError",
                  _stage(ragguard, full=True, fn=refused_httpx)[0]),
        Contender("stock libraries, natural", "Semaphore+2 asyncio.timeout+tenacity+aiobreaker", natural()),
    ]  # fmt: skip
    if old is not None:
        old_retry, _ = _stage(old, full=False)
        old_full, _ = _stage(old, full=True)
        contenders[7:7] = [
            Contender("pre-redesign retry stage", "commit ba06c64, retries only", old_retry),
            Contender("pre-redesign full stack", "commit ba06c64, the same full stack", old_full),
        ]
    mine = {
        "ragguard retry stage": {"full": False},
        "ragguard full stack": {"full": True},
        "ragguard full stack, httpx error": {"full": True, "fn": refused_httpx},
    }
    if newer is not None and against is not None:
        contenders += [Contender(_against.named(name, against), f"at {against}", _stage(newer, **how)[0])
                       for name, how in mine.items()]  # fmt: skip
    results = await _bench.run_async(contenders, ops=ops, rounds=rounds, yield_every=0)
    _bench.print_table(results, "failure path: 3 failed attempts per call",
                       against=["hand-written loop", "hand-written, equal work"], unit="failed call")  # fmt: skip
    targets = [
        _bench.ratio_target(results, "retry stage vs a hand-written loop", "ragguard retry stage",
                            "hand-written loop", 2.0),
        _bench.ratio_target(results, "full stack failing vs a hand-written loop doing equal work",
                            "ragguard full stack", "hand-written, equal work", 2.0),
        _bench.ratio_target(results, "full stack failing vs the same with one timer per call",
                            "ragguard full stack", "hand-written, equal work, one timer", 2.0),
        _bench.ratio_target(results, "full stack failing vs the bare loop (it does less: no quota, "
                            "deadline, timer, breaker or classification)", "ragguard full stack",
                            "hand-written loop", 2.0),
    ]  # fmt: skip
    if old is not None:
        targets.append(_bench.ratio_target(results, "full stack failing vs pre-redesign (lower is better)",
                                           "ragguard full stack", "pre-redesign full stack", 1.0))
    if newer is not None and against is not None:
        targets += _against.targets(results, list(mine), against)
    _bench.print_targets(targets)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000, help="failed calls per contender per round")
    parser.add_argument("--rounds", type=int, default=15)
    _against.add_argument(parser, default=_baseline.PRE_ISSUE_30)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.ops, args.rounds, args.against)))
