"""`ragguard demo --status-port PORT`, run as a user runs it: it says where its status is, serves it
from start-up to exit (before the guarded run: no stages and a note saying nothing is guarded yet;
then the guarded run's Guard), and refuses a port it cannot bind at once, naming the option."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ragguard.chaos._redis_server import free_port
from ragguard_tools.top import fetch

pytest.importorskip("wordllama")

DEMO = [sys.executable, "-m", "ragguard_tools.cli", "demo"]


def _lines(proc: subprocess.Popen[str], into: list[tuple[float, str]]) -> threading.Thread:
    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            into.append((time.monotonic(), line.rstrip("\n")))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(240)
def test_the_demo_says_where_its_status_is_and_serves_it_throughout(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/status"
    proc = subprocess.Popen(
        [*DEMO, "--duration", "3", "--status-port", str(port), "--out", str(tmp_path / "report")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    lines: list[tuple[float, str]] = []
    reader = _lines(proc, lines)
    seen: list[dict[str, Any]] = []
    first_top: subprocess.CompletedProcess[str] | None = None
    try:
        deadline = time.monotonic() + 200
        while not any(url in line for _, line in lines) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        said = next(line for _, line in lines if url in line)
        assert said.startswith("demo: status on") and "guarded run" in said, said
        # the line comes first, and the endpoint answers from then on: ragguard top, at once
        assert lines[0][1] == said, lines[:3]
        first_top = subprocess.run([sys.executable, "-m", "ragguard_tools.cli", "top", url, "--once",
                                    "-n", "0.2"], capture_output=True, text=True, timeout=60)  # fmt: skip
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                seen.append(fetch(url))
            except (OSError, ValueError):
                runs_over = any(line.lstrip().startswith("guarded") and "done;" in line for _, line in lines)
                if proc.poll() is None and not runs_over:
                    raise  # the endpoint refused while the demo was still running its runs
            time.sleep(0.1)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        reader.join(timeout=10)
    assert proc.returncode == 0, (proc.stderr.read() if proc.stderr else "")[-2000:]
    assert first_top is not None and first_top.returncode == 0, first_top
    assert "nothing is guarded yet" in first_top.stdout, first_top.stdout
    notes = [s.get("note", "") for s in seen]
    waiting = [i for i, n in enumerate(notes) if "nothing is guarded yet" in n]
    guarded = [i for i, n in enumerate(notes) if n == "demo: the guarded run"]
    assert waiting and guarded, sorted(set(notes))
    assert max(waiting) < min(guarded), "nothing guarded, then the guarded run"
    assert any("the unguarded run" in n for n in notes), sorted(set(notes))
    assert all(seen[i]["stages"] == {} for i in waiting)
    during = seen[guarded[-1]]
    assert {"embedding", "vector_store", "rerank", "generation"} <= set(during["stages"])
    assert "counts" in during and "hoarder" in during["quotas"]["tenants"]


def test_a_status_port_in_use_is_refused_at_once_naming_the_option(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        done = subprocess.run([*DEMO, "--quick", "--status-port", str(port), "--out", str(tmp_path)],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    said = f"ragguard demo: --status-port {port} cannot be served on 127.0.0.1: Address already in use\n"
    assert done.stderr == said
    assert "loading the model" not in done.stdout, "refused before the model loads"
    print(f"refused in {time.monotonic() - t0:.1f} s")
