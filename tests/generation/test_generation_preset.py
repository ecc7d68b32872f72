"""The ``generation`` preset as configured: the standard stage, ``preset: generation`` on any stage,
the policy's ranges and the decorator's options, each refused early with a ConfigError naming it."""

from __future__ import annotations

from typing import Any

import pytest
from gen_helpers import collect

import ragguard
from ragguard import ConfigError, GenerationPolicy, Guard, Policy, StagePolicy, StreamTimeout, TenantQuota
from ragguard.layers._presets import PRESETS
from ragguard.rag._presets import GenerationPreset

pytestmark = pytest.mark.timeout(20)


def test_the_standard_generation_stage_has_the_preset_and_its_budgets() -> None:
    stage = Policy().stage("generation")
    assert stage.preset == "generation" and isinstance(PRESETS["generation"], GenerationPreset)
    budgets = stage.generation
    assert (budgets.first_item_s, budgets.idle_s, budgets.total_s) == (30.0, 10.0, 300.0)
    assert stage.retry.attempts == 2 and "timeout" in stage.retry.retry_on  # before the first item
    assert "generation" in ragguard.options._policy.STANDARD_STAGES


def test_setting_one_budget_keeps_the_standard_others_and_any_stage_may_name_the_preset() -> None:
    p = Policy.parse(
        {
            "stages": {
                "generation": {"generation": {"first_item_s": 90}},
                "summarise": {"preset": "generation", "generation": {"idle_s": 2.5, "total_s": None}},
            },
            "tenants": {"greedy": {"tokens_per_s": 40, "token_burst": 80, "token_quota": 20000}},
        }
    )
    assert p.stage("generation").generation.first_item_s == 90
    assert p.stage("generation").generation.idle_s == 10.0
    assert p.stage("generation").preset == "generation"
    summarise = p.stage("summarise").generation
    assert (summarise.first_item_s, summarise.idle_s, summarise.total_s) == (30.0, 2.5, None)
    greedy = p.quota("greedy")
    assert (greedy.tokens_per_s, greedy.token_burst, greedy.token_quota, greedy.token_window_s) == (
        40,
        80,
        20000,
        60.0,
    )


@pytest.mark.parametrize(
    ("where", "name", "value"),
    [
        ("stage", "first_item_s", 0),
        ("stage", "idle_s", -1),
        ("stage", "total_s", 10**9),
        ("stage", "estimate_tokens", 0),
        ("tenant", "tokens_per_s", 0),
        ("tenant", "token_burst", 0),
        ("tenant", "token_quota", -5),
        ("tenant", "token_window_s", 0),
    ],
)
def test_values_out_of_range_are_refused_naming_the_field(where: str, name: str, value: Any) -> None:
    if where == "stage":
        data: dict[str, Any] = {"stages": {"generation": {"generation": {name: value}}}}
        field = f"stages.generation.generation.{name}"
    else:
        data, field = {"tenants": {"acme": {name: value}}}, f"tenants.acme.{name}"
    with pytest.raises(ConfigError) as refused:
        Policy.parse(data)
    assert refused.value.field == field


def test_the_environment_sets_a_tenants_token_rate() -> None:
    p = Policy.from_env(environ={"RAGGUARD_TENANTS__GREEDY__TOKENS_PER_S": "25"})
    assert p.quota("greedy").tokens_per_s == 25


def test_the_decorators_options_are_checked_at_decoration() -> None:
    g = Guard()

    async def model(prompt: str) -> Any:
        yield prompt

    async def whole_answer(prompt: str) -> str:
        return prompt

    with pytest.raises(ConfigError, match="tokens must be a function") as bad_counter:
        g.guard("generation", tokens=4)(model)
    assert bad_counter.value.field == "tokens"
    with pytest.raises(ConfigError, match="estimate must be >= 1"):
        g.guard("generation", estimate=0)(model)
    with pytest.raises(ConfigError, match="estimate must be an int"):
        g.guard("generation", estimate="lots")(model)
    with pytest.raises(ConfigError, match="async generator functions only"):
        g.guard("generation", tokens=len)(whole_answer)
    with pytest.raises(ConfigError, match="do not apply to the 'vector_store' preset"):
        g.guard("vector_store", tokens=len)(model)
    assert g.guard("generation", tokens=len, estimate=100)(model) is not None


@pytest.mark.anyio
async def test_a_coroutine_function_of_a_generation_stage_runs_the_generic_layers() -> None:
    g = Guard(Policy(stages={"generation": StagePolicy(generation=GenerationPolicy(first_item_s=0.001))}))

    @g.guard("generation")
    async def whole_answer(prompt: str) -> str:
        return prompt.upper()

    assert await whole_answer("hi") == "HI"


@pytest.mark.anyio
async def test_a_tenant_without_token_limits_gets_no_account() -> None:
    g = Guard(Policy(tenants={"acme": TenantQuota(max_concurrency=2)}))

    @g.guard("generation")
    async def model() -> Any:
        yield "a"

    async with g.tenant("acme"):
        assert await collect(model()) == ["a"]
    assert ragguard.rag.token_accounts(g)._tenants == {}
    assert issubclass(StreamTimeout, ragguard.StageTimeout)


def test_stream_timeout_carries_its_fields_through_pickle() -> None:
    import pickle

    cut = StreamTimeout("generation", "idle", 2.5, 7)
    cut.add_note("seen by the test")
    back = pickle.loads(pickle.dumps(cut))
    assert (back.stage, back.budget, back.timeout_s, back.items) == ("generation", "idle", 2.5, 7)
    assert str(back) == str(cut)
    assert str(cut) == "stage 'generation' stream cut: its idle budget of 2.500s ran out after 7 items"
    assert back.__notes__ == ["seen by the test"]
    timeout = pickle.loads(pickle.dumps(ragguard.StageTimeout("rerank", 0.8, items=3)))
    assert (timeout.stage, timeout.timeout_s, timeout.items) == ("rerank", 0.8, 3)
