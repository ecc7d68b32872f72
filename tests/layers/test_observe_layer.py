"""The observe layer: one StageCompleted per call, with its outcome and duration on the clock."""

from __future__ import annotations

import asyncio

import pytest
from layer_helpers import make_call

from ragguard import BreakerPolicy, FakeClock, Guard, Policy, StagePolicy
from ragguard._context import mark_degraded
from ragguard.events import StageCompleted
from ragguard.layers import Bound
from ragguard.layers._observe import ObserveLayer, build
from ragguard.testing import EventRecorder

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


async def test_each_outcome_is_reported_once_with_its_duration(events: EventRecorder) -> None:
    clock = FakeClock()
    g = Guard(Policy(stages={"s": StagePolicy(breaker=BreakerPolicy(kind="generic"))}), clock=clock)
    layer = build(g.stage("s"), Bound("s", make_call().fn, stream=False))
    assert isinstance(layer, ObserveLayer)
    call = make_call()
    for outcome in (None, ConnectionError("down"), asyncio.CancelledError()):
        token = layer.enter(call)
        clock.advance(0.25)
        assert layer.exit(call, token, outcome) is None  # never replaces the outcome
    token = layer.enter(call)
    mark_degraded("keyword")
    layer.exit(call, token, None)
    await events.settle()
    done = events.of(StageCompleted)
    assert [(e.stage, e.outcome, e.fallback) for e in done] == [
        ("s", "success", ""),
        ("s", "error", ""),
        ("s", "cancelled", ""),
        ("s", "fallback", "keyword"),
    ]
    assert [e.duration_s for e in done] == [0.25, 0.25, 0.25, 0.0]
    assert {e.breaker_state for e in done} == {"closed"}
    assert {e.tenant for e in done} == {"default"}


async def test_without_listeners_or_tracing_it_builds_nothing() -> None:
    layer = ObserveLayer("s", None, FakeClock())
    call = make_call()
    first, second = layer.enter(call), layer.enter(call)
    assert first[0] is second[0]  # the shared no-op span: nothing allocated per call
    layer.exit(call, first, None)


async def test_in_a_request_it_names_the_tenant_and_only_this_calls_fallback(events: EventRecorder) -> None:
    from ragguard import TenantQuota

    clock = FakeClock()
    g = Guard(Policy(tenants={"acme": TenantQuota(max_concurrency=2)}), clock=clock)
    layer = build(g.stage("s"), Bound("s", make_call().fn, stream=False))
    assert isinstance(layer, ObserveLayer)
    call = make_call()
    async with g.tenant("acme"):
        token = layer.enter(call)
        mark_degraded("cache")  # served this call
        layer.exit(call, token, None)
        token = layer.enter(call)  # the request already had a fallback: this call served none
        clock.advance(0.5)
        layer.exit(call, token, None)
    await events.settle()
    done = events.of(StageCompleted)
    assert [(e.tenant, e.outcome, e.fallback, e.duration_s) for e in done] == [
        ("acme", "fallback", "cache", 0.0),
        ("acme", "success", "", 0.5),
    ]
