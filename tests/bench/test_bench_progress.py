"""What `ragguard bench` shows while it runs: a line per contender and step in a log or a pipe."""

from __future__ import annotations

import io

from rich.console import Console

from ragguard_tools.bench._runner import _Progress


def _drive(progress: _Progress) -> None:
    progress.start()
    progress.say("bench: starting")
    for step in range(2):
        for name in ("unguarded", "ragguard-adaptive"):
            progress.describe(f"round 1/1 step {step + 1}/2: 33 rps -> {name}")
            progress.advance(f"goodput {10 + step:.1f} rps")
    progress.describe("capacity halving: unguarded")
    progress.advance()
    progress.stop()


def test_a_log_gets_a_line_as_each_contender_finishes_a_step() -> None:
    out = io.StringIO()
    _drive(_Progress(Console(file=out, force_terminal=False, width=60), total=5))
    assert out.getvalue().splitlines() == [
        "bench: starting",
        "bench 1/5 round 1/1 step 1/2: 33 rps -> unguarded: goodput 10.0 rps",
        "bench 2/5 round 1/1 step 1/2: 33 rps -> ragguard-adaptive: goodput 10.0 rps",
        "bench 3/5 round 1/1 step 2/2: 33 rps -> unguarded: goodput 11.0 rps",
        "bench 4/5 round 1/1 step 2/2: 33 rps -> ragguard-adaptive: goodput 11.0 rps",
        "bench 5/5 capacity halving: unguarded",
    ]  # one line each, unwrapped at any console width


def test_a_terminal_gets_the_live_bar_only() -> None:
    out = io.StringIO()
    _drive(_Progress(Console(file=out, force_terminal=True, width=120), total=5))
    text = out.getvalue()
    assert "5/5" in text and "bench: starting" not in text and "goodput" not in text
