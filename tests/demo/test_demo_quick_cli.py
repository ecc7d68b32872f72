"""`ragguard demo --quick`, run as a user runs it: the guarded service must beat the unguarded one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragguard.chaos import default_scenario
from ragguard_tools.demo.runner import GREEDY_TOKEN_BURST


@pytest.mark.timeout(180)
def test_ragguard_demo_quick_guarded_beats_unguarded(tmp_path: Path) -> None:
    out = tmp_path / "ragguard-report"  # the default --out, as a new user runs it
    proc = _run_reading_lines([sys.executable, "-m", "ragguard_tools.cli", "demo", "--quick"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # gRPC's C core keeps quiet (GRPC_VERBOSITY=ERROR unless the user set it): no teardown chatter
    assert "chttp2_transport" not in proc.stderr and "goaway" not in proc.stderr.lower(), proc.stderr[-2000:]
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
    for row in ("time to first word P95", "answered late, after a stall",
                "failed: incomplete (cut mid-answer)", "answers cut by budget (first/idle/total)",
                "generation fallback, before the first word",
                "answered by b (model failover)", "model[a]: streams failed / all",
                "answers ended completed", "answers ended continued", "answers ended incomplete",
                "answers without a typed ending", "recall@5 of continued answers",
                "tokens/s, mean / peak: hoarder (greedy)", "streams paced: hoarder (to 600 tokens/s)",
                "streams paced: every other tenant"):
        assert row in table, row
    assert guarded["answered_after_stall"] < unguarded["answered_after_stall"], "stalls end in late answers"
    # a first word over 1 s: the model's slow start reaches the unguarded callers, the guarded run
    # cuts it (0.6 s) and serves its fallback (the P95 of answers begun is no measure in a run this
    # short: the unguarded service begins too few answers for its slow ones to reach it)
    assert guarded["slow_first_word"] < unguarded["slow_first_word"]
    # model a goes down, answers stall midway: failed over to b, continued, every one typed
    assert guarded["failovers"].get("model/b", 0) > 0, guarded["failovers"]
    assert guarded["endings"]["continued"] > 0 and guarded["untyped_endings"] == 0, guarded["endings"]
    streams, greedy = guarded["streams_by_tenant"], report["greedy_tenants"][0]
    # the greedy tenant asks for about twice its pacing rate when the machine keeps up; a busy
    # machine serves it less, and a tenant whose streams together stay under the rate is not
    # paced: only then may no stream have waited
    rate_s = report["options"]["greedy_tokens_per_s"] * report["options"]["duration_s"]
    assert streams[greedy]["paced_streams"] > 0 or streams[greedy]["tokens"] < 0.5 * rate_s, (
        f"the greedy tenant is paced: {streams[greedy]}"
    )
    assert all(v["paced_streams"] == 0 for t, v in streams.items() if t != greedy), "the others are not"
    horizon = report["options"]["duration_s"] + report["options"]["client_timeout_s"]
    rate = guarded["paced_tokens_per_s"][greedy]
    assert streams[greedy]["tokens"] <= rate * horizon + GREEDY_TOKEN_BURST
    print(f"generation: TTFT P95 {unguarded['ttft_ms']['p95']:.0f} -> {guarded['ttft_ms']['p95']:.0f} ms, "
          f"answered after a stall {unguarded['answered_after_stall']} -> {guarded['answered_after_stall']}, "
          f"greedy paced in {streams[greedy]['paced_streams']} of {streams[greedy]['streams']} streams")

    # not a terminal: a plain line as each scenario phase begins, printed while the run goes on
    phases = len(default_scenario().phases)
    for mode in ("unguarded", "guarded"):
        said = [(at, line) for at, line in proc.lines
                if re.match(rf" *{mode} +[0-9.]+ s: phase \d+/{phases} ", line)]  # fmt: skip
        assert [int(re.search(r"phase (\d+)/", line)[1]) for _, line in said] == list(range(1, phases + 1))
        assert said[-1][0] - said[0][0] > 0.5 * report["options"]["duration_s"], "lines came as phases began"
        n = report["summary"][mode]["requests"]
        assert any(re.match(rf" *{mode} +[0-9.]+ s: done; {n}/{n} requests", line) for _, line in proc.lines)
    assert "demo: loading the model and starting the backends" in proc.stdout

    # the run's events are recorded beside the report, and `ragguard doctor`, run next with no
    # arguments where the demo ran, finds them and says where it read them
    doctor = subprocess.run(
        [sys.executable, "-m", "ragguard_tools.cli", "doctor", "--json"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert doctor.returncode in (0, 1), doctor.stderr  # 0 healthy, 1 findings; 2 would be unreadable
    assert "reading ./ragguard-report/events.jsonl" in doctor.stderr
    diagnosis = json.loads(doctor.stdout)
    assert diagnosis["events"] > guarded["breaker_transitions"] > 0
    # and tells the two runs apart (the events file holds both)
    assert [r["name"] for r in diagnosis["runs"] if r["name"]] == ["unguarded", "guarded"]
    assert {f["run"] for f in diagnosis["findings"]} <= {"", "unguarded", "guarded"}
    assert any(f["run"] == "guarded" for f in diagnosis["findings"] if f["kind"] == "breaker_open")


class _Done:
    def __init__(self, returncode: int, lines: list[tuple[float, str]], stderr: str) -> None:
        self.returncode, self.lines, self.stderr = returncode, lines, stderr
        self.stdout = "\n".join(line for _, line in lines)


def _run_reading_lines(argv: list[str], cwd: Path) -> _Done:
    """Run ``argv`` with stdout a pipe (not a terminal), each line stamped as it arrives, in the
    environment a user has (without the GRPC_VERBOSITY tests/conftest.py sets)."""
    lines: list[tuple[float, str]] = []
    err_path = cwd / "stderr.txt"
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    with err_path.open("w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, cwd=cwd, env=env)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append((time.monotonic(), line.rstrip("\n")))
            proc.wait(timeout=170)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return _Done(proc.returncode, lines, err_path.read_text())
