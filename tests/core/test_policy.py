"""Policy: loading from Python, files and the environment; errors name the field and range."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ragguard import (
    BreakerPolicy,
    ConfigError,
    EmbeddingTimeoutBreaker,
    Guard,
    Policy,
    RetryPolicy,
    StagePolicy,
    TenantQuota,
    VectorStoreUnavailableBreaker,
)
from ragguard.breakers import CircuitBreaker, RerankOOMBreaker

pytestmark = pytest.mark.timeout(20)


# -- standard stages ----------------------------------------------------------------------------


def test_standard_stages_are_preconfigured() -> None:
    p = Policy()
    assert p.stage("embedding").breaker.kind == "embedding_timeout"
    assert p.stage("vector_store").breaker.kind == "vector_store_unavailable"
    assert p.stage("rerank").breaker.kind == "rerank_oom"
    assert p.stage("anything_else") == p.default_stage


def test_a_standard_stage_keeps_its_typed_breaker_when_only_timeout_is_given() -> None:
    p = Policy(stages={"embedding": StagePolicy(timeout_s=1.5)})
    stage = p.stage("embedding")
    assert stage.timeout_s == 1.5
    assert stage.breaker.kind == "embedding_timeout"
    assert stage.retry == Policy().stage("embedding").retry
    assert isinstance(Guard(p).breaker("embedding"), EmbeddingTimeoutBreaker)


def test_a_standard_stage_keeps_its_breaker_kind_when_only_breaker_options_are_given() -> None:
    p = Policy.parse({"stages": {"vector_store": {"breaker": {"open_for_s": 10}, "retry": {"attempts": 4}}}})
    stage = p.stage("vector_store")
    assert stage.breaker.kind == "vector_store_unavailable"
    assert stage.breaker.open_for_s == 10
    assert stage.retry.attempts == 4
    assert stage.retry.retry_on == Policy().stage("vector_store").retry.retry_on
    assert stage.timeout_s == Policy().stage("vector_store").timeout_s
    breaker = Guard(p).breaker("vector_store")
    assert isinstance(breaker, VectorStoreUnavailableBreaker)


def test_an_explicit_kind_still_replaces_the_standard_breaker() -> None:
    p = Policy(stages={"rerank": StagePolicy(breaker=BreakerPolicy(kind="none"))})
    assert p.stage("rerank").breaker.kind == "none"
    assert Guard(p).breaker("rerank") is None


@pytest.mark.parametrize(
    ("policy", "where", "told"),
    [
        ({"stages": {"generation": {"breaker": {"window_size": 5}}}}, "stages.generation", True),
        ({"stages": {"openai": {"breaker": {"window_size": 5}}}}, "stages.openai", True),
        ({"stages": {"b": {"preset": "generation", "breaker": {"window_size": 5}}}}, "stages.b", True),
        ({"default_stage": {"preset": "generation", "breaker": {"window_size": 5}}}, "default_stage", True),
        ({"stages": {"generation": {"breaker": {"window_size": 5, "minimum_calls": 7}}}},
         "stages.generation", False),
    ],
)
def test_a_standard_stages_value_the_user_never_wrote_is_named_as_such_when_refused(
    policy: dict[str, object], where: str, told: bool
) -> None:
    """The generation stage judges its breaker from 10 calls; a count window of 5 set without a
    minimum refuses that 10, and the error says it is the standard stage's value, not the user's."""
    with pytest.raises(ConfigError) as caught:
        Policy.parse(policy)
    assert caught.value.field is not None and caught.value.field.endswith(f"{where}.breaker.minimum_calls")
    assert ("the standard generation stage's value" in str(caught.value)) is told


def test_the_generation_stage_judges_its_breaker_from_ten_calls_and_the_provider_stages_too() -> None:
    p = Policy()
    for name in ("generation", "openai", "anthropic"):
        config = p.stage(name).breaker.config()
        assert config is not None and config.minimum_calls == 10 and config.window_size == 100


def test_a_stage_naming_a_standard_preset_starts_from_that_standard_stage() -> None:
    p = Policy.parse({
        "stages": {
            "backup": {"preset": "generation"},
            "rerank_v2": {"preset": "rerank", "breaker": {"open_for_s": 5}},
            "keyword": {"preset": "vector_store", "timeout_s": 0.5, "retry": {"attempts": 3}},
        },
        "default_stage": {"preset": "embedding"},
    })
    backup, generation = p.stage("backup"), p.stage("generation")
    assert backup.retry == generation.retry and backup.retry.attempts == 2
    assert backup.breaker == generation.breaker
    rerank_v2 = p.stage("rerank_v2")
    assert rerank_v2.breaker.kind == "rerank_oom" and rerank_v2.breaker.open_for_s == 5
    assert rerank_v2.retry.attempts == 1
    keyword = p.stage("keyword")
    assert keyword.breaker.kind == "vector_store_unavailable"
    assert keyword.timeout_s == 0.5 and keyword.retry.attempts == 3  # its own fields win
    assert keyword.retry.retry_on == p.stage("vector_store").retry.retry_on
    unlisted = p.stage("anything_else")
    assert unlisted.breaker.kind == "embedding_timeout" and unlisted.timeout_s == 5.0
    assert Policy().stage("anything_else").retry.attempts == 1  # no preset: the defaults
    assert isinstance(Guard(p).breaker("keyword"), VectorStoreUnavailableBreaker)


def test_policies_are_frozen() -> None:
    p = Policy()
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen error type
        p.default_quota = TenantQuota()  # type: ignore[misc]


# -- ranges ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field", "allowed"),
    [
        (
            {"stages": {"x": {"retry": {"attempts": 50}}}},
            "stages.x.retry.attempts",
            "less than or equal to 20",
        ),
        ({"stages": {"x": {"min_attempt_s": -1}}}, "stages.x.min_attempt_s", "greater than or equal to 0"),
        ({"tenants": {"acme": {"rate_per_s": 0}}}, "tenants.acme.rate_per_s", "greater than 0"),
        ({"tenants": {"acme": {"burst": 0}}}, "tenants.acme.burst", "greater than or equal to 1"),
        ({"default_quota": {"max_wait_s": 7200}}, "default_quota.max_wait_s", "less than or equal to 3600"),
        ({"stages": {"x": {"breaker": {"kind": "magic"}}}}, "stages.x.breaker.kind", "generic"),
        ({"stages": {"x": {"retry": {"retry_on": ["weather"]}}}}, "stages.x.retry.retry_on", "connection"),
        (
            {"stages": {"x": {"breaker": {"open_jitter": 2}}}},
            "stages.x.breaker.open_jitter",
            "must be a fraction in [0, 1)",
        ),
    ],
)
def test_errors_name_the_field_and_the_allowed_range(data: dict, field: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as info:
        Policy.parse(data)
    assert field in str(info.value)
    assert allowed in str(info.value)
    assert isinstance(info.value, ValueError)


# -- files ----------------------------------------------------------------------------------------


def test_from_file_yaml_toml_json(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        "stages:\n  vector_store:\n    timeout_s: 0.5\ntenants:\n  acme:\n    max_concurrency: 3\n"
    )
    (tmp_path / "p.toml").write_text(
        "[stages.vector_store]\ntimeout_s = 0.5\n[tenants.acme]\nmax_concurrency = 3\n"
    )
    (tmp_path / "p.json").write_text(
        json.dumps(
            {"stages": {"vector_store": {"timeout_s": 0.5}}, "tenants": {"acme": {"max_concurrency": 3}}}
        )
    )
    for name in ("p.yaml", "p.toml", "p.json"):
        p = Policy.from_file(tmp_path / name)
        assert p.stage("vector_store").timeout_s == 0.5
        assert p.stage("vector_store").breaker.kind == "vector_store_unavailable"
        assert p.quota("acme").max_concurrency == 3
        assert p.quota("other") == p.default_quota


def test_from_file_errors_name_the_file_and_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages:\n  embedding:\n    retry:\n      attempts: 0\n")
    with pytest.raises(ConfigError) as info:
        Policy.from_file(bad)
    msg = str(info.value)
    assert (
        "bad.yaml" in msg and "stages.embedding.retry.attempts" in msg and "greater than or equal to 1" in msg
    )

    broken = tmp_path / "broken.toml"
    broken.write_text("[stages\n")
    with pytest.raises(ConfigError, match=r"broken\.toml"):
        Policy.from_file(broken)
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        Policy.from_file(top)
    with pytest.raises(ConfigError, match=r"missing\.yaml"):
        Policy.from_file(tmp_path / "missing.yaml")
    other = tmp_path / "policy.ini"
    other.write_text("[x]\n")
    with pytest.raises(ConfigError, match=r"\.ini"):
        Policy.from_file(other)


def test_an_empty_yaml_file_is_the_default_policy(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert Policy.from_file(empty) == Policy()


# -- environment ----------------------------------------------------------------------------------


def test_from_env_nests_with_double_underscores() -> None:
    env = {
        "RAGGUARD_STAGES__EMBEDDING__TIMEOUT_S": "2.5",
        "RAGGUARD_STAGES__SEARCH__BREAKER__KIND": "none",
        "RAGGUARD_STAGES__SEARCH__RETRY__ATTEMPTS": "3",
        "RAGGUARD_STAGES__SEARCH__RETRY__RETRY_ON": '["connection", "timeout"]',
        "RAGGUARD_TENANTS__ACME__MAX_CONCURRENCY": "8",
        "RAGGUARD_DEFAULT_QUOTA__RATE_PER_S": "50",
        "UNRELATED": "x",
    }
    before = dict(os.environ)
    p = Policy.from_env(environ=env)
    assert dict(os.environ) == before  # reading a mapping leaves the process environment alone
    assert p.stage("embedding").timeout_s == 2.5
    assert p.stage("embedding").breaker.kind == "embedding_timeout"  # still the typed breaker
    assert p.stage("search").breaker.kind == "none"
    assert p.stage("search").retry.attempts == 3
    assert p.stage("search").retry.retry_on == ("connection", "timeout")
    assert p.quota("acme").max_concurrency == 8
    assert p.default_quota.rate_per_s == 50.0


def test_from_env_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MYAPP_TENANTS__ACME__TIMEOUT_S", "0.8")
    p = Policy.from_env(prefix="MYAPP_")
    assert p.quota("acme").timeout_s == 0.8
    assert Policy.from_env(prefix="NOTHING_SET_") == Policy()


def test_from_env_errors_name_the_variable_path() -> None:
    with pytest.raises(ConfigError) as info:
        Policy.from_env(environ={"RAGGUARD_TENANTS__ACME__MAX_CONCURRENCY": "-3"})
    assert "tenants.acme.max_concurrency" in str(info.value)
    assert "greater than or equal to 1" in str(info.value)
    with pytest.raises(ConfigError) as info:
        Policy.from_env(environ={"RAGGUARD_STAGES__X__TIMEOUT_S": "soon"})
    assert "stages.x.timeout_s" in str(info.value)


def test_retry_policy_defaults_match_envoy_budget() -> None:
    r = RetryPolicy()
    assert r.budget_ratio == 0.2
    assert r.attempts == 1


def test_models_built_in_python_raise_config_error_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"timeout_s: Input should be greater than 0 \(got -1\)"):
        StagePolicy(timeout_s=-1)
    with pytest.raises(ConfigError, match=r"max_concurrency: Input should be greater than or equal to 1"):
        TenantQuota(max_concurrency=0)
    with pytest.raises(ConfigError, match=r"stages\.embedding\.retry\.attempts"):
        Policy(stages={"embedding": {"retry": {"attempts": 99}}})


# -- breaker options are checked at load, by the breaker's own rules (issue 13 items 7, 8, 9) -------


@pytest.mark.parametrize(
    ("stage", "breaker", "path"),
    [
        ("embedding", {"open_jitter": 1}, "stages.embedding.breaker.open_jitter"),
        ("x", {"window_type": "time", "window_size": 86_401}, "stages.x.breaker.window_size"),
        ("x", {"open_for_s": 60, "open_max_s": 30}, "stages.x.breaker.open_max_s"),
        ("rerank", {"open_max_s": 100}, "stages.rerank.breaker.open_max_s"),  # below the kind's 300 s
        ("x", {"open_for_s": float("inf")}, "stages.x.breaker.open_for_s"),
        ("x", {"minimum_calls": 10**9, "window_type": "time"}, "stages.x.breaker.minimum_calls"),
        ("x", {"half_open_permits": 10**9}, "stages.x.breaker.half_open_permits"),
        ("x", {"consecutive_failures_threshold": 10**9}, "stages.x.breaker.consecutive_failures_threshold"),
        ("vector_store", {"window_size": 3}, "stages.vector_store.breaker.minimum_calls"),  # kind's 5 > 3
        ("x", {"open_for_s": 10**400}, "stages.x.breaker.open_for_s"),
    ],
)
def test_breaker_options_the_breaker_refuses_do_not_load(stage: str, breaker: dict, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        Policy.parse({"stages": {stage: {"breaker": breaker}}})
    assert info.value.field == path
    assert f"  {path}: " in str(info.value) and len(str(info.value)) < 300


def test_default_stage_breaker_options_are_checked_too() -> None:
    with pytest.raises(ConfigError) as info:
        Policy(default_stage=StagePolicy(breaker=BreakerPolicy(window_size=50)))
    assert info.value.field == "default_stage.breaker.minimum_calls"
    assert "(the generic breaker's default)" in str(info.value)


_INT_OPTIONS = ["minimum_calls", "window_size", "half_open_permits", "consecutive_failures_threshold"]
_FLOAT_OPTIONS = ["failure_rate_threshold", "slow_call_duration_s", "open_for_s", "open_max_s", "open_jitter",
                  "open_backoff_multiplier"]  # fmt: skip
_edges = st.sampled_from([0, 1, 3, 20, 86_400, 86_401, 1_000_000, 1_000_001, 31_536_000, 31_536_001, 10**400])
_ints = st.one_of(st.integers(-5, 200_000), _edges)
_floats = st.one_of(_ints, st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 2), st.floats(0, 400))


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["generic", "embedding_timeout", "vector_store_unavailable", "rerank_oom"]),
    options=st.fixed_dictionaries(
        {}, optional={**{k: _ints for k in _INT_OPTIONS}, **{k: _floats for k in _FLOAT_OPTIONS}}
    ),
    window_type=st.sampled_from([None, "count", "time"]),
)
def test_a_policy_loads_exactly_when_its_stage_breaker_builds(
    kind: str, options: dict, window_type: str | None
) -> None:
    if window_type is not None:
        options = {**options, "window_type": window_type}
    try:
        policy = Policy.parse({"stages": {"s": {"breaker": {"kind": kind, **options}}}})
    except ConfigError as exc:
        assert exc.field is not None and exc.field.startswith("stages.s.breaker.")
        assert max(len(line) for line in str(exc).splitlines()) <= 400
        loaded = False
    else:
        loaded = True
    breaker_class = {
        "generic": CircuitBreaker,
        "embedding_timeout": EmbeddingTimeoutBreaker,
        "vector_store_unavailable": VectorStoreUnavailableBreaker,
        "rerank_oom": RerankOOMBreaker,
    }[kind]
    try:
        breaker_class("s", **options)
    except ConfigError:
        builds = False
    else:
        builds = True
    assert loaded == builds, (kind, options)
    if loaded:  # and the guard builds the very breaker the policy describes (the guard wraps the
        # kind's classifier so that stage timeouts count: compare everything else)
        built, described = Guard(policy).stage("s").breaker.config, policy.stage("s").breaker.config()
        assert described is not None
        drop = {"classifier", "slow_classifier"}
        assert {k: v for k, v in built.options().items() if k not in drop} == {
            k: v for k, v in described.options().items() if k not in drop
        }


def test_a_yaml_alias_bomb_is_refused_quickly_with_a_short_message(tmp_path: Path) -> None:
    levels = ["a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for prev, name in zip("abcdef", "bcdefg", strict=True):
        levels.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    levels.append("stages: {x: {timeout_s: *g, retry: {retry_on: *f}}}")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(levels) + "\n")
    assert path.stat().st_size < 400  # a few hundred bytes ...
    with pytest.raises(ConfigError) as info:
        Policy.from_file(path)  # ... that expand to 9**7 values
    assert "aliases" in str(info.value) and len(str(info.value)) < 300


def test_every_error_line_is_bounded_and_the_list_is_capped(tmp_path: Path) -> None:
    huge = list(range(50_000))
    data = {
        "stages": {"x" * 10_000: {"timeout_s": huge, "retry": {"retry_on": ["nope"] * 100}}},
        "tenants": {f"t{i}": {"max_concurrency": -i} for i in range(50)},
    }
    with pytest.raises(ConfigError) as info:
        Policy.parse(data)
    text = str(info.value)
    lines = text.splitlines()
    assert lines[0] == "policy: 151 invalid value(s)"
    assert lines[-1] == "  ... and 131 more" and len(lines) == 22
    assert max(len(line) for line in lines) <= 400 and len(text) < 8_000


@pytest.mark.parametrize(
    "data",
    [
        {"stages": {"x": {"timeout_s": 10**400}}},
        {"stages": {"x": {"breaker": {"slow_call_duration_s": 10**400}}}},
        {"tenants": {"acme": {"max_wait_s": 10**5000}}},  # past Python's 4,300-digit repr limit
        {"default_quota": {"burst": 10**400}},
    ],
)
def test_huge_numbers_are_config_errors(data: dict) -> None:
    with pytest.raises(ConfigError) as info:
        Policy.parse(data)
    assert len(str(info.value)) < 300


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"stages": {"embedding": {"breaker": {"kind": "embedding_timeout", "open_fro_s": 30}}}},
         "stages.embedding.breaker.open_fro_s: Extra inputs are not permitted (got 30); "
         "did you mean open_for_s?"),
        ({"stages": {"embedding": {"retyr": {"attempts": 2}}}},
         "stages.embedding.retyr: Extra inputs are not permitted; did you mean retry?"),
        ({"tenats": {}}, "tenats: Extra inputs are not permitted; did you mean tenants?"),
        ({"default_quota": {"max_concurency": 3}},
         "default_quota.max_concurency: Extra inputs are not permitted (got 3); "
         "did you mean max_concurrency?"),
        ({"stages": {"embedding": {"zzzzzz": 1}}},
         "stages.embedding.zzzzzz: Extra inputs are not permitted (got 1)"),
    ],
)  # fmt: skip
def test_an_unknown_field_suggests_the_nearest_known_one(data: dict, said: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        Policy.parse(data)
    lines = str(info.value).splitlines()
    assert f"  {said}" in lines, lines
    path = tmp_path / "policy.yaml"  # and from a file, as a user hits it
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        Policy.from_file(path)
    assert f"  {said}" in str(info.value).splitlines()


# -- limits no call can reach: reported when the Guard is built -----------------------------------


def test_a_limit_no_call_can_reach_is_logged_when_the_guard_is_built(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from ragguard import TokenLimits

    policy = Policy.parse({
        "tenants": {
            "acme": {
                "token_quota": 1000,
                "output_token_quota": 1000,  # the total is as tight: never reached
                "burst": 5,  # no rate_per_s
                "tokens_per_s": 10,
                "models": {
                    "gpt-4o": {"token_quota": 5000},  # the tenant's 1000 per minute always refuses first
                    "gpt-4o-mini": {"token_quota": 500, "token_window_s": 1},  # holds less: reachable
                    "o3": {"token_quota": 200, "tokens_per_s": 20},  # a tighter quota; a looser pace
                    "o4": {},
                },
            },
            "beta": {"token_quota": 100, "models": {"m": TokenLimits(token_quota=50, token_burst=3)}},
        },
    })
    with caplog.at_level("WARNING", logger="ragguard.policy"):
        Guard(policy)
    said = [r.getMessage() for r in caplog.records if r.name == "ragguard.policy"]
    fields = sorted(m.split(" ")[2] for m in said)
    assert fields == [
        "tenants.acme.burst",
        "tenants.acme.models.gpt-4o.token_quota",
        "tenants.acme.models.o3.tokens_per_s",
        "tenants.acme.models.o4",
        "tenants.acme.output_token_quota",
        "tenants.beta.models.m.token_burst",
    ], said
    assert policy.unreachable_limits() == [m.removeprefix("ragguard policy: ") for m in said]
    caplog.clear()
    with caplog.at_level("WARNING", logger="ragguard.policy"):
        tight = TenantQuota(token_quota=1000, models={"gpt-4o": TokenLimits(token_quota=10)})
        Guard(Policy(tenants={"acme": tight}))
    assert not caplog.records  # a model's tighter quota: reachable, nothing said
