"""examples/quickstart.py runs as the README says, and shows each fallback taking over."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


def test_the_quickstart_runs_and_degrades_as_it_says() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 12
    assert "keyword_search" not in lines[0] and "chunked_rerank" in lines[0]  # the store is up
    assert all("keyword_search" in line for line in lines[3:])  # the store is down from request 3
    assert lines[-1].endswith("vector_store breaker: open")
    assert "warning" not in done.stderr.lower() and "cannot read a score" not in done.stderr
