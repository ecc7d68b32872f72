"""The chaos layer: a Guard's faults reach the innermost call (and a stream's opening)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from layer_helpers import Script, make_call

from ragguard import FakeClock, Guard, _inject
from ragguard.chaos import Chaos, EmptyResults, Error, Latency
from ragguard.layers import Bound
from ragguard.layers._chaos import ChaosLayer, build

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


class Seen:
    """An injector that records what it was asked and runs the call."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, bool]] = []

    async def __call__(self, stage: str, tenant: str, call: Any, *, stream: bool = False) -> Any:
        self.asked.append((stage, tenant, stream))
        return await call()


async def test_the_layer_passes_stage_tenant_and_whether_it_is_a_stream() -> None:
    seen = Seen()
    layer = ChaosLayer(seen)
    assert await layer.around(make_call(stage="search"), Script("hit")) == "hit"
    g = Guard()
    async with g.tenant("acme"):
        assert await layer.around(make_call(stage="tokens", stream=True), Script("first")) == "first"
    assert seen.asked == [("search", "default", False), ("tokens", "acme", True)]


async def test_faults_fire_through_the_layer_with_the_chaos_clock() -> None:
    clock = FakeClock()
    chaos = Chaos(rng=random.Random(0), sleep=clock.sleep)
    chaos.inject(Latency(2.0), stage="search")
    chaos.inject(Error(kind="connection_refused"), stage="broken")
    layer = ChaosLayer(chaos)
    assert await layer.around(make_call(stage="search"), Script("hit")) == "hit"
    assert clock() == 2.0
    proceed = Script("never")
    with pytest.raises(ConnectionRefusedError):
        await layer.around(make_call(stage="broken"), proceed)
    assert proceed.calls == 0


async def test_faults_that_rewrite_a_result_leave_a_streams_opening_alone() -> None:
    chaos = Chaos(rng=random.Random(0))
    handle = chaos.inject(EmptyResults(), stage="s")
    layer = ChaosLayer(chaos)
    assert await layer.around(make_call(stage="s"), Script(["a", "b"])) == []
    assert await layer.around(make_call(stage="s", stream=True), Script("head")) == "head"
    assert handle.injected == 1


def test_built_only_while_an_injector_applies_and_a_guards_own_wins() -> None:
    bound = Bound("s", make_call().fn, stream=False)
    g = Guard()
    assert build(g.stage("s"), bound) is None
    process, own = Seen(), Seen()
    _inject.install(process)
    try:
        layer = build(g.stage("s"), bound)
        assert layer is not None and layer.injector is process
        g.chaos = own
        layer = build(g.stage("s"), bound)
        assert layer is not None and layer.injector is own
    finally:
        _inject.uninstall(process)
    other = Guard()
    assert build(other.stage("s"), bound) is None  # g's own injector is g's alone


def test_install_on_a_guard_follows_disable_enable_and_uninstall() -> None:
    from ragguard import ConfigError

    g, other = Guard(), Guard()
    chaos = Chaos(rng=random.Random(0))
    assert chaos.install(g) is chaos
    assert g.chaos is chaos and other.chaos is None and _inject.active is None
    chaos.disable()
    assert g.chaos is None  # switched off: the Guard's calls pay nothing
    chaos.enable()
    assert g.chaos is chaos
    chaos.install(other)
    chaos.uninstall(other)
    assert other.chaos is None and g.chaos is chaos
    chaos.uninstall()  # everywhere it was installed
    assert g.chaos is None
    with pytest.raises(ConfigError, match=r"guard must be a ragguard\.Guard"):
        chaos.install("not a guard")
