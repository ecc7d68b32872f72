"""The FastAPI example runs standalone on loopback, answers every status, and exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_service.py"


@pytest.mark.timeout(60)
def test_example_runs_and_exits() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("200: 200 {'tenant': 'acme'")
    assert lines[1].startswith("429: 429 Retry-After=5 retry-after-ms=")
    assert lines[1].endswith('RateLimit="rate";r=0;t=5')
    assert lines[2] == "degraded: 200 ragguard-degraded: keyword_search"
    assert lines[3].startswith("504: 504 deadline exceeded")
    assert lines[4] == '401: 401 unknown API key (WWW-Authenticate: APIKey header="x-api-key")'
    assert lines[5] == "claimed acme: 200 ran as default"  # a tenant header is not an API key
    assert lines[6] == "400: 400 x-api-key was sent 2 times; send it once"
    assert lines[7] == "health: 200 ['vector_store']"
    assert "RagguardMiddleware" in EXAMPLE.read_text() and "status_code ==" not in EXAMPLE.read_text()
