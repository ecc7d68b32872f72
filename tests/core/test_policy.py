"""Policy: loading from Python, files and the environment; errors name the field and range."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

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
            "less than or equal to 1",
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
