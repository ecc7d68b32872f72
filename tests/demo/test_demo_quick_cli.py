"""`ragguard demo --quick`, run as a user runs it: the guarded service must beat the unguarded one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ragguard.demo.runner import GREEDY_TOKEN_BURST


@pytest.mark.timeout(180)
def test_ragguard_demo_quick_guarded_beats_unguarded(tmp_path: Path) -> None:
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "ragguard.cli", "demo", "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=170, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    unguarded, guarded = report["summary"]["unguarded"], report["summary"]["guarded"]
    assert guarded["success_rate"] > unguarded["success_rate"]
    assert guarded["latency_ms"]["p99"] < unguarded["latency_ms"]["p99"]
    recall = guarded["recall_at_5_answered"]
    assert recall is not None and 0.0 <= recall <= 1.0
    print(f"quick demo: success {unguarded['success_rate']:.1%} -> {guarded['success_rate']:.1%}, "
          f"P99 {unguarded['latency_ms']['p99']:.0f} -> {guarded['latency_ms']['p99']:.0f} ms, "
          f"guarded recall@5 {recall:.1%} (healthy baseline {report['baseline_recall_at_5']:.1%})")
    assert "recall@5" in proc.stdout
    assert (out / "latency.png").read_bytes().startswith(b"\x89PNG")

    # the generation hop: its rows are in the table, and the guarded run wins there too
    table = " ".join(proc.stdout.split())
    for row in ("time to first word P95", "answered late, after a stall", "failed: cut mid-answer",
                "streams cut by the first-word budget", "streams cut by the idle budget",
                "streams cut by the total budget", "generation fallback, before the first word",
                "tokens/s, mean / peak: hoarder (greedy)", "streams paced: hoarder (to 600 tokens/s)",
                "streams paced: every other tenant"):
        assert row in table, row
    assert guarded["answered_after_stall"] < unguarded["answered_after_stall"], "stalls end in late answers"
    assert guarded["ttft_ms"]["p95"] < unguarded["ttft_ms"]["p95"]
    assert guarded["stream_cuts"]["first_item"] + guarded["stream_cuts"]["idle"] > 0
    streams, greedy = guarded["streams_by_tenant"], report["greedy_tenants"][0]
    assert streams[greedy]["paced_streams"] > 0, "the greedy tenant is paced"
    assert all(v["paced_streams"] == 0 for t, v in streams.items() if t != greedy), "the others are not"
    horizon = report["options"]["duration_s"] + report["options"]["client_timeout_s"]
    rate = guarded["paced_tokens_per_s"][greedy]
    assert streams[greedy]["tokens"] <= rate * horizon + GREEDY_TOKEN_BURST
    print(f"generation: TTFT P95 {unguarded['ttft_ms']['p95']:.0f} -> {guarded['ttft_ms']['p95']:.0f} ms, "
          f"answered after a stall {unguarded['answered_after_stall']} -> {guarded['answered_after_stall']}, "
          f"greedy paced in {streams[greedy]['paced_streams']} of {streams[greedy]['streams']} streams")

    # the run's events are recorded beside the report, and `ragguard doctor` reads them
    doctor = subprocess.run(
        [sys.executable, "-m", "ragguard.cli", "doctor", "--events", str(out / "events.jsonl"), "--json"],
        capture_output=True, text=True, timeout=60,
    )
    assert doctor.returncode in (0, 1), doctor.stderr  # 0 healthy, 1 findings; 2 would be unreadable
    diagnosis = json.loads(doctor.stdout)
    assert diagnosis["events"] > guarded["breaker_transitions"] > 0
