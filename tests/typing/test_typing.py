"""The public API type-checks under mypy --strict, and wrong uses are caught."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _mypy(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--follow-imports=silent", str(path)],
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.timeout(300)
def test_public_api_typechecks_and_keeps_wrapped_signatures(tmp_path: Path) -> None:
    ok = _mypy(HERE / "api_usage.py")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        "from ragguard import guard\n"
        "@guard('embedding')\n"
        "async def embed(texts: list[str]) -> list[float]:\n"
        "    return [0.0]\n"
        "async def use() -> None:\n"
        "    x: str = await embed(['a'])\n"  # wrong result type
        "    await embed(3)\n"  # wrong argument type
    )
    bad = _mypy(wrong)
    assert bad.returncode != 0
    assert "wrong.py:6" in bad.stdout and "wrong.py:7" in bad.stdout, bad.stdout
