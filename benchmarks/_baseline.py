"""Older ragguard code importable beside the current one, for measuring both in one interleaved run:
the pre-redesign code (commit ba06c64, the monolithic ``Stage``) as ``ragguard_baseline``, and the
code before issue 20's refactor (commit f43ce80) as ``ragguard_pre20``.

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

__all__ = ["BASELINE_COMMIT", "PRE_ISSUE_20", "load"]

BASELINE_COMMIT = "ba06c64"
PRE_ISSUE_20 = "f43ce80"  # main before issue 20 (the build context, the options models, the fast paths)
_REPO = Path(__file__).resolve().parent.parent


def load(
    commit: str = BASELINE_COMMIT, name: str = "ragguard_baseline", what: str = "pre-redesign code"
) -> tuple[ModuleType | None, str]:
    """``(package, note)``: ``commit``'s ``src/ragguard`` imported as ``name``, or None and the reason
    it is unavailable. ``what`` names the code in the note."""
    if name in sys.modules:
        return sys.modules[name], f"{what}: commit {commit}"
    git = shutil.which("git")
    if git is None:
        return None, f"no {name} rows: git is not installed"
    try:
        archive = subprocess.run(
            [git, "-C", str(_REPO), "archive", commit, "src/ragguard"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        why = getattr(exc, "stderr", b"") or b""
        return None, (
            f"no {name} rows: commit {commit} is not available here "
            f"({why.decode(errors='replace').strip()[:120] or exc}); a shallow clone lacks it"
        )
    root = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    (root / "src" / "ragguard").rename(root / name)
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(name)
    finally:
        sys.path.remove(str(root))
    return module, f"{what}: commit {commit}, extracted to {root}"
