"""The parser and runner the docs tests share: the fenced blocks of a Markdown page, which ``python``
ones are labelled sketches (first line ``# A sketch...``), and running one as written in a fresh
interpreter, in a temporary directory, within a timeout. A block whose first line names a file
(``# ragguard.yaml``, ``# test_outage.py: ...``) is written under that name beside the others first;
a ``test_*.py`` one is run with pytest."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```\s*$", re.M | re.S)
NAMED = re.compile(r"#\s*(?P<name>[\w.-]+\.(?:py|yaml|yml|toml|json))\b")
SKETCH = re.compile(r"#\s*a sketch\b", re.I)


def blocks(page: Path) -> list[tuple[int, str, str]]:
    """(line number, language, body) of every fenced block of a Markdown page."""
    text = page.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m["lang"], m["body"]) for m in FENCE.finditer(text)]


def first_line(body: str) -> str:
    return body.split("\n", 1)[0].strip()


def is_sketch(body: str) -> bool:
    return SKETCH.match(first_line(body)) is not None


def python_blocks(page: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """The page's ``python`` blocks as (line, body): those to run, and those labelled sketches."""
    python = [(n, body) for n, lang, body in blocks(page) if lang == "python"]
    return [b for b in python if not is_sketch(b[1])], [b for b in python if is_sketch(b[1])]


def _environment() -> dict[str, str]:
    """This interpreter's environment without the outer test run's settings or a RAGGUARD_* policy
    (Policy.from_env reads those); where redis-server is (RAGGUARD_REDIS_SERVER) stays."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("RAGGUARD_", "PYTEST_")) or k == "RAGGUARD_REDIS_SERVER"}  # fmt: skip


def _named(body: str) -> str | None:
    named = NAMED.fullmatch(first_line(body).split(":", 1)[0].strip())
    return named["name"] if named is not None else None


def run_block(page: Path, line: int, body: str, tmp_path: Path, timeout: float) -> None:
    """Run one block of ``page`` as written (the page's named blocks written beside it first) and
    assert that it exits 0 within ``timeout`` seconds."""
    for _, _, other in blocks(page):  # the files the snippets read, e.g. ragguard.yaml
        name = _named(other)
        if name is not None and other != body:
            (tmp_path / name).write_text(other, encoding="utf-8")
    name = _named(body) or f"snippet_{line}.py"
    (tmp_path / name).write_text(body, encoding="utf-8")
    command = [sys.executable, name]
    if name.startswith("test_"):
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name]
    where = f"{page.relative_to(ROOT).as_posix()}:{line}"
    try:
        done = subprocess.run(command, cwd=tmp_path, env=_environment(), capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{where} ran longer than {timeout} s:\n{e.stdout!r}\n{e.stderr!r}") from None
    assert done.returncode == 0, f"{where} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
