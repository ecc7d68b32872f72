"""The stacks the benchmarks compare, built the same way everywhere: ragguard's full stack (now and
before the redesign), and the same layers composed from stock libraries or interlock-cb.

"The full stack" is one request of tenant ``acme`` (a concurrency limit of 64, a rate limit, a
0.8 s deadline) calling a ``vector_store`` stage with a 2.0 s attempt timeout, 3 attempts for
connection errors and timeouts, a circuit breaker and a keyword-search fallback. Every contender
below does that work; each says how in its ``does`` text. The stage's share of the deadline and
the reserve kept for its fallback (issue 31) are off here, so the comparisons with older code and
with stock libraries do equal work: ``deadline_budget.py`` measures what they cost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

import aiobreaker
import tenacity
from aiolimiter import AsyncLimiter

Body = Callable[[], Awaitable[Any]]

RETRYABLE = (ConnectionError, TimeoutError)


async def work(x: int = 1) -> int:
    return x


async def keyword_search(x: int = 1) -> int:
    return -x


def full_stack_guard(
    mod: ModuleType, fn: Callable[..., Awaitable[Any]] = work, *, max_concurrency: int = 64, **stage: Any
) -> tuple[Any, Body]:
    """``mod`` is ``ragguard`` or ``ragguard_baseline`` (same public API): the Guard, and one request
    through its full stack calling ``fn``. ``stage`` overrides StagePolicy fields."""
    options: dict[str, Any] = {
        "timeout_s": 2.0,
        "min_attempt_s": 0.01,
        "breaker": mod.BreakerPolicy(kind="vector_store_unavailable"),
        "retry": mod.RetryPolicy(attempts=3, retry_on=("connection", "timeout")),
    }
    options.update(_as_before(mod))
    options.update(stage)
    policy = mod.Policy(
        stages={"vector_store": mod.StagePolicy(**options)},
        tenants={"acme": mod.TenantQuota(max_concurrency=max_concurrency, rate_per_s=1e7, timeout_s=0.8)},
    )
    g = mod.Guard(policy)
    search = g.guard("vector_store", fallback=keyword_search)(fn)

    async def body() -> Any:
        async with g.tenant("acme"):
            return await search(1)

    return g, body


def _as_before(mod: ModuleType) -> dict[str, Any]:
    """``deadline_share`` and ``reserve`` off, where ``mod`` has them (older code has neither)."""
    fields = getattr(mod.StagePolicy, "model_fields", {})
    return {name: off for name, off in (("deadline_share", 1.0), ("reserve", 0)) if name in fields}


def nothing_configured(mod: ModuleType, fn: Callable[..., Awaitable[Any]] = work) -> Body:
    """A stage with nothing configured (no breaker, one attempt, no timeout, no quota)."""
    g = mod.Guard(mod.Policy(default_stage=mod.StagePolicy(breaker=mod.BreakerPolicy(kind="none"))))
    guarded = g.guard("plain")(fn)

    async def body() -> Any:
        return await guarded(1)

    return body


def natural_stack(fn: Callable[..., Awaitable[Any]] = work, *, max_concurrency: int = 64) -> Body:
    """The full stack from stock libraries as a user would first write it: a deadline and an
    attempt timer per call, a tenacity object per call."""
    limiter = AsyncLimiter(1e7, 1)
    sem = asyncio.Semaphore(max_concurrency)
    breaker = aiobreaker.CircuitBreaker(fail_max=5)

    async def body() -> Any:
        try:
            async with asyncio.timeout(0.8), sem, limiter:
                async for attempt in tenacity.AsyncRetrying(
                    stop=tenacity.stop_after_attempt(3),
                    retry=tenacity.retry_if_exception_type(RETRYABLE),
                    wait=tenacity.wait_exponential(multiplier=0.05, max=1.0),
                    reraise=True,
                ):
                    with attempt:
                        async with asyncio.timeout(2.0):
                            return await breaker.call_async(fn, 1)
        except (*RETRYABLE, aiobreaker.CircuitBreakerError):
            return await keyword_search(1)
        return None

    return body


def lean_stack(fn: Callable[..., Awaitable[Any]] = work, *, max_concurrency: int = 64) -> Body:
    """The same stock libraries written for speed: one timer (the deadline, shorter than the
    attempt timeout), tenacity built only after a first failure."""
    limiter = AsyncLimiter(1e7, 1)
    sem = asyncio.Semaphore(max_concurrency)
    breaker = aiobreaker.CircuitBreaker(fail_max=5)

    async def body() -> Any:
        try:
            async with sem, limiter, asyncio.timeout(0.8):
                try:
                    return await breaker.call_async(fn, 1)
                except RETRYABLE:
                    async for attempt in tenacity.AsyncRetrying(
                        stop=tenacity.stop_after_attempt(2),
                        retry=tenacity.retry_if_exception_type(RETRYABLE),
                        wait=tenacity.wait_exponential(multiplier=0.05, max=1.0),
                        reraise=True,
                    ):
                        with attempt:
                            return await breaker.call_async(fn, 1)
        except (*RETRYABLE, aiobreaker.CircuitBreakerError):
            return await keyword_search(1)
        return None

    return body


def interlock_stack(fn: Callable[..., Awaitable[Any]] = work, *, max_concurrency: int = 64) -> Body:
    """interlock-cb's resilience pipeline (fallback, retry, breaker, bulkhead, timeout), given the
    rate limit (aiolimiter) and the deadline (asyncio.timeout) it has no strategy for."""
    from interlock.breaker import CircuitBreaker as InterlockBreaker
    from interlock.pipeline import Pipeline

    pipeline = (
        Pipeline.builder()
        .fallback(lambda exc: -1)
        .retry(attempts=3)
        .circuit_breaker(InterlockBreaker(name="bench-pipeline"))
        .bulkhead(max_concurrency)
        .timeout(2.0)
        .build()
    )
    limiter = AsyncLimiter(1e7, 1)

    async def body() -> Any:
        async with asyncio.timeout(0.8), limiter:
            return await pipeline.call(fn, 1)

    return body
