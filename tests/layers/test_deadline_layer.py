"""The deadline layer: a call that cannot finish in time is refused before it queues."""

from __future__ import annotations

import pytest
from layer_helpers import make_call

from ragguard import DeadlineExceeded, FakeClock, Guard, Policy, StagePolicy, TenantQuota, deadline
from ragguard.layers import Bound
from ragguard.layers._deadline import DeadlineLayer, build
from ragguard.pipeline import NO_EXIT

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


async def test_without_a_deadline_every_call_passes() -> None:
    layer = DeadlineLayer("s", 0.5)
    assert layer.enter(make_call()) is NO_EXIT


async def test_a_call_with_less_than_min_attempt_s_left_is_refused() -> None:
    clock = FakeClock()
    layer = DeadlineLayer("s", 0.5)
    call = make_call()
    with deadline(2.0, clock=clock):
        assert layer.enter(call) is NO_EXIT
        clock.advance(1.5)  # exactly min_attempt_s left: may still start
        assert layer.enter(call) is NO_EXIT
        clock.advance(0.1)
        with pytest.raises(DeadlineExceeded) as short:
            layer.enter(call)
        assert short.value.stage == "s"
        assert short.value.budget_s == pytest.approx(0.4)
        clock.advance(1.0)
        with pytest.raises(DeadlineExceeded) as spent:
            layer.enter(call)
        assert spent.value.budget_s is None  # nothing left at all


async def test_a_spent_deadline_is_refused_even_with_min_attempt_zero() -> None:
    clock = FakeClock()
    layer = DeadlineLayer("s", 0.0)
    with deadline(1.0, clock=clock):
        clock.advance(1.0)
        with pytest.raises(DeadlineExceeded):
            layer.enter(make_call())


def test_the_layer_has_nothing_to_exit_and_is_built_only_where_a_call_can_queue() -> None:
    assert DeadlineLayer("s", 0.0).enter(make_call()) is NO_EXIT
    bound = Bound("s", make_call().fn, stream=False)
    assert build(Guard().stage("s"), bound) is None  # the timeout layer's check is the same check
    queued = Guard(
        Policy(default_quota=TenantQuota(max_concurrency=2), stages={"s": StagePolicy(min_attempt_s=0.25)})
    )
    layer = build(queued.stage("s"), bound)
    assert isinstance(layer, DeadlineLayer)
    assert layer._min_left == 0.25
