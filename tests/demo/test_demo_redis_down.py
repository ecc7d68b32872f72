"""`ragguard demo --redis` with Redis down, run as a user runs it: the run goes on on local state,
its event log records the switch, and `ragguard doctor` reports the outage. The URL's password is
printed nowhere (issue 21, item 9)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def _free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SECRET = "hunter2-Pa55"


@pytest.mark.timeout(180)
def test_demo_with_redis_down_records_the_outage_for_doctor(tmp_path: Path) -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{_free_port()}/0"
    demo = subprocess.run(
        [sys.executable, "-m", "ragguard_tools.cli", "demo", "--quick", "--duration", "2", "--redis", url,
         "--out", "r2"],
        capture_output=True, text=True, timeout=170, cwd=tmp_path,
    )
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    written = "".join(p.read_text(errors="replace") for p in (tmp_path / "r2").glob("*.js*"))
    assert SECRET not in demo.stdout + demo.stderr + written
    assert json.loads((tmp_path / "r2" / "report.json").read_text())["options"]["redis_url"].startswith(
        "redis://:***@127.0.0.1:")
    warned = [line for line in demo.stderr.splitlines() if "Redis unreachable" in line]
    assert warned, demo.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "r2" / "events.jsonl").read_text().splitlines()]
    degraded = {r["component"] for r in records if r["type"] == "SharedStateDegraded"}
    assert "quotas" in degraded and len(degraded) == len(warned), (degraded, warned)

    doctor = subprocess.run(
        [sys.executable, "-m", "ragguard_tools.cli", "doctor", "-e", "r2/events.jsonl", "--json"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert doctor.returncode == 1, doctor.stderr
    (f,) = [f for f in json.loads(doctor.stdout)["findings"] if f["kind"] == "shared_state"]
    assert f["summary"].startswith("shared state: Redis unreachable, ran on local state for "), f["summary"]
    assert "(component quotas" in f["summary"] or "quotas" in f["data"]["components"]
    assert set(f["data"]["components"]) == degraded and f["data"]["still_degraded"] == sorted(degraded)
    assert 0.5 < max(f["data"]["local_s"].values()) < 60
