"""A tiny demo run end to end: both runs, the table, the JSON report and the chart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragguard import ConfigError
from ragguard.demo import DemoOptions, run_demo_async
from ragguard.demo.scenario import load_scenario

pytestmark = [pytest.mark.anyio]

# Short phases need short latency spikes: a 1 s spike still trips the guarded embedding breaker
# (slow above 0.3 s, attempt timeout 0.5 s) while the unguarded service waits the whole second.
TINY_SCENARIO = """
name: tiny
phases:
  - {name: warm-up, start: 0.0}
  - {name: slow embeddings, start: 0.2, embedding: {latency_s: 1.0, share: 0.5}}
  - {name: vector store down, start: 0.45, vector_store: {down: true}}
  - {name: rerank OOM, start: 0.65, rerank: {memory_budget_mib: 2}}
  - {name: recovery, start: 0.85}
"""


@pytest.mark.timeout(90)
async def test_tiny_demo_run(tmp_path: Path) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY_SCENARIO)
    options = DemoOptions(
        duration_s=4.0, scenario=scenario, out_dir=tmp_path / "out", backends_in_process=True,
        progress=False, capacity=8, seed=11,
    )
    report = await run_demo_async(options)

    unguarded, guarded = report.summaries["unguarded"], report.summaries["guarded"]
    assert unguarded["requests"] == guarded["requests"] > 50, "both runs replay the same arrivals"
    assert guarded["success_rate"] > unguarded["success_rate"]
    assert guarded["success_rate_well_behaved"] > unguarded["success_rate_well_behaved"]
    assert guarded["latency_all_requests_ms"]["p99"] < unguarded["latency_all_requests_ms"]["p99"]
    # Only the greedy tenant is shed; the unguarded service has no quotas at all.
    assert sum(unguarded["quota_rejections"].values()) == 0
    assert all(n == 0 for t, n in guarded["quota_rejections"].items() if t != options.greedy_tenant)
    assert guarded["quota_rejections"][options.greedy_tenant] > 0
    assert guarded["breaker_transitions"] > 0 and unguarded["breaker_transitions"] == 0
    assert "keyword_search" in guarded["fallback_share"]
    assert 0.5 <= report.baseline_recall_at_5 <= 1.0

    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert set(data["summary"]) == {"unguarded", "guarded"}
    assert len(data["requests"]["guarded"]) == guarded["requests"]
    assert [p[0] for p in data["phases"]["guarded"]] == [p.name for p in load_scenario(scenario).phases]
    png = (tmp_path / "out" / "latency.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert report.table().row_count > 10


def test_options_are_validated() -> None:
    with pytest.raises(ConfigError):
        DemoOptions(duration_s=0.1)
    with pytest.raises(ConfigError):
        DemoOptions(concurrency=0)
    with pytest.raises(ConfigError):
        DemoOptions(greedy_tenant="acme")
    with pytest.raises(ConfigError):
        DemoOptions(redis_url="http://nope")
    assert DemoOptions(quick=True).run_duration_s < DemoOptions().run_duration_s


def test_bad_scenarios_are_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nphases:\n  - {name: a, start: 0.5}\n")
    with pytest.raises(ConfigError, match="first phase"):
        load_scenario(bad)
    bad.write_text("name: x\nphases:\n  - {name: a, start: 0.0, embedding: {share: 2}}\n")
    with pytest.raises(ConfigError, match="share"):
        load_scenario(bad)
    with pytest.raises(ConfigError):
        load_scenario(tmp_path / "missing.yaml")
    assert load_scenario().phases[0].healthy
