"""The built-in scenario's comments say what its faults do to the demo's guarded service; the
numbers they quote are the demo policy's and the typed breaker's, not remembered ones."""

from __future__ import annotations

import re
from importlib import resources

from ragguard.breakers import EmbeddingTimeoutBreaker
from ragguard.chaos import default_scenario
from ragguard_tools.demo.guarded import demo_policy


def _comment_above(text: str, marker: str) -> str:
    lines = text.splitlines()
    i = next(n for n, line in enumerate(lines) if marker in line and not line.lstrip().startswith("#"))
    above: list[str] = []
    for line in reversed(lines[:i]):
        if not line.lstrip().startswith("#"):
            break
        above.insert(0, line.strip().lstrip("#").strip())
    return " ".join(above)


def test_the_embedding_spike_comment_quotes_the_demos_own_lines() -> None:
    # user report: the comment said "past the embedding breaker's 3 s slow-call line", but the
    # demo's guarded embedding is slow above 0.3 s (docs/demo.md)
    text = resources.files("ragguard.chaos").joinpath("scenarios/default.yaml").read_text(encoding="utf-8")
    comment = _comment_above(text, "{kind: latency, stage: embedding, rate: 0.25")
    embedding = demo_policy().stages["embedding"]
    assert embedding.breaker is not None and embedding.timeout_s is not None
    slow, timeout = embedding.breaker.slow_call_duration_s, embedding.timeout_s
    said = f"demo's guarded embedding (slow above {slow:g} s, cut at its {timeout:g} s attempt timeout)"
    assert said in comment, comment
    typed = EmbeddingTimeoutBreaker.defaults["slow_call_duration_s"]
    assert f"default EmbeddingTimeoutBreaker's {typed:g} s slow-call line" in comment, comment
    (spike,) = [f for p in default_scenario().phases for f in p.faults
                if f.kind == "latency" and f.stage == "embedding" and f.rate == 0.25]  # fmt: skip
    assert spike.seconds > max(slow, timeout, typed)
    quoted = {float(x) for x in re.findall(r"(\d+(?:\.\d+)?) s\b", comment)}
    assert quoted <= {spike.seconds, slow, timeout, typed}, quoted  # no other number of seconds claimed


def test_one_of_the_models_two_deployments_goes_down_for_a_phase() -> None:
    """Issue 28's demo: the generation stage's group has two deployments, and the scenario stops
    one of them (its fault proxy) for a phase, the other staying up; the demo can apply it."""
    from ragguard_tools.demo.backends import DEPLOYMENTS
    from ragguard_tools.demo.faults import PROXY_TARGETS, ChaosPlan

    scenario = default_scenario()
    downs = [(p.name, f.target, f.action) for p in scenario.phases for f in p.faults
             if f.kind == "proxy" and f.target.startswith("generator_")]  # fmt: skip
    assert downs == [("model a down", "generator_a", "stop")]
    assert {f"generator_{d}" for d in DEPLOYMENTS} <= set(PROXY_TARGETS)
    assert [d.name for d in demo_policy().groups["model"].deployments] == list(DEPLOYMENTS)
    ChaosPlan(scenario)  # raises ConfigError for a fault the demo cannot apply
