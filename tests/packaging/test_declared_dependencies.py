"""Every third-party package ragguard's code imports is declared in pyproject.toml, by ragguard
itself: in its dependencies or in one of the extras users install (otel, uvloop, http, demo, and the
integrations' openai, anthropic, langchain, llama-index, qdrant).

A package that only arrives through another one (sniffio came with older anyio and httpx, and with
trio in the dev extra) works on the machine that wrote the import and fails on a user's: ``pip
install 'ragguard[http]'`` once gave an ``import ragguard.asgi`` that raised ModuleNotFoundError.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
OURS = ("ragguard", "ragguard_tools")  # the two packages of the wheel
SOURCES = tuple(ROOT / "src" / name for name in OURS)
RUNTIME_EXTRAS = (  # not dev: users do not install it
    *("otel", "uvloop", "http", "demo"),
    *("openai", "anthropic", "langchain", "llama-index", "qdrant"),  # ragguard.integrations
)
# Imported only by code that runs inside the package: trio's paths run under trio, the pytest
# plugin runs inside pytest.
PRESENT_WHEN_RUN = {"trio": "the trio paths run only under trio", "pytest": "the plugin runs in pytest"}


def _dist(requirement: str) -> str:
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name is not None, requirement
    return re.sub(r"[-_.]+", "-", name[0]).lower()


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {_dist(r) for r in project["dependencies"]}
    for extra in RUNTIME_EXTRAS:
        names |= {_dist(r) for r in project["optional-dependencies"][extra] if not r.startswith("ragguard")}
    return names


def imports_outside_type_checking(tree: ast.AST) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def test_every_imported_package_is_declared() -> None:
    by_module = md.packages_distributions()
    allowed = declared()
    undeclared: dict[str, list[str]] = {}
    for path in sorted(p for src in SOURCES for p in src.rglob("*.py")):
        for top in imports_outside_type_checking(ast.parse(path.read_text(), str(path))):
            if top in sys.stdlib_module_names or top in OURS or top in PRESENT_WHEN_RUN:
                continue
            dists = {_dist(d) for d in by_module.get(top, [top])}
            if not dists & allowed:
                undeclared.setdefault(top, []).append(str(path.relative_to(ROOT)))
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"


def test_the_check_sees_an_undeclared_import() -> None:
    source = "import sniffio\nif TYPE_CHECKING:\n    import typing_extensions\nfrom grpc import aio\n"
    tree = ast.parse(source)
    assert imports_outside_type_checking(tree) == {"sniffio", "grpc"}
    assert "sniffio" not in declared() and "grpcio" in declared()
