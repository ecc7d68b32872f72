"""The breaker's explicit contracts: one frozen, validated config, one outcome classifier, one set
of option validators, and no import circle inside ``ragguard.breakers``."""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from breaker_helpers import fail

import ragguard
from ragguard import ConfigError, FakeClock, VectorStoreUnavailable
from ragguard.breakers import (
    BreakerConfig,
    BreakerState,
    CircuitBreaker,
    EmbeddingTimeoutBreaker,
    RerankOOMBreaker,
    classify_outcome,
    counts_by_default,
    counts_outages,
    is_timeout,
)
from ragguard.breakers._outcome import IGNORED, outcome_name

pytestmark = pytest.mark.timeout(30)

BREAKERS = pathlib.Path(ragguard.__file__).parent / "breakers"


def test_the_breaker_exposes_its_options_as_one_frozen_config(clock: FakeClock) -> None:
    breaker = CircuitBreaker(
        "store", minimum_calls=5, window_size=10, open_for_s=timedelta(seconds=12), open_max_s=40,
        open_backoff_multiplier=2, classifier=None, clock=clock,
    )  # fmt: skip
    config = breaker.config
    assert isinstance(config, BreakerConfig)
    assert (config.minimum_calls, config.window_size) == (5, 10)
    assert (config.open_for_s, config.open_max_s) == (12.0, 40.0)
    assert type(config.open_for_s) is float and type(config.open_backoff_multiplier) is float
    assert config.classifier is counts_by_default  # None means the default, resolved once
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.open_for_s = 1.0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        breaker.config = config  # type: ignore[misc]
    # what the breaker does follows the config it shows
    for _ in range(5):
        fail(breaker)
    assert breaker.state is BreakerState.OPEN and breaker.retry_after_s == 12.0


