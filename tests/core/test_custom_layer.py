"""A layer from outside the package: examples/custom_layer.py (one file, one policy model, one
``register_layer`` line), and the hook itself."""

from __future__ import annotations

import importlib.util
import logging
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
from ragguard.layers import register_layer, unregister_layer

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
        unregister_layer("slow_calls")


def test_the_example_runs_and_logs_only_the_slow_call_of_the_configured_stage() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    logged = [line for line in done.stderr.splitlines() if line.startswith("slow_calls:")]
    assert logged == ["slow_calls: stage 'search' took 1.500s (over 0.500s): ok"]
    assert "threshold_s=0.5" in done.stdout


def test_the_layer_sits_where_it_was_registered(example: ModuleType) -> None:
    names = [name for name, _ in layers_mod.REGISTRY]
    assert names[:3] == ["observe", "slow_calls", "fallback"]
    g = Guard(Policy.parse({"stages": {"search": {"layers": {"slow_calls": {"threshold_s": 0.5}}}}}))

    async def fn() -> None:
        return None

    chain = g.stage("search").chain(layers_mod.Bound("search", fn, stream=False))
    assert [type(layer).__name__ for layer in chain.layers][:1] == ["SlowCallLog"]
    other = g.stage("other").chain(layers_mod.Bound("other", fn, stream=False))
    assert "SlowCallLog" not in repr(other)  # not configured: not in the chain


@pytest.mark.anyio
async def test_it_acts_on_calls_and_streams_and_on_chains_compiled_before_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
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
        exits = False

        def enter(self, call: Any) -> None:
            seen.append(call.stage)

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
        policy = Policy.parse({"stages": {"s": {"layers": {"slow_calls": {"threshold_s": 1.0}}}}})
        g2 = Guard(policy, clock=clock)

        @g2.guard("s")
        async def call(delay_s: float) -> str:
            await clock.sleep(delay_s)
            return "ok"

        @g2.guard("s")
        async def stream(delay_s: float) -> Any:
            yield 1
            await clock.sleep(delay_s)
            yield 2

        with caplog.at_level(logging.WARNING, logger="slow_calls"):
            await call(0.5)
            await call(1.5)
            assert [i async for i in stream(3.0)] == [1, 2]
        assert [r.getMessage()[:30] for r in caplog.records] == [
            "stage 's' took 1.500s (over 1.",
            "stage 's' took 3.000s (over 1.",
        ]
    finally:
        unregister_layer("slow_calls")


def test_the_options_are_validated_when_the_policy_loads(example: ModuleType) -> None:
    with pytest.raises(ConfigError, match="slow_calls") as bad:
        Policy.parse({"stages": {"search": {"layers": {"slow_calls": {"threshold_s": -1}}}}})
    assert "threshold_s" in str(bad.value)
    with pytest.raises(ConfigError, match="expected a mapping"):
        StagePolicy(layers={"slow_calls": 0.5})
    # a name no layer has is kept (its layer may register later) and refused when a Guard builds
    # the stage (see test_layer_registry.py for both orders)
    policy = Policy.parse({"stages": {"s": {"layers": {"nope": {}}}}})
    with pytest.raises(ConfigError, match="unknown layer 'nope'") as unknown:
        Guard(policy).stage("s")
    assert unknown.value.field == "stages.s.layers.nope"


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
