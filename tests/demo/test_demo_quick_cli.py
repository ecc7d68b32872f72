"""`ragguard demo --quick`, run as a user runs it: the guarded service must beat the unguarded one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


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

    # the run's events are recorded beside the report, and `ragguard doctor` reads them
    doctor = subprocess.run(
        [sys.executable, "-m", "ragguard.cli", "doctor", "--events", str(out / "events.jsonl"), "--json"],
        capture_output=True, text=True, timeout=60,
    )
    assert doctor.returncode in (0, 1), doctor.stderr  # 0 healthy, 1 findings; 2 would be unreadable
    diagnosis = json.loads(doctor.stdout)
    assert diagnosis["events"] > guarded["breaker_transitions"] > 0
