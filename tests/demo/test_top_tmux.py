"""`ragguard top` in a real terminal (tmux, 80 columns) against the demo service: a breaker is seen
opening and closing again, every line fits, and the view redraws in place.

With ``RAGGUARD_TOP_PNG=docs/top.png`` set, the colour capture of a frame with an open breaker is
rendered to that PNG (rich parses the terminal's escape codes, Pillow draws the cells), which is
how the screenshot in docs/monitors.md is made."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("wordllama")
pytestmark = pytest.mark.slow

WIDTH, HEIGHT = 80, 40
ROW = re.compile(r"^(?P<stage>[a-z_]+)\s+(?P<state>closed|open|half_open|forced_open|disabled)\b")
HEADER = re.compile(r"^stage\s+state\s+left\s+fallback/s\s+reject/s$")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True, timeout=10).stdout


def _screen_until(session: str, text: str, *, within_s: float) -> str:
    """The pane's screen once it shows ``text``, or its last one after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        screen = _tmux("capture-pane", "-p", "-t", session)
        if text in screen or time.monotonic() > deadline:
            return screen
        time.sleep(0.1)


def _breakers(screen: str) -> dict[str, str]:
    """stage -> state, from the Breakers table of one captured screen."""
    out: dict[str, str] = {}
    in_table = False
    for line in screen.splitlines():
        if HEADER.match(line.rstrip()):
            in_table = True
            continue
        if in_table:
            got = ROW.match(line)
            if got is None:
                if not line.strip() or line.startswith(("Adaptive", "Tenants", "Links")):
                    break
                continue
            out[got["stage"]] = got["state"]
    return out


@pytest.mark.timeout(240)
def test_top_shows_a_breaker_of_the_demo_opening_and_closing(tmp_path: Path) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (scripts/setup dev installs it)")
    port = _free_port()
    url = f"http://127.0.0.1:{port}/status"
    session = f"ragguard-top-{uuid.uuid4().hex[:8]}"
    top = f"{sys.executable} -m ragguard_tools.cli top {url} --interval 0.25"
    _tmux("new-session", "-d", "-s", session, "-x", str(WIDTH), "-y", str(HEIGHT), top)
    frames: list[str] = []
    colour = ""
    demo: subprocess.Popen[bytes] | None = None
    try:
        # top first, on a port nobody serves yet: it says so (however long its start-up takes on a
        # loaded machine), then the demo, whose endpoint answers from its own start-up on
        before = _screen_until(session, "waiting for the status endpoint", within_s=60)
        assert "waiting for the status endpoint" in before, before
        demo = subprocess.Popen(
            [sys.executable, "-m", "ragguard_tools.cli", "demo", "--quick", "--status-port", str(port),
             "--out", str(tmp_path / "report")],
            stdout=(tmp_path / "demo.log").open("w"), stderr=subprocess.STDOUT, cwd=tmp_path,
        )  # fmt: skip
        deadline = time.monotonic() + 200
        while demo.poll() is None and time.monotonic() < deadline:
            screen = _tmux("capture-pane", "-p", "-t", session)
            frames.append(screen)
            if not colour and "open" in _breakers(screen).values():
                colour = _tmux("capture-pane", "-p", "-e", "-t", session)
            time.sleep(0.15)
        assert demo.wait(timeout=30) == 0, (tmp_path / "demo.log").read_text()[-2000:]
        # top sees the demo's end at its next poll, a quarter second on, later on a loaded machine
        final = _screen_until(session, "waiting for the status endpoint", within_s=30)
        frames.append(final)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, timeout=10)
        if demo is not None and demo.poll() is None:
            demo.kill()
            demo.wait(timeout=10)
    states = [_breakers(f) for f in frames]
    first_table = next((i for i, s in enumerate(states) if s), len(frames))
    assert any("nothing is guarded yet" in f for f in frames[:first_table]), "the unguarded run has no status"
    assert sum(1 for s in states if s) >= 10, "the guarded run was watched"
    opened_then_closed = {
        stage
        for i, s in enumerate(states)
        for stage, state in s.items()
        if state == "open" and any(later.get(stage) == "closed" for later in states[i + 1 :])
    }
    assert opened_then_closed, "no breaker was seen opening, then closing"
    for screen in [before, *frames]:
        lines = screen.splitlines()
        assert len(lines) <= HEIGHT and all(len(line) <= WIDTH for line in lines)
        # redrawn in place: one header per screen, never a scrolled-up copy of an older frame
        assert sum(1 for line in lines if line.startswith("ragguard top ")) <= 1
    assert "waiting for the status endpoint" in final, "the demo's end is seen as its endpoint going away"
    target = os.environ.get("RAGGUARD_TOP_PNG")
    if target and colour:
        render_png(colour, Path(target))


def render_png(ansi: str, path: Path, *, cols: int = WIDTH, font_size: int = 15) -> None:
    """Draw a captured terminal screen (text with SGR escape codes) as a PNG: each character in its
    cell, in its colour, on a dark background (DejaVu Sans Mono; Pillow's own font without it)."""
    from PIL import Image, ImageDraw, ImageFont
    from rich.terminal_theme import MONOKAI
    from rich.text import Text

    lines = ansi.rstrip("\n").split("\n")
    while lines and not Text.from_ansi(lines[-1]).plain.strip():
        lines.pop()
    mono = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf"
    bold = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono-Bold.ttf"
    try:
        regular_font: ImageFont.FreeTypeFont | ImageFont.ImageFont = ImageFont.truetype(mono, font_size)
        bold_font: ImageFont.FreeTypeFont | ImageFont.ImageFont = ImageFont.truetype(bold, font_size)
    except OSError:
        regular_font = bold_font = ImageFont.load_default()
    cell_w = int(regular_font.getlength("M")) if hasattr(regular_font, "getlength") else 8
    cell_h = int(font_size * 1.35)
    pad = 12
    background, foreground = MONOKAI.background_color, MONOKAI.foreground_color
    image = Image.new("RGB", (cols * cell_w + 2 * pad, len(lines) * cell_h + 2 * pad), tuple(background))
    draw = ImageDraw.Draw(image)
    for row, line in enumerate(lines):
        text = Text.from_ansi(line)
        col = 0
        for span_text, style in _segments(text):
            colour = tuple(foreground)
            if style is not None and style.color is not None:
                colour = tuple(style.color.get_truecolor(MONOKAI))
            font = bold_font if style is not None and style.bold else regular_font
            for ch in span_text:
                draw.text((pad + col * cell_w, pad + row * cell_h), ch, font=font, fill=colour)
                col += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def _segments(text: object) -> list[tuple[str, object]]:
    from rich.console import Console

    console = Console(width=WIDTH * 2, color_system="truecolor")
    return [(seg.text, seg.style) for seg in text.render(console) if seg.text]  # type: ignore[attr-defined]
