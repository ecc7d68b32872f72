"""Older ragguard code importable beside the current one, for measuring both in one interleaved run:
the pre-redesign code (commit ba06c64, the monolithic ``Stage``) as ``ragguard_baseline``, main
before issue 30 (commit 9b27c28: generated chain drivers, the unslotted call record, each layer
classifying errors itself) as ``ragguard_pre30``, or any other commit (:func:`load_commit`).

The old code is never committed here: it is extracted at run time with ``git archive`` into a
temporary directory, its package directory renamed (all its internal imports are relative), and
that directory put on ``sys.path``. Without git, or without the commit in the repository (a
shallow clone), :func:`load` returns None and says why.
"""

from __future__ import annotations

import atexit
import importlib
import io
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

__all__ = ["BASELINE_COMMIT", "PRE_ISSUE_20", "PRE_ISSUE_30", "load", "load_commit"]

BASELINE_COMMIT = "ba06c64"
PRE_ISSUE_20 = "f43ce80"  # main before issue 20 (the build context, the options models, the fast paths)
PRE_ISSUE_30 = "9b27c28"  # main before issue 30 (the closed core, one outcome per attempt, plain drivers)
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
    _own_names(root / name, name)
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(name)
    finally:
        sys.path.remove(str(root))
    return module, f"{what}: commit {commit}, extracted with git archive (imported as {name})"


def _own_names(package: Path, name: str) -> None:
    """Point the module names the old code writes as strings (``"ragguard.layers.retry:RetryPolicy"``
    in a registry imported with importlib, ``"ragguard.guard"``) at the old package itself: its
    imports are relative, its strings are not."""
    quoted = re.compile(r"""(["'])ragguard\.""")
    for path in package.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        changed = quoted.sub(rf"\g<1>{name}.", text)
        if changed != text:
            path.write_text(changed, encoding="utf-8")


def load_commit(commit: str) -> tuple[ModuleType | None, str]:
    """:func:`load` for ``commit`` (a hash, or a name git resolves), imported as ``ragguard_<commit>``."""
    label = {PRE_ISSUE_30: "main before issue 30", PRE_ISSUE_20: "the code before issue 20"}.get(commit, "the code")
    name = "ragguard_" + "".join(c if c.isalnum() else "_" for c in commit)
    return load(commit, name, label)
