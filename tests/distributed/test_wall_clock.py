"""Issue 11, scenario 6: a step of a replica's wall clock does not move the shared breaker's
open-until. Shared times are the Redis server's (TIME); the replica keeps durations on its
monotonic clock. The replica runs in a subprocess whose ``time.time`` steps back an hour."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__).with_name("_wall_clock_worker.py")


@pytest.mark.timeout(60)
def test_a_wall_clock_step_does_not_keep_the_breaker_open(redis_server: Any) -> None:
    done = subprocess.run([sys.executable, str(WORKER), str(redis_server.port)], capture_output=True,
                          text=True, timeout=45)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tripped"] == "open"
    assert result["outcome"] == "ConnectionRefusedError", result  # not BreakerOpen for an hour
    assert result["reached"] == 1  # the half-open trial ran after open_for_s, as without the step
    assert result["retry_after_s"] is not None and result["retry_after_s"] <= 1.0  # reopened: ~0.5 s