def test_typed_breakers_show_their_presets_in_the_config() -> None:
    config = EmbeddingTimeoutBreaker().config
    assert (config.slow_call_duration_s, config.slow_call_rate_threshold) == (3.0, 50.0)
    assert config.window_size == 20
    assert config.classifier is counts_outages and config.slow_classifier is is_timeout
    assert RerankOOMBreaker(open_for_s=30).config.open_for_s == 30.0
    # a config rebuilds the same breaker: options() are the breaker's keyword options
    again = CircuitBreaker("again", **EmbeddingTimeoutBreaker().config.options())
    assert again.config == config


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"open_jitter": 1}, "open_jitter"),
        ({"open_jitter": True}, "open_jitter"),
        ({"window_type": "time", "window_size": 86_401}, "window_size"),
        ({"open_for_s": 60, "open_max_s": 30}, "open_max_s"),
        ({"open_for_s": float("inf")}, "open_for_s"),
        ({"open_for_s": 10**400}, "open_for_s"),
        ({"slow_call_duration_s": 10**400}, "slow_call_duration_s"),
        ({"open_max_s": timedelta(days=400)}, "open_max_s"),
        ({"minimum_calls": 10**9, "window_type": "time"}, "minimum_calls"),
        ({"half_open_permits": 10**9}, "half_open_permits"),
        ({"consecutive_failures_threshold": 10**9}, "consecutive_failures_threshold"),
        ({"open_backoff_multiplier": 10**400}, "open_backoff_multiplier"),
        ({"window_type": "x" * 100_000}, "window_type"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_a_bad_option_is_a_config_error_naming_it_with_a_bounded_message(
    options: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        BreakerConfig.of(**options)
    assert info.value.field == field and field in str(info.value)
    assert len(str(info.value)) < 200
    if field != "bogus":  # the breaker refuses the same values with the same error
        with pytest.raises(ConfigError) as again:
            CircuitBreaker("x", **options)
        assert again.value.field == field and str(again.value) == str(info.value)


def test_classify_outcome_is_the_one_rule_for_every_outcome() -> None:
    config = BreakerConfig(slow_call_duration_s=1.0, classifier=lambda e: isinstance(e, OSError),
                           slow_classifier=lambda e: isinstance(e, TimeoutError))  # fmt: skip
    cases = [
        (None, 0.5, "success"),
        (None, 1.5, "slow_success"),
        (ConnectionRefusedError(), 0.5, "failure"),
        (ConnectionRefusedError(), 1.5, "slow_failure"),
        (TimeoutError(), 0.1, "slow_failure"),  # a timeout was slow whatever its measured duration
        (ValueError(), 5.0, "ignored"),  # the classifier says no: not the dependency's fault
        (KeyboardInterrupt(), 0.1, "ignored"),  # not an Exception: cancellation-class, never counted
    ]
    assert [outcome_name(classify_outcome(config, exc, d)) for exc, d, _ in cases] == [c[2] for c in cases]


def test_a_classifier_that_raises_ignores_the_error(caplog: pytest.LogCaptureFixture) -> None:
    def broken(exc: BaseException) -> bool:
        raise RuntimeError("bug in the classifier")

    assert classify_outcome(BreakerConfig(classifier=broken), OSError(), 0.0, breaker="db") == IGNORED
    assert "classifier of breaker 'db' raised" in caplog.text


def test_the_breaker_records_what_classify_outcome_says(clock: FakeClock) -> None:
    breaker = CircuitBreaker("b", minimum_calls=3, window_size=3, slow_call_duration_s=1.0, clock=clock,
                             classifier=lambda e: isinstance(e, OSError),
                             error_class=VectorStoreUnavailable)  # fmt: skip
    fail(breaker, ValueError("bad input"))  # ignored: not recorded
    fail(breaker, OSError(), duration_s=2.0)  # slow failure
    fail(breaker, OSError())  # failure
    m = breaker.metrics()
    assert (m.state, m.calls, m.failed_calls, m.slow_calls) == (BreakerState.CLOSED, 2, 2, 1)


def _imports_within(package: pathlib.Path) -> dict[str, set[str]]:
    """Module -> the sibling modules it imports (at the top or inside a function)."""
    graph: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:
                    deps.update(alias.name for alias in node.names)
        graph[path.stem] = deps
    return graph


def test_no_import_circle_inside_the_breakers_package() -> None:
    graph = _imports_within(BREAKERS)
    assert "_aiobreaker" in graph["_breaker"]  # imported at the top now, no longer inside a method

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        for dep in graph.get(start, ()):
            if dep == target or (dep not in seen and reaches(dep, target, seen | {dep})):
                return True
        return False

    circles = sorted(m for m in graph if reaches(m, m, {m}))
    assert circles == []


def test_each_breaker_module_imports_first_on_its_own() -> None:
    for module in ("_aiobreaker", "_breaker", "_options", "_outcome", "_typed"):
        code = f"import ragguard.breakers.{module}"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr


# -- a breaker built from its config object: validated once, used as given (issue 20) ------------


def test_a_breaker_takes_its_config_object_as_it_is(clock: FakeClock) -> None:
    config = BreakerConfig.of(minimum_calls=2, window_size=4, open_for_s=7.0, classifier=counts_outages)
    breaker = CircuitBreaker("store", config=config, clock=clock)
    assert breaker.config is config  # not rebuilt, not re-validated
    for _ in range(2):
        breaker.on_result(breaker.acquire(), 0.0, ConnectionRefusedError())
    assert breaker.state is BreakerState.OPEN and breaker.metrics().retry_after_s == pytest.approx(7.0)
    typed = EmbeddingTimeoutBreaker(config=config, clock=clock)
    assert typed.config is config and typed.name == "embedding"  # the kind's defaults not merged in


def test_a_config_and_option_keywords_together_or_a_wrong_config_are_refused() -> None:
    config = BreakerConfig.of(minimum_calls=2, window_size=4)
    with pytest.raises(ConfigError, match="not both") as both:
        CircuitBreaker("store", config=config, open_for_s=5.0)
    assert both.value.field == "config" and "open_for_s" in str(both.value)
    with pytest.raises(ConfigError, match="BreakerConfig") as wrong:
        CircuitBreaker("store", config={"minimum_calls": 2})  # type: ignore[arg-type]
    assert wrong.value.field == "config"


def test_the_guard_builds_the_breaker_from_the_policy_s_own_config() -> None:
    policy = ragguard.Policy.parse({"stages": {"s": {"breaker": {"minimum_calls": 3, "window_size": 6}}}})
    described = policy.stage("s").breaker.config()
    assert described is policy.stage("s").breaker.config()  # validated once, kept
    built = ragguard.Guard(policy).stage("s").breaker
    assert isinstance(built, CircuitBreaker) and built.config is described


# -- one declaration of the options (issue 30) ------------------------------------------------------


_CODE = {"classifier", "slow_classifier", "error_class"}  # code, not data: no policy file sets them


def test_the_config_declares_every_option_once_and_the_other_shapes_hold_its_names() -> None:
    from typing import get_type_hints

    from ragguard.breakers._options import OPTIONS, BreakerOptions, option_info
    from ragguard.options import BreakerPolicy

    declared = get_type_hints(BreakerConfig)
    assert set(OPTIONS) == set(declared) - _CODE
    for name in OPTIONS:  # each with its rule, its range as shown, and its meaning
        info = option_info(name)
        assert callable(info.rule) and info.shown and info.doc
    # the policy's model: the same options, each of the config's type or None (the kind's default)
    policy = BreakerPolicy.model_fields
    assert list(policy) == ["kind", *OPTIONS]
    for name in OPTIONS:
        own = declared[name]
        wanted = own if type(None) in getattr(own, "__args__", ()) else own | None
        assert policy[name].annotation == wanted, name
    # the breaker's keywords: the config's fields, a whole config, and its clock and randomness
    assert set(BreakerOptions.__annotations__) == set(declared) | {"config", "rng", "clock"}


def test_the_shared_breaker_scripts_run_on_every_option_the_replica_does_not_decide_itself() -> None:
    from ragguard.redis._scripts import BREAKER_OPTION_ARGS, breaker_option_args

    sent = {"open_max_s" if attr == "open_cap_s" else attr for _, attr, _ in BREAKER_OPTION_ARGS}
    # the replica classifies a call (slow or not, failed or not) before it sends its outcome code,
    # and draws the open time's jitter itself (sent per call as the spread)
    decided_by_the_replica = {"slow_call_duration_s", "open_jitter", *_CODE}
    assert not sent & decided_by_the_replica
    assert sent | decided_by_the_replica == {f.name for f in dataclasses.fields(BreakerConfig)}
    config = BreakerConfig.of(window_type="time", window_size=30, minimum_calls=7, open_max_s=90.0)
    args = breaker_option_args(config)
    shown = dict(zip([name for name, _, _ in BREAKER_OPTION_ARGS], args, strict=True))
    assert (shown["wtype"], shown["wsize"], shown["min_calls"]) == (b"time", b"30", b"7")
    assert (shown["c_thr"], shown["open_max"], shown["r_thr"]) == (b"0", b"90.0", b"90.0")  # 0: off
