"""`ragguard top` on `ragguard demo --status-port` before the guarded run: what its frame claims."""

from __future__ import annotations

import io

from rich.console import Console

from ragguard_tools.demo._status import DemoStatus
from ragguard_tools.top import Top


def test_before_the_guarded_run_the_frame_says_nothing_is_guarded_yet_not_that_nothing_is_counted() -> None:
    demo = DemoStatus(0)  # its view alone: nothing bound
    top = Top("http://x/status", fetcher=lambda url: demo.view())
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(top.frame())
    frame = " ".join(out.getvalue().split())
    assert "nothing is guarded yet" in frame
    assert "does not count" not in frame  # the guarded run's status counts fallbacks and sheds
