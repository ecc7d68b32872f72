"""The demo is written as a user of ragguard: public names only (those in the ``__all__`` of a public
module: tests/packaging/test_public_names.py), and a guarded pipeline to copy."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import ragguard_tools.demo

DEMO = Path(ragguard_tools.demo.__file__).parent
SOURCES = sorted(DEMO.glob("*.py"))
# a dotted ragguard path with a private part, outside the demo's own package
PRIVATE_PATH = re.compile(r"\bragguard(?:\.(?!demo\b)\w+)*\._\w+")
# The demo's plumbing that reads ragguard's internals, as ragguard's own tools do (never the
# guarded pipeline, guarded.py): file -> the private modules it may import. The status server
# serves Guard.status() with the counts of its fallbacks and refusals (StatusCounts, snapshot);
# the backends parse the control RPC's fault specs as a scenario phase does (Phase); the runner
# shows a Redis URL without its password (mask_url).
INTERNALS = {
    "_status.py": ("ragguard._status",),
    "backends.py": ("ragguard.chaos._scenario",),
    "runner.py": ("ragguard.redis._link",),
}


def private_imports(path: Path) -> list[tuple[int, str]]:
    """(line, what) for every import in ``path`` of a private ragguard module or name (the demo's
    own are allowed), every relative import that leaves the demo package, and every private
    ragguard path named in the text (``importlib`` strings, ``-m`` arguments...)."""
    text = path.read_text()
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level > 1:
                found.append((node.lineno, f"from {'.' * node.level}{node.module or ''} import ..."))
                continue
            module = node.module or ""
            if node.level == 1 or not (module == "ragguard" or module.startswith("ragguard.")):
                continue
            if module.startswith("ragguard_tools.demo"):
                continue
            parts = module.split(".") + [alias.name for alias in node.names]
            if any(part.startswith("_") for part in parts):
                found.append((node.lineno, f"from {module} import {[a.name for a in node.names]}"))
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, f"import {alias.name}")
                for alias in node.names
                if alias.name.startswith("ragguard.")
                and not alias.name.startswith("ragguard_tools.demo")
                and any(part.startswith("_") for part in alias.name.split("."))
            ]
    found += [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in PRIVATE_PATH.finditer(text)]
    return sorted(set(found))


def _public(module: str, name: str) -> bool:
    """Whether ``name`` is public in the public module ``module``: in its ``__all__``, or a public
    submodule of it."""
    if name.startswith("_"):
        return False
    if name in getattr(importlib.import_module(module), "__all__", ()):
        return True
    try:
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return False
    return True


def non_public_names(path: Path) -> list[tuple[int, str]]:
    """(line, what) for every name ``path`` imports from a public ragguard module that the module
    does not export (not in its ``__all__``), and every ``ragguard.<name>`` it reads that
    ``ragguard`` does not export. Private modules are :func:`private_imports`' business."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            module = node.module
            if module.split(".")[0] != "ragguard" or any(p.startswith("_") for p in module.split(".")):
                continue
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names if not _public(module, a.name)]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "ragguard" and not _public("ragguard", node.attr):
                found.append((node.lineno, f"ragguard.{node.attr}"))
    return sorted(set(found))


def test_the_demo_package_is_found() -> None:
    assert {"guarded.py", "service.py", "runner.py"} <= {p.name for p in SOURCES}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_the_demo_imports_no_private_ragguard_module(path: Path) -> None:
    allowed = INTERNALS.get(path.name, ())
    found = private_imports(path)
    assert [(n, what) for n, what in found if what.removeprefix("from ").split(" ")[0] not in allowed] == []
    assert non_public_names(path) == []


@pytest.mark.parametrize("name", sorted(INTERNALS))
def test_each_use_of_internals_listed_is_made(name: str) -> None:
    used = {what.removeprefix("from ").split(" ")[0] for _, what in private_imports(DEMO / name)}
    assert set(INTERNALS[name]) <= used


def test_the_check_catches_private_imports(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from .._context import degraded\n"
        "from ragguard._errors import BreakerOpen\n"
        "from ragguard.grpc._status import status_for\n"
        "from ragguard import _inject\n"
        "import ragguard._clock\n"
        "x = 'ragguard.rag._cache'\n"
        "from ragguard.grpc import status_for\n"
        "from ragguard_tools.demo._wire import encode\n"
        "from . import _wire\n"
    )
    assert {line for line, _ in private_imports(bad)} == {1, 2, 3, 4, 5, 6}
    assert non_public_names(bad) == [(4, "ragguard._inject"), (7, "ragguard.grpc.status_for")]
    good = tmp_path / "good.py"
    good.write_text("import ragguard\nfrom ragguard import events, guard\n"
                    "from ragguard.grpc import TENANT_KEY\nragguard.degraded()\nragguard.monitors\n")
    assert non_public_names(good) == []
    good.write_text("import ragguard\nragguard.OutcomeKind\nfrom ragguard.breakers import live_breakers\n")
    assert non_public_names(good) == [(2, "ragguard.OutcomeKind"), (3, "ragguard.breakers.live_breakers")]


def test_the_guarded_pipeline_is_a_file_to_copy() -> None:
    source = (DEMO / "guarded.py").read_text()
    assert len(source.splitlines()) <= 200
    assert "from ragguard" in source or "import ragguard" in source
    assert "except" not in source, "fallbacks are the guard's job, not hand-written except clauses"
