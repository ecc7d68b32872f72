"""README.md's code, run as written: every ```python block that is not labelled a sketch (its first
line ``# A sketch...``) runs in a fresh interpreter and must exit 0, within a timeout, on loopback
only. A block whose first line names a file (``# ragguard.yaml``, ``# test_outage.py: ...``) is written
under that name beside the others first; a ``test_*.py`` one is run with pytest."""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_snippets import ROOT, python_blocks, run_block

README = ROOT / "README.md"
RUNNABLE, SKETCHES = python_blocks(README)


def test_the_readme_has_runnable_blocks_and_labelled_sketches() -> None:
    assert len(RUNNABLE) >= 6 and len(SKETCHES) >= 1, (len(RUNNABLE), len(SKETCHES))


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("line", "body"), RUNNABLE, ids=[f"README.md:{n}" for n, _ in RUNNABLE])
def test_a_readme_snippet_runs_as_written(line: int, body: str, tmp_path: Path) -> None:
    run_block(README, line, body, tmp_path, timeout=150)
