"""A tiny demo run end to end: both runs, the table, the JSON report and the chart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragguard import ConfigError
from ragguard.chaos import load_scenario
from ragguard_tools.demo import DemoOptions, run_demo_async
from ragguard_tools.demo.runner import GREEDY_TOKEN_BURST

pytestmark = [pytest.mark.anyio]

# Short phases need short latency spikes: a 1 s spike still trips the guarded embedding breaker
# (slow above 0.3 s, attempt timeout 0.5 s) while the unguarded service waits the whole second.
# The model's faults are longer than the guarded generation budgets (0.4 s per word of each
# deployment, 0.6 s to the first word) and than what the report calls a stall (1 s).
TINY_SCENARIO = """
name: tiny
phases:
  - {name: warm-up, start: 0.0, end: 0.15}
  - name: slow embeddings
    start: 0.15
    end: 0.28
    faults: [{kind: latency, stage: embedding, rate: 0.5, seconds: 1.0}]
  - name: vector store down
    start: 0.28
    end: 0.38
    faults: [{kind: proxy, target: vector_store, action: stop}]
  - name: rerank OOM
    start: 0.38
    end: 0.48
    faults: [{kind: error, stage: rerank, error: cuda_oom, min_batch: 16}]
  - name: model a down
    start: 0.48
    end: 0.58
    faults: [{kind: proxy, target: generator_a, action: stop}]
  - name: slow first word
    start: 0.58
    end: 0.68
    faults: [{kind: latency, stage: generation, rate: 0.5, seconds: 1.5}]
  - name: stalls midway
    start: 0.68
    end: 0.8
    faults: [{kind: latency, stage: generation_midway, rate: 1.0, seconds: 1.5}]
  - name: greedy runs long
    start: 0.8
    end: 0.92
    faults: [{kind: latency, stage: generation_overrun, tenant: hoarder, seconds: 0.3}]
  - {name: recovery, start: 0.92, end: 1.0}
