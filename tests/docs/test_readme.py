"""README.md's code, run as written: every ```python block that is not labelled a sketch (its first
line ``# A sketch...``) runs in a fresh interpreter and must exit 0, within a timeout, on loopback
only. A block whose first line names a file (``# ragguard.yaml``, ``# test_outage.py: ...``) is written
under that name beside the others first; a ``test_*.py`` one is run with pytest."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```\s*$", re.M | re.S)
NAMED = re.compile(r"#\s*(?P<name>[\w.-]+\.(?:py|yaml|yml|toml|json))\b")
SKETCH = re.compile(r"#\s*a sketch\b", re.I)


def _blocks() -> list[tuple[int, str, str]]:
    """(line number, language, body) of every fenced block of README.md."""
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m["lang"], m["body"]) for m in FENCE.finditer(text)]


def _first_line(body: str) -> str:
    return body.split("\n", 1)[0].strip()


BLOCKS = _blocks()
RUNNABLE = [(n, body) for n, lang, body in BLOCKS if lang == "python" and not SKETCH.match(_first_line(body))]


def test_the_readme_has_runnable_blocks_and_labelled_sketches() -> None:
    python = [body for _, lang, body in BLOCKS if lang == "python"]
    sketches = [body for body in python if SKETCH.match(_first_line(body))]
    assert len(RUNNABLE) >= 6 and len(sketches) >= 1, (len(RUNNABLE), len(sketches))
    assert len(RUNNABLE) + len(sketches) == len(python)


def _environment() -> dict[str, str]:
    """This interpreter's environment without the outer test run's settings or a RAGGUARD_* policy
    (Policy.from_env reads those); where redis-server is (RAGGUARD_REDIS_SERVER) stays."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("RAGGUARD_", "PYTEST_")) or k == "RAGGUARD_REDIS_SERVER"}  # fmt: skip


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("line", "body"), RUNNABLE, ids=[f"README.md:{n}" for n, _ in RUNNABLE])
def test_a_readme_snippet_runs_as_written(line: int, body: str, tmp_path: Path) -> None:
    for _, _, other in BLOCKS:  # the files the snippets read, e.g. ragguard.yaml
        named = NAMED.fullmatch(_first_line(other).split(":", 1)[0].strip())
        if named is not None and other is not body:
            (tmp_path / named["name"]).write_text(other, encoding="utf-8")
    named = NAMED.fullmatch(_first_line(body).split(":", 1)[0].strip())
    name = named["name"] if named is not None else f"snippet_{line}.py"
    (tmp_path / name).write_text(body, encoding="utf-8")
    command = [sys.executable, name]
    if name.startswith("test_"):
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name]
    done = subprocess.run(command, cwd=tmp_path, env=_environment(), capture_output=True, text=True,
                          timeout=150)  # fmt: skip
    assert done.returncode == 0, f"README.md:{line} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
