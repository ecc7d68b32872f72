"""What the demo shows while it runs: plain lines in a log or a pipe, the live bar on a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from ragguard_tools.demo.loadgen import RequestRecord
from ragguard_tools.demo.progress import RunProgress, say

PHASES = [("warm-up", 0.0, 1.0), ("vector store down", 1.0, 2.5), ("recovery", 2.5, 4.0)]


def _record(outcome: str) -> RequestRecord:
    return RequestRecord(0.0, "acme", 0, 0.01, outcome)


def _drive(progress: RunProgress) -> None:
    progress.start()
    for tick in range(17):  # every 0.25 s of a 4 s run
        progress.elapsed(tick * 0.25)
        progress.done(_record("ok" if tick % 2 else "error"))
    progress.stop()


def test_a_log_gets_one_line_per_phase_as_it_begins_and_one_at_the_end() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=80)
    progress = RunProgress(console, "unguarded", 4.0, 20, PHASES)
    assert not progress.live
    _drive(progress)
    lines = out.getvalue().splitlines()
    assert lines[0] == "unguarded: 4 s of load, 20 requests planned"
    assert lines[1] == "unguarded   0.0 s: phase 1/3 'warm-up' (0.0-1.0 s); 0/20 requests, 0 answered"
    assert lines[2] == ("unguarded   1.0 s: phase 2/3 'vector store down' (1.0-2.5 s); "
                        "4/20 requests, 2 answered")
    assert lines[3] == "unguarded   2.5 s: phase 3/3 'recovery' (2.5-4.0 s); 10/20 requests, 5 answered"
    assert lines[4] == "unguarded   4.0 s: done; 17/20 requests, 8 answered"
    assert len(lines) == 5


def test_a_terminal_gets_the_live_bar_and_no_lines() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    progress = RunProgress(console, "guarded", 4.0, 20, PHASES)
    assert progress.live
    _drive(progress)
    text = out.getvalue()
    assert "17/20 requests, 8 answered" in text and "phase" not in text
    say(console, "demo: a step")  # steps are said in a log only
    assert "demo: a step" not in out.getvalue()