"""


@pytest.mark.timeout(90)
async def test_tiny_demo_run(tmp_path: Path) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY_SCENARIO)
    # The greedy tenant's 15 requests/s of 30-word answers hand over about 550 tokens/s of the
    # model's on an idle machine, 500 with a core taken by another process, 150 on a starved one:
    # the demo's pace (600 tokens/s) bites only on its overrun phase, which this run holds for
    # 0.6 s. Paced well below the greedy flow, it must bite whatever the machine's speed.
    options = DemoOptions(
        duration_s=5.0, scenario=scenario, out_dir=tmp_path / "out", backends_in_process=True,
        progress=False, capacity=16, seed=11, greedy_tokens_per_s=300.0,
    )
    report = await run_demo_async(options)

    unguarded, guarded = report.summaries["unguarded"], report.summaries["guarded"]
    assert unguarded["requests"] == guarded["requests"] > 50, "both runs replay the same arrivals"
    assert guarded["success_rate"] > unguarded["success_rate"]
    assert guarded["success_rate_well_behaved"] > unguarded["success_rate_well_behaved"]
    # (not the P99: in a 5 s run it is the slowest few answers, and a loaded machine's stall decides it)
    assert guarded["goodput_per_s"] > unguarded["goodput_per_s"]
    # Only the greedy tenant is shed; the unguarded service has no quotas at all.
    assert sum(unguarded["quota_rejections"].values()) == 0
    assert all(n == 0 for t, n in guarded["quota_rejections"].items() if t != options.greedy_tenant), guarded[
        "quota_rejections"]
    assert guarded["quota_rejections"][options.greedy_tenant] > 0
    # nothing is turned away blind in the guarded run: gRPC has no limit of its own there, the
    # interceptor holding the RPCs in flight to the capacity, the greedy tenant giving way first
    # (docs/grpc.md)
    assert guarded["outcomes"]["overloaded"] == 0
    assert guarded["breaker_transitions"] > 0 and unguarded["breaker_transitions"] == 0
    assert "keyword_search" in guarded["fallback_share"]
    assert 0.5 <= report.baseline_recall_at_5 <= 1.0
    assert len(report.baseline_hits) == report.questions
    assert guarded["recall_at_5_answered_healthy"] is not None

    # The generation hop: slow starts and stalls reach the unguarded callers; in the guarded run
    # deployment a's answers fail over to b while a is down, a slow first word is cut (a fallback
    # serves before it), a stall after it is continued, whole, and every answer ends typed.
    # (first words over 1 s, not the TTFT P95 of answers begun: the unguarded run begins too few
    # answers in 5 s for its slow ones to reach its P95, and the guarded one's include failovers)
    assert guarded["answered_after_stall"] < unguarded["answered_after_stall"]
    assert guarded["slow_first_word"] < unguarded["slow_first_word"]
    assert unguarded["stream_cuts"] is None and unguarded["streams_by_tenant"] is None
    assert guarded["generation_fallbacks"] > 0 and "extractive_answer" in guarded["fallback_share"]
    assert guarded["failovers"].get("model/b", 0) > 0, guarded["failovers"]
    assert guarded["endings"]["continued"] > 0 and guarded["untyped_endings"] == 0, guarded["endings"]
    assert guarded["recall_at_5_continued"] is not None
    assert guarded["whole_answers"] == guarded["whole_checked"] > 0, "no word repeated or missing"
    streams = guarded["streams_by_tenant"]
    assert streams[options.greedy_tenant]["paced_streams"] > 0
    assert all(v["paced_streams"] == 0 for t, v in streams.items() if t != options.greedy_tenant), streams
    # paced, the greedy tenant's model tokens stay within its rate plus its burst (GCRA)
    rate = guarded["paced_tokens_per_s"][options.greedy_tenant]
    assert rate == options.greedy_tokens_per_s
    horizon = options.run_duration_s + options.client_timeout_s
    assert streams[options.greedy_tenant]["tokens"] <= rate * horizon + GREEDY_TOKEN_BURST

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
        DemoOptions(greedy_tokens_per_s=0)
    with pytest.raises(ConfigError):
        DemoOptions(redis_url="http://nope")
    assert DemoOptions(quick=True).run_duration_s < DemoOptions().run_duration_s


@pytest.mark.parametrize(
    ("faults", "message"),
    [
        ("[{kind: latency, stage: search, seconds: 1.0}]", "unknown stage"),
        ("[{kind: latency, seconds: 1.0}]", "name a stage"),
        ("[{kind: latency, stage: embedding, tenant: acme, seconds: 1.0}]", "every tenant"),
        ("[{kind: proxy, target: redis, action: stop}]", "proxies for"),
        ("[{kind: latency, stage: rerank, seconds: 1.0}]", "out-of-memory"),
        ("[{kind: partial, stage: generation_midway, keep: 0.5}]", "at the generation points"),
    ],
)
def test_faults_the_demo_cannot_apply_are_config_errors(tmp_path: Path, faults: str, message: str) -> None:
    from ragguard_tools.demo.faults import ChaosPlan

    path = tmp_path / "bad.yaml"
    path.write_text(f"name: x\nphases:\n  - {{name: a, start: 0.0, end: 1.0, faults: {faults}}}\n")
    with pytest.raises(ConfigError, match=message):
        ChaosPlan(load_scenario(path))


def test_the_default_scenario_becomes_a_timeline() -> None:
    from ragguard.chaos import default_scenario
    from ragguard_tools.demo.faults import ChaosPlan

    timeline = ChaosPlan(default_scenario()).timeline(40.0)
    assert timeline[0] == (0.0, timeline[0][1]) and not timeline[0][1].backend
    assert any(state.backend for _, state in timeline)
    assert any("vector_store" in state.proxies for _, state in timeline)
    assert any(state.rerank_oom for _, state in timeline)
    stages = {spec["stage"] for _, state in timeline for spec in state.backend}
    assert {"generation", "generation_midway", "generation_overrun"} <= stages
    assert [t for t, _ in timeline] == sorted(t for t, _ in timeline)
