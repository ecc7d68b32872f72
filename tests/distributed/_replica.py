"""What the replica scripts of the multi-process tests share (``_tokens_worker.py``,
``_deployment_worker.py``): the start handshake and the event loop's lag, and the test's side,
:func:`run_replicas`, which starts them together and reads what each measured."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["Lag", "run_replicas", "started"]


async def started(client: Any) -> float:
    """Say ``ready`` once ``client`` (a redis.asyncio client) answers, read the start time (wall
    clock, one line on stdin) and wait for it; the start time."""
    await client.ping()
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    await asyncio.sleep(max(0.0, start_at - time.time()))
    return start_at


class Lag:
    """The longest the event loop was late to wake a 5 ms sleep until ``end`` (wall clock):
    tokens whose wait ended meanwhile reach their readers together when it wakes."""

    def __init__(self) -> None:
        self.s = 0.0

    async def watch(self, end: float) -> None:
        while time.time() < end:
            before = time.monotonic()
            await asyncio.sleep(0.005)
            self.s = max(self.s, time.monotonic() - before - 0.005)


def run_replicas(
    worker: Path, port: int, *args: object, processes: int = 3
) -> tuple[float, list[dict[str, Any]]]:
    """Run ``processes`` copies of the script ``worker`` (``PORT *args SEED``, seeds 0, 1, ...),
    start them together once each said ``ready``, and return the start time with the JSON line
    each printed last. Asserts every one exits 0 (its stderr as the message)."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(port), *map(str, args), str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for seed in range(processes)
    ]  # fmt: skip
    for p in procs:
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline().strip() == "ready", p.communicate(timeout=30)[1]
    start_at = time.time() + 0.3
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(f"{start_at!r}\n")
        p.stdin.flush()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=90)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return start_at, results
