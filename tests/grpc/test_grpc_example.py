"""The example service runs standalone on loopback and exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpc_service.py"


@pytest.mark.timeout(60)
def test_example_runs_and_exits() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("tenant=acme") == 3
    assert "refused: retry after" in done.stdout
    assert "bad input: INVALID_ARGUMENT" in done.stdout
    assert "claimed acme: ran as default" in done.stdout
