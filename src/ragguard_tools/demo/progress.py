"""What ``ragguard demo`` shows while it runs: a live bar on a terminal, plain lines elsewhere.

A log or a pipe (CI, ``| tee``) cannot redraw a bar: rich prints it once, when it stops, so the
reader saw nothing for the whole run. There, each step prints one line as it begins, and a run
prints one line as each scenario phase begins and one when it ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .loadgen import RequestRecord

__all__ = ["RunProgress", "say"]


def say(console: Any, text: str) -> None:
    """Print ``text`` as one plain line when ``console`` is not a terminal (a terminal shows bars)."""
    if console is not None and not console.is_terminal:
        console.print(text, markup=False, highlight=False, soft_wrap=True)


class RunProgress:
    """One run's progress on ``console``: ``mode`` (unguarded, guarded), ``duration_s`` seconds of
    load, ``total`` requests planned, ``phases`` as (name, start_s, end_s) of the scenario.

    Call :meth:`start`, then :meth:`elapsed` with the seconds since the load began (often),
    :meth:`done` with every finished request, and :meth:`stop`.
    """

    def __init__(
        self,
        console: Any,
        mode: str,
        duration_s: float,
        total: int,
        phases: Sequence[tuple[str, float, float]],
    ) -> None:
        self.console = console
        self.mode = mode
        self.duration_s = duration_s
        self.total = total
        self.phases = list(phases)
        self.finished = 0
        self.answered = 0
        self.at_s = 0.0
        self._phase = -1
        self._bar: Any = None
        self._task: Any = None
        if console.is_terminal:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn(f"[bold]{mode:>9}[/bold]"), BarColumn(), TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(), console=console, transient=False,
            )  # fmt: skip
            self._task = self._bar.add_task(mode, total=duration_s, status="")

    @property
    def live(self) -> bool:
        """True when a bar is drawn (a terminal), False when plain lines are printed."""
        return self._bar is not None

    def start(self) -> None:
        if self._bar is not None:
            self._bar.start()
        else:
            planned = f"{self.duration_s:g} s of load, {self.total} requests planned"
            say(self.console, f"{self.mode:>9}: {planned}")
            self.elapsed(0.0)

    def elapsed(self, seconds: float) -> None:
        """The load has run ``seconds``: move the bar, or print the phase that began."""
        self.at_s = min(max(seconds, self.at_s), self.duration_s)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.at_s, status=self._status())
            return
        while self._phase + 1 < len(self.phases) and self.phases[self._phase + 1][1] <= self.at_s + 1e-9:
            self._phase += 1
            name, begin, end = self.phases[self._phase]
            which = f"phase {self._phase + 1}/{len(self.phases)} {name!r} ({begin:.1f}-{end:.1f} s)"
            say(self.console, f"{self.mode:>9} {self.at_s:5.1f} s: {which}; {self._status()}")

    def done(self, record: RequestRecord) -> None:
        """Count one finished request."""
        self.finished += 1
        self.answered += record.outcome == "ok"
        if self._bar is not None:
            self._bar.update(self._task, status=self._status())

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        else:
            say(self.console, f"{self.mode:>9} {self.at_s:5.1f} s: done; {self._status()}")

    def _status(self) -> str:
        return f"{self.finished}/{self.total} requests, {self.answered} answered"
