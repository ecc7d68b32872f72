"""The event file is complete when a program ends, whether or not it closed the recorder."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ragguard.monitors._record import load_records
from ragguard_tools.doctor import diagnose

SCRIPT = """
import asyncio, sys
from ragguard import guard, monitors

@guard("search")
async def search(q: int) -> int:
    if q % 10 == 0:
        raise ConnectionRefusedError("down")
    return q

async def calls(n: int) -> None:
    for i in range(1, n + 1):
        try:
            await search(i)
        except ConnectionRefusedError:
            pass

{body}
"""


def _run(tmp_path: Path, body: str, name: str = "ragguard-events.jsonl") -> list[dict[str, object]]:
    path = tmp_path / name
    script = SCRIPT.format(body=textwrap.dedent(body))
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    return load_records(path)


def _tallies(records: list[dict[str, object]]) -> list[dict[str, object]]:
    return [r for r in records if r["type"] == "Tally"]


@pytest.mark.timeout(60)
def test_a_program_that_never_closes_the_recorder_leaves_every_call_counted(tmp_path: Path) -> None:
    records = _run(tmp_path, """
        monitors.record_events(sys.argv[1])   # as docs/monitors.md's quick start: never closed
        asyncio.run(calls(200))
    """)
    last = _tallies(records)[-1]  # was: the first tally only (1 call), written at the first call
    assert last["stages"] == {"search": {"success": 180, "error": 20}}
    assert last["calls"] == {"search": {"success": 180, "failure": 20}}
    assert diagnose(records).calls == 200  # what `ragguard doctor` reports, as diagnose() in-process


@pytest.mark.timeout(60)
def test_close_and_the_context_manager_write_the_last_counts_once(tmp_path: Path) -> None:
    closed = _tallies(_run(tmp_path, """
        recorder = monitors.record_events(sys.argv[1])
        asyncio.run(calls(50))
        recorder.close()
        recorder.close()
    """))
    assert closed[-1]["stages"] == {"search": {"success": 45, "error": 5}}
    assert [t["stages"] for t in closed].count(closed[-1]["stages"]) == 1, "exit wrote no second copy"

    with_block = _tallies(_run(tmp_path, """
        with monitors.record_events(sys.argv[1]):
            asyncio.run(calls(30))
        asyncio.run(calls(30))   # after the block: not recorded
    """, "with.jsonl"))
    assert with_block[-1]["stages"] == {"search": {"success": 27, "error": 3}}
    assert [t["stages"] for t in with_block].count(with_block[-1]["stages"]) == 1
    assert json.dumps(with_block[-1]["calls"]) == json.dumps({"search": {"success": 27, "failure": 3}})
