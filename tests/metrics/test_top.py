"""`ragguard top` as a script or a pipe sees it: real processes, a real status server.

``--once`` exits 1 with one line on stderr when the endpoint does not answer, and takes two polls
so its rates are rates (never a 0.0 that only means "one poll"); without ``--once``, off a terminal,
every frame is printed as plain lines as it comes, and SIGTERM or SIGINT end it cleanly."""

from __future__ import annotations

import io
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ragguard.chaos._redis_server import free_port
from ragguard_tools.top import Top

WORKER = Path(__file__).with_name("_status_worker.py")
TOP = [sys.executable, "-m", "ragguard_tools.cli", "top"]


@pytest.fixture
def service() -> Iterator[str]:
    """A real service in its own process whose embedding fallback serves ~40 calls a second."""
    proc = subprocess.Popen([sys.executable, str(WORKER), "40"], stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip() if proc.stdout else ""
        assert url.startswith("http://127.0.0.1:"), url
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _row(text: str, stage: str) -> list[str]:
    return next(line.split() for line in text.splitlines() if line.startswith(stage))


def test_once_exits_1_with_one_line_when_the_endpoint_refuses() -> None:
    url = f"http://127.0.0.1:{free_port()}/status"
    done = subprocess.run([*TOP, url, "--once"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and url in lines[0] and "refused" in lines[0], done.stderr


def test_once_polls_twice_so_its_rates_are_real(service: str) -> None:
    t0 = time.monotonic()
    done = subprocess.run([*TOP, service, "--once", "--interval", "0.5"], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - t0 >= 0.5, "two polls, --interval apart"
    fallbacks = _row(done.stdout, "embedding")[-2]  # stage, state, [left], fallback/s, reject/s
    # ~40 fallbacks a second (fewer on a busy machine); one poll alone would show 0.0
    assert 5.0 < float(fallbacks) < 80.0, done.stdout
    assert "next poll" not in done.stdout
    assert done.stdout.endswith("\n")


def _read_until(proc: subprocess.Popen[bytes], wanted: int, timeout_s: float) -> bytes:
    """Read proc's stdout until ``wanted`` frames (title lines) came or ``timeout_s`` passed
    (then wait the rest of ``timeout_s``, if ``wanted`` is 0)."""
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    got = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while (got.count(b"ragguard top ") < wanted or not wanted) and time.monotonic() < deadline:
            if sel.select(timeout=0.1):
                got += proc.stdout.read() or b""
    return got


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_off_a_tty_frames_print_as_they_come_and_a_signal_ends_it_cleanly(service: str, sig: int) -> None:
    proc = subprocess.Popen([*TOP, service, "--interval", "0.2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        before = _read_until(proc, 3, timeout_s=30)
        assert before.count(b"ragguard top ") >= 3, f"frames came while it ran: {before!r}"
        proc.send_signal(sig)
        rest, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    out = (before + rest).decode()
    assert proc.returncode == 0, (proc.returncode, err)
    assert b"Traceback" not in err, err
    assert out.endswith("\n") and "\x1b" not in out, "plain lines, each ended"
    frames = [f for f in out.split("ragguard top ") if f.strip()]
    first, second = _row(frames[0], "embedding"), _row(frames[1], "embedding")
    assert first[-2] == "-" and "next poll" in frames[0], "no rate before a second poll"
    assert float(second[-2]) > 0.0, frames[1]


def test_off_a_tty_an_endpoint_that_does_not_answer_is_said_once_per_reason() -> None:
    url = f"http://127.0.0.1:{free_port()}/status"
    proc = subprocess.Popen([*TOP, url, "--interval", "0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        before = _read_until(proc, 1, timeout_s=30)
        before += _read_until(proc, 0, timeout_s=1.5)  # about 15 more polls, all refused
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    text = (before + out).decode()
    assert text.count("waiting for the status endpoint: [Errno 111] Connection refused") == 1, text


def test_a_note_in_the_status_is_shown_under_the_title() -> None:
    snapshot: dict[str, Any] = {"ok": True, "open": [], "stages": {}, "note": "demo: the unguarded run"}
    out = io.StringIO()
    top = Top("http://x/status", fetcher=lambda url: snapshot)
    Console(file=out, width=80, color_system=None).print(top.frame())
    assert out.getvalue().splitlines()[1] == "demo: the unguarded run"


def test_what_the_endpoint_sends_cannot_drive_the_terminal() -> None:
    evil = "\x1b]0;owned\x07\x1b[2J"
    snapshot: dict[str, Any] = {
        "ok": False, "open": [evil], "note": f"note {evil}",
        "stages": {f"embed{evil}": {"breaker": {"name": evil, "state": evil, "retry_after_s": None},
                                    "limit": {"limit": evil, "in_flight": 1, "queued": 0}}},
        "quotas": {"tenants": {f"acme{evil}": {"in_flight": evil, "waiting": evil, "max_concurrency": 2}}},
        "links": [{"component": evil, "shared": True}],
    }  # fmt: skip
    out = io.StringIO()
    top = Top("http://x/status", fetcher=lambda url: snapshot)
    Console(file=out, width=80, force_terminal=True).print(top.frame())  # colours: its own escapes only
    text = out.getvalue()
    assert "owned" in text and "embed" in text and "acme" in text, text
    assert "\x1b]" not in text and "\x1b[2J" not in text, repr(text)
