"""docs/policy.md is generated from the options models (python -m ragguard_tools.policy_doc) and
docs/layers.md writes the order of ragguard.layers.REGISTRY: both are checked against the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

import ragguard
from ragguard import layers
from ragguard import options as policy
from ragguard.options import _layers as _registry
from ragguard.options._breaker import BREAKER_KINDS
from ragguard.options._policy import STANDARD_STAGES
from ragguard_tools import policy_doc as _policy_doc

pytestmark = [pytest.mark.timeout(60)]

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_committed_policy_reference_is_what_the_models_say() -> None:
    assert (DOCS / "policy.md").read_text(encoding="utf-8") == _policy_doc.render(), (
        "docs/policy.md is out of date: run python -m ragguard_tools.policy_doc"
    )


def test_the_check_command_tells_an_outdated_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = subprocess.run([sys.executable, "-m", "ragguard_tools.policy_doc", "--check"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    stale = tmp_path / "policy.md"
    stale.write_text(_policy_doc.render().replace("| `attempts` | int | `1`", "| `attempts` | int | `3`"))
    monkeypatch.setattr(_policy_doc, "DOC", stale)
    assert _policy_doc.main(["--check"]) == 1
    assert _policy_doc.main([]) == 0 and stale.read_text() == _policy_doc.render()


def _models() -> list[type[BaseModel]]:
    found = [policy.Policy, policy.StagePolicy, policy.GenerationPolicy, policy.TenantQuota,
             policy.TokenLimits, policy.PoolQuota]  # fmt: skip
    found += [m for m in map(_registry.model, _registry.STAGE_FIELDS) if m is not None]
    return found


def test_every_field_of_every_model_is_in_the_reference_with_its_default_and_bounds() -> None:
    text = (DOCS / "policy.md").read_text(encoding="utf-8")
    for model in _models():
        assert f"`{model.__name__}`" in text or f"## {model.__name__}" in text, model
        for name, field in model.model_fields.items():
            rows = [line for line in text.splitlines() if line.startswith(f"| `{name}` |")]
            assert rows, (model.__name__, name)
            if isinstance(field.default, float | int) and not isinstance(field.default, bool):
                assert any(f"| `{field.default}` |" in row for row in rows), (model.__name__, name)
    assert "| `attempts` | int | `1` | >= 1, <= 20 |" in text  # e.g. RetryPolicy.attempts
    for kind in [*BREAKER_KINDS, "none"]:  # the breaker kinds are listed
        assert f"| `{kind}` |" in text
    for stage in STANDARD_STAGES:  # and what each standard stage's preset sets
        assert f"| `{stage}` | `preset: {stage}`" in text


def test_docs_layers_md_gives_the_order_of_the_registry() -> None:
    text = (DOCS / "layers.md").read_text(encoding="utf-8")
    order = text.split("## The order", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([a-z_]+) \|", order, flags=re.MULTILINE)[1:]  # after the header
    assert rows == [name for name, _ in layers.REGISTRY]
    assert set(rows) == _registry.BUILT_IN  # no user layer registered while the suite runs this


def test_the_public_names_of_the_models_still_work() -> None:
    for name in ("AdaptivePolicy", "BreakerPolicy", "HedgePolicy", "RetryPolicy", "ThrottlePolicy"):
        assert getattr(ragguard, name) is getattr(policy, name)
