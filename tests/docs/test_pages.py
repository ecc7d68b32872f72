"""The docs pages' code (docs/*.md), run as written like README.md's: every ```python block that is
not labelled a sketch (its first line ``# A sketch: ...`` saying what it leaves out) runs in a fresh
interpreter, in a temporary directory, and must exit 0 within 30 s, on loopback only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from doc_snippets import FENCE, ROOT, first_line, python_blocks, run_block

PAGES = sorted((ROOT / "docs").glob("*.md"))
RUNNABLE = [(page, n, body) for page in PAGES for n, body in python_blocks(page)[0]]
SKETCHES = [(page, n, body) for page in PAGES for n, body in python_blocks(page)[1]]


def test_every_python_block_of_the_pages_is_run_or_labelled_a_sketch() -> None:
    assert len(RUNNABLE) >= 10 and len(SKETCHES) >= 1, (len(RUNNABLE), len(SKETCHES))
    for page in PAGES:  # a block fenced as py, python3 or pycon would escape both lists
        text = page.read_text(encoding="utf-8")
        langs = {m["lang"] for m in FENCE.finditer(text)}
        assert not langs & {"py", "python3", "pycon", "ipython"}, (page.name, langs)
        # the parser saw every opening fence: a block it missed would be run by nobody
        opened = len(re.findall(r"^```python\s*$", text, re.M))
        assert opened == len([b for part in python_blocks(page) for b in part]), page.name
    for page, n, body in SKETCHES:  # a label says what the sketch leaves out
        why = first_line(body).split(":", 1)
        assert len(why) == 2 and why[1].strip(), f"docs/{page.name}:{n}: {first_line(body)!r}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("page", "line", "body"), RUNNABLE,
                         ids=[f"docs/{page.name}:{n}" for page, n, _ in RUNNABLE])  # fmt: skip
def test_a_docs_snippet_runs_as_written(page: Path, line: int, body: str, tmp_path: Path) -> None:
    run_block(page, line, body, tmp_path, timeout=30)
