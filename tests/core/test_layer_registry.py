"""The layers' options models by name (ragguard.options._layers) and their builders
(ragguard.layers._registry), the options held by name in StagePolicy, and a user layer registered
before or after its policy is loaded."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ragguard import BreakerPolicy, ConfigError, Guard, HedgePolicy, Policy, RetryPolicy, StagePolicy
from ragguard import layers as layers_mod
from ragguard.layers import Bound
from ragguard.layers._registry import unregister_layer

pytestmark = [pytest.mark.timeout(60)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_layer.py"
ROOT = Path(__file__).resolve().parents[2]


def _load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("custom_layer_example_order", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its one register_layer call
    return module


@pytest.fixture
def unregistered() -> Iterator[None]:
    unregister_layer("bulkhead")
    yield
    unregister_layer("bulkhead")


def _chain_names(guard: Guard, stage: str) -> list[str]:
    async def fn() -> None:
        return None

    chain = guard.stage(stage).chain(Bound(stage, fn, stream=False))
    return [type(layer).__name__ for layer in chain.layers]


GOOD = {"stages": {"search": {"layers": {"bulkhead": {"max_concurrent": 2}}}}}
BAD = {"stages": {"search": {"layers": {"bulkhead": {"max_concurrent": 0}}}}}


def test_registered_before_the_policy_loads(unregistered: None) -> None:
    _load_example()
    policy = Policy.parse(GOOD)
    assert "Bulkhead" in _chain_names(Guard(policy), "search")
    with pytest.raises(ConfigError) as bad:
        Policy.parse(BAD)  # refused at load, naming the field
    assert bad.value.field == "stages.search.layers.bulkhead.max_concurrent"
    assert "greater than or equal to 1" in str(bad.value)


def test_registered_after_the_policy_loads(unregistered: None) -> None:
    policy = Policy.parse(GOOD)  # no such layer yet: its options are kept as given
    bad_policy = Policy.parse(BAD)
    with pytest.raises(ConfigError, match="unknown layer 'bulkhead'") as early:
        Guard(policy)  # and a Guard cannot be built while none is
    assert early.value.field == "stages.search.layers.bulkhead"
    module = _load_example()
    options = Guard(policy).stage("search").layer_policy("bulkhead")
    assert isinstance(options, module.BulkheadPolicy) and options.max_concurrent == 2
    assert "Bulkhead" in _chain_names(Guard(policy), "search")
    assert "Bulkhead" not in _chain_names(Guard(policy), "other")
    with pytest.raises(ConfigError) as bad:
        Guard(bad_policy).stage("search")  # validated by the model once it is registered
    assert bad.value.field == "stages.search.layers.bulkhead.max_concurrent"
    assert "greater than or equal to 1" in str(bad.value)


def test_a_default_stage_waiting_for_its_layer_names_default_stage(unregistered: None) -> None:
    policy = Policy.parse({"default_stage": {"layers": {"bulkhead": {"max_concurrent": 0}}}})
    _load_example()
    with pytest.raises(ConfigError) as bad:
        Guard(policy).stage("anything")
    assert bad.value.field == "default_stage.layers.bulkhead.max_concurrent"


def test_built_in_layers_are_held_by_name_in_every_spelling() -> None:
    top = StagePolicy.model_validate({"breaker": {"kind": "rerank_oom"}, "retry": {"attempts": 3}})
    under = StagePolicy.model_validate(
        {"layers": {"breaker": {"kind": "rerank_oom"}, "retry": {"attempts": 3}}}
    )
    python = StagePolicy(breaker=BreakerPolicy(kind="rerank_oom"), retry=RetryPolicy(attempts=3))
    assert top == under == python
    assert set(top.layers) == {"breaker", "retry"}
    assert top.breaker.kind == "rerank_oom" and top.retry.attempts == 3
    assert top.layer("hedge") is None and top.hedge is None  # off unless configured
    assert StagePolicy().breaker == BreakerPolicy() and StagePolicy().retry == RetryPolicy()
    assert StagePolicy(hedge=None).layers == {}
    with pytest.raises(ConfigError, match="given twice"):
        StagePolicy(retry={}, layers={"retry": {}})
    # a standard stage given one option keeps its standard layers' other options
    policy = Policy.parse({"stages": {"embedding": {"breaker": {"open_for_s": 10}, "hedge": {}}}})
    stage = policy.stage("embedding")
    assert stage.breaker.kind == "embedding_timeout" and stage.breaker.open_for_s == 10
    assert stage.retry.attempts == 2 and isinstance(stage.hedge, HedgePolicy)


def test_the_models_live_in_options() -> None:
    import ragguard.options

    assert ragguard.options.BreakerPolicy is BreakerPolicy
    assert ragguard.options.RetryPolicy is RetryPolicy


def test_the_options_import_no_layer() -> None:
    """Importing the options alone (with the package's ``__init__`` skipped) loads no layer, no
    preset and no Guard, and they validate a stage's layers' options by name."""
    code = (
        "import sys, types, importlib.util\n"
        f"root = {str(ROOT / 'src' / 'ragguard')!r}\n"
        "pkg = types.ModuleType('ragguard'); pkg.__path__ = [root]; sys.modules['ragguard'] = pkg\n"
        "import ragguard.options\n"
        "up = ('ragguard.layers', 'ragguard.rag', 'ragguard._guard')\n"
        "print(sorted(m for m in sys.modules if m.startswith(up)))\n"
        "p = ragguard.options.StagePolicy.model_validate({'breaker': {'kind': 'rerank_oom'}})\n"
        "print(p.breaker.kind)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()[:2]
    assert first == "[]"
    assert second == "rerank_oom"


def test_register_layer_is_the_registry_and_REGISTRY_follows_it() -> None:
    def build(stage: Any, bound: Any) -> None:
        return None

    layers_mod.register_layer("mine", build, after="retry")
    try:
        names = [n for n, _ in layers_mod.REGISTRY]
        assert names[names.index("retry") + 1] == "mine"
        assert dict(layers_mod.REGISTRY)["mine"] is build
    finally:
        unregister_layer("mine")
