"""The pre-redesign ragguard (commit ba06c64, the monolithic ``Stage``), importable beside the
current one as ``ragguard_baseline``, for measuring both in one interleaved run.

The old code is never committed here: it is extracted at run time with ``git archive`` into a
temporary directory, its package directory renamed (all its internal imports are relative), and
that directory put on ``sys.path``. Without git, or without the commit in the repository (a
shallow clone), :func:`load` returns None and says why.
"""

from __future__ import annotations

import atexit
import importlib
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

__all__ = ["BASELINE_COMMIT", "load"]

BASELINE_COMMIT = "ba06c64"
_REPO = Path(__file__).resolve().parent.parent


def load() -> tuple[ModuleType | None, str]:
    """``(ragguard_baseline, note)``: the old package, or None and the reason it is unavailable."""
    if "ragguard_baseline" in sys.modules:
        return sys.modules["ragguard_baseline"], f"pre-redesign code: commit {BASELINE_COMMIT}"
    git = shutil.which("git")
    if git is None:
        return None, "no baseline rows: git is not installed"
    try:
        archive = subprocess.run(
            [git, "-C", str(_REPO), "archive", BASELINE_COMMIT, "src/ragguard"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        why = getattr(exc, "stderr", b"") or b""
        return None, (
            f"no baseline rows: commit {BASELINE_COMMIT} is not available here "
            f"({why.decode(errors='replace').strip()[:120] or exc}); a shallow clone lacks it"
        )
    root = Path(tempfile.mkdtemp(prefix="ragguard-baseline-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    (root / "src" / "ragguard").rename(root / "ragguard_baseline")
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module("ragguard_baseline")
    finally:
        sys.path.remove(str(root))
    return module, f"pre-redesign code: commit {BASELINE_COMMIT}, extracted to {root}"
