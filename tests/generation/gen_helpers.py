"""Helpers of the generation-stage tests (imported as ``gen_helpers``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterable
from typing import Any, TypeVar

import ragguard
from ragguard import BreakerPolicy, FakeClock, GenerationPolicy, Policy, RetryPolicy, StagePolicy, TenantQuota
from ragguard.testing import EventRecorder

T = TypeVar("T")


Recorder = EventRecorder  # the fixtures' ``events``: ragguard.testing's recorder


def answer_policy(
    *,
    attempts: int = 1,
    timeout_s: float | None = None,
    tenants: dict[str, TenantQuota] | None = None,
    breaker: BreakerPolicy | None = None,
    **budgets: Any,
) -> Policy:
    """A policy with one stage ``answer`` on the generation preset (budgets as given, the rest
    off unless given), retries ``attempts``, and a generic breaker that trips on nothing here."""
    generation = GenerationPolicy(**{"first_item_s": None, "idle_s": None, "total_s": None, **budgets})
    return Policy(
        stages={
            "answer": StagePolicy(
                preset="generation",
                timeout_s=timeout_s,
                generation=generation,
                retry=RetryPolicy(attempts=attempts, retry_on=("connection", "timeout"), jitter_s=0),
                breaker=breaker or BreakerPolicy(kind="generic", minimum_calls=100),
            )
        },
        tenants=tenants or {},
    )


async def drive(clock: FakeClock, work: Awaitable[T], *, step: float = 0.01, limit_s: float = 10_000) -> T:
    """Await ``work`` while moving ``clock`` (``auto_advance=False``) forward ``step`` seconds each
    time the loop has run what was ready: every sleep and timer on the clock comes due in order, as
    in real time, at most ``step`` late. Gives up (cancels ``work``) past ``limit_s`` of clock time."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            for _ in range(4):
                await asyncio.sleep(0)
                if task.done():
                    break
            else:
                if clock() > limit_s:
                    task.cancel()
                clock.advance(step)
        return task.result()
    finally:
        if not task.done():
            task.cancel()


async def collect(stream: AsyncIterator[T], into: list[T] | None = None) -> list[T]:
    """Every item of ``stream`` (closed at the end, however it ends), appended to ``into`` as it
    comes, so a test still sees what arrived before an error."""
    got = into if into is not None else []
    try:
        async for item in stream:
            got.append(item)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return got


def words(text: str) -> Iterable[str]:
    return (w + " " for w in text.split())


def guard(policy: Policy, clock: FakeClock) -> ragguard.Guard:
    return ragguard.Guard(policy, clock=clock)
