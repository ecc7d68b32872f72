"""A layer from outside the package: examples/custom_layer.py's bulkhead (one file, its own
policy model and per-stage state, one ``register_layer`` call), and the hook itself."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import ragguard
from ragguard import ConfigError, FakeClock, Guard, Policy, StagePolicy
from ragguard import layers as layers_mod
from ragguard.layers import register_layer
from ragguard.layers._registry import unregister_layer
from ragguard.pipeline import NO_EXIT

pytestmark = [pytest.mark.timeout(60)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_layer.py"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def example() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("custom_layer_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # registers the layer
    try:
        yield module
    finally:
        unregister_layer("bulkhead")


def test_the_example_runs_and_refuses_the_third_call_of_the_stage() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "hit for a", "b...", "Overloaded", "hit for d", "max_concurrent=2 retry_after_s=0.1",
    ]  # fmt: skip


def test_the_layer_sits_where_it_was_registered(example: ModuleType) -> None:
    names = [name for name, _ in layers_mod.REGISTRY]
    assert names[names.index("quota") + 1] == "bulkhead"
    g = Guard(Policy.parse({"stages": {"search": {"layers": {"bulkhead": {"max_concurrent": 2}}}}}))

    async def fn() -> None:
        return None

    chain = g.stage("search").chain(layers_mod.Bound("search", fn, stream=False))
    assert "Bulkhead" in [type(layer).__name__ for layer in chain.layers]
    other = g.stage("other").chain(layers_mod.Bound("other", fn, stream=False))
    assert "Bulkhead" not in repr(other)  # not configured: not in the chain


@pytest.mark.anyio
async def test_it_acts_on_calls_and_streams_and_on_chains_compiled_before_it() -> None:
    clock = FakeClock()
    g = Guard(Policy.parse({"stages": {"s": {"layers": {}}}}), clock=clock)

    @g.guard("s")
    async def before(delay_s: float) -> str:
        await clock.sleep(delay_s)
        return "ok"

    assert await before(2.0) == "ok"  # compiled without the layer
    seen: list[str] = []

    class Count:
        scope = "call"

        def enter(self, call: Any) -> Any:
            seen.append(call.stage)
            return NO_EXIT  # nothing to undo: exit is not called

        async def enter_async(self, call: Any) -> None:  # pragma: no cover
            return None

        def exit(self, call: Any, token: Any, exc: BaseException | None) -> None:  # pragma: no cover
            return None

    register_layer("count", lambda stage, bound: Count(), before="chaos")
    try:
        assert await before(0.0) == "ok"
        assert seen == ["s"]  # the chain compiled before the registration was rebuilt
    finally:
        unregister_layer("count")
    assert await before(0.0) == "ok" and seen == ["s"]
    spec = importlib.util.spec_from_file_location("custom_layer_example_2", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        policy = Policy.parse({"stages": {"s": {"layers": {"bulkhead": {"max_concurrent": 1}}}}})
        g2 = Guard(policy, clock=clock)

        @g2.guard("s")
        async def call(fail: bool = False) -> str:
            await clock.sleep(0.1)
            if fail:
                raise ValueError("bad input")
            return "ok"

        @g2.guard("s")
        async def stream() -> Any:
            yield 1
            await clock.sleep(1.0)
            yield 2

        items = stream()
        assert await items.__anext__() == 1  # the open stream holds the stage's one slot
        with pytest.raises(ragguard.Overloaded) as refused:
            await call()  # another function of the stage: the same slots
        assert refused.value.reason == "bulkhead" and refused.value.stage == "s"
        assert [i async for i in items] == [2]
        assert await call() == "ok"  # the stream's end gave it back
        with pytest.raises(ValueError):
            await call(fail=True)
        assert await call() == "ok"  # and so did the failure
        task = asyncio.ensure_future(call())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await call() == "ok"  # and the cancellation
        slots = g2.stage("s").part("bulkhead", module.Slots)
        assert slots.in_use == 0
        assert Guard(policy, clock=clock).stage("s").part("bulkhead", module.Slots) is not slots  # per Guard
    finally:
        unregister_layer("bulkhead")


def test_the_options_are_validated_when_the_policy_loads(example: ModuleType) -> None:
    with pytest.raises(ConfigError, match="bulkhead") as bad:
        Policy.parse({"stages": {"search": {"layers": {"bulkhead": {"max_concurrent": 0}}}}})
    assert bad.value.field == "stages.search.layers.bulkhead.max_concurrent"
    with pytest.raises(ConfigError, match="expected a mapping"):
        StagePolicy(layers={"bulkhead": 0.5})
    # a name no layer has is kept (its layer may register later) and refused when a Guard is
    # built, before any call (see test_layer_registry.py for both orders)
    policy = Policy.parse({"stages": {"s": {"layers": {"nope": {}}}}})
    with pytest.raises(ConfigError, match="unknown layer 'nope'") as unknown:
        Guard(policy)
    assert unknown.value.field == "stages.s.layers.nope"
    misspelt = Policy.parse({"stages": {"s": {"layers": {"retyr": {"attempts": 2}}}}})
    with pytest.raises(ConfigError, match="did you mean 'retry'") as near:
        Guard(misspelt)
    assert near.value.field == "stages.s.layers.retyr"
    with pytest.raises(ConfigError, match="unknown layer 'nope'") as default:
        Guard(Policy.parse({"default_stage": {"layers": {"nope": {}}}}))
    assert default.value.field == "default_stage.layers.nope"


def test_register_layer_refuses_bad_registrations() -> None:
    def build(stage: Any, bound: Any) -> None:
        return None

    with pytest.raises(ConfigError, match="built-in"):
        register_layer("retry", build, before="breaker")
    with pytest.raises(ConfigError, match="exactly one of before= or after="):
        register_layer("mine", build)
    with pytest.raises(ConfigError, match="no layer 'nowhere'"):
        register_layer("mine", build, after="nowhere")
    with pytest.raises(ConfigError, match="identifier"):
        register_layer("my layer", build, after="observe")
    with pytest.raises(ConfigError, match="build must be a function"):
        register_layer("mine", None, after="observe")  # type: ignore[arg-type]
    assert "mine" not in [n for n, _ in layers_mod.REGISTRY]


def test_register_again_replaces_in_place_and_unregister_removes() -> None:
    def build(stage: Any, bound: Any) -> None:
        return None

    try:
        register_layer("mine", build, before="breaker")
        register_layer("mine", build, before="timeout")
        names = [n for n, _ in layers_mod.REGISTRY]
        assert names.count("mine") == 1 and names.index("mine") == names.index("timeout") - 1
    finally:
        unregister_layer("mine")
    assert "mine" not in [n for n, _ in layers_mod.REGISTRY]
    assert ragguard.Guard().stage("s").layer_policy("mine") is None
