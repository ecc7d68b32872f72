"""The house's layout: a core that imports no wing and no tool, wings that import the core, tools apart.

- the core: everything under ``src/ragguard`` but the package's face (``ragguard/__init__.py``) and
  the wings; it imports no wing, no tool and not the face, at any depth, counting every import (at
  module level, inside a function, under ``TYPE_CHECKING``: a reader follows each);
- the wings (:data:`WINGS`) import the core and register into it; ``ragguard`` (core or wing)
  never imports ``ragguard_tools``;
- no circle of imports crosses a folder;
- ``import ragguard`` and a guarded call and stream load no tool and no wing but the RAG presets,
  which the face imports so that ``@guard("embedding")`` finds its preset.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
CORE_PACKAGE = "ragguard"
TOOLS_PACKAGE = "ragguard_tools"
WINGS = frozenset(
    {"rag", "redis", "asgi", "grpc", "buffers", "httpx", "integrations", "chaos", "metrics", "monitors"}
)
"""The folders (or modules) of ragguard that are wings: each imports the core, never the reverse."""


def module_name(path: Path, root: Path) -> tuple[str, bool]:
    """``path``'s dotted module name under ``root`` (the folder holding the packages), and whether
    it is a package's ``__init__``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def imported(source: str, module: str, is_package: bool) -> set[str]:
    """Every name ``source`` (the text of ``module``) imports, wherever the statement stands,
    relative imports resolved: ``import a.b`` gives ``a.b``, ``from a import b`` gives ``a.b`` (a
    module ``b`` of ``a``, or the name ``b`` that ``a`` defines)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports directly. Importing ``a.b.c`` runs the
    ``__init__`` of ``a.b`` too (not of the top package, which every module sits in)."""
    modules: dict[str, tuple[Path, bool]] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            name, is_package = module_name(path, root)
            modules[name] = (path, is_package)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        edges: set[str] = set()
        for target in imported(path.read_text(encoding="utf-8"), name, is_package):
            while target and target not in modules:
                target = target.rpartition(".")[0]  # a name a module defines: that module
            if not target or target == name:
                continue
            edges.add(target)
            parent = target.rpartition(".")[0]
            while parent.count(".") >= 1:
                edges.add(parent)
                parent = parent.rpartition(".")[0]
        graph[name] = edges
    return graph


def area(module: str) -> str:
    """``tool``, ``face``, ``wing`` or ``core``."""
    parts = module.split(".")
    if parts[0] == TOOLS_PACKAGE:
        return "tool"
    if len(parts) == 1:
        return "face"
    return "wing" if parts[1] in WINGS else "core"


def reached(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module ``start`` reaches through imports -> the module it was first reached from."""
    via: dict[str, str] = {}
    todo = [start]
    while todo:
        at = todo.pop()
        for nxt in graph.get(at, ()):
            if nxt not in via and nxt != start:
                via[nxt] = at
                todo.append(nxt)
    return via


def path_to(via: dict[str, str], start: str, end: str) -> str:
    chain = [end]
    while chain[-1] != start:
        chain.append(via[chain[-1]])
    return " -> ".join(reversed(chain))


def escapes(graph: dict[str, set[str]]) -> list[str]:
    """Each core module that reaches a wing, a tool or the face, with the chain of imports; each
    module of ragguard that reaches a tool."""
    out: list[str] = []
    for module in sorted(graph):
        kind = area(module)
        if kind == "tool":
            continue
        via = reached(graph, module)
        for target in sorted(via):
            bad = area(target) == "tool" or (kind == "core" and area(target) in ("wing", "face"))
            if bad:
                out.append(path_to(via, module, target))
                break
    return out


def folder(module: str) -> str:
    parts = module.split(".")
    return parts[0] if len(parts) == 1 else ".".join(parts[:2])


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` of two modules or more (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def circles_across_folders(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of ``graph`` spanning two folders."""
    return [c for c in circles(graph) if len({folder(m) for m in c}) > 1]


GRAPH = import_graph(SRC, (CORE_PACKAGE, TOOLS_PACKAGE))


def test_the_areas_are_what_the_layout_says() -> None:
    assert area("ragguard") == "face"
    assert area("ragguard._guard") == area("ragguard.layers._retry") == area("ragguard.options") == "core"
    assert area("ragguard.rag._presets") == area("ragguard.redis") == area("ragguard.metrics") == "wing"
    assert area("ragguard_tools.cli") == "tool"
    present = {m.split(".")[1] for m in GRAPH if m.count(".") >= 1 and m.startswith("ragguard.")}
    assert present >= WINGS  # every wing named exists (a renamed wing would slip out of the check)
    assert {"ragguard._guard", "ragguard.options", "ragguard.pipeline", "ragguard_tools.cli"} <= set(GRAPH)


def test_the_core_imports_no_wing_no_tool_and_not_the_face() -> None:
    assert escapes(GRAPH) == []


def test_no_circle_of_imports_crosses_a_folder() -> None:
    assert circles_across_folders(GRAPH) == []


def test_no_circle_of_imports_between_modules_inside_a_folder() -> None:
    # Those through a package's __init__ (it imports its modules; importing one runs it) are the
    # package's own. The layers' files annotate with ragguard.layers._shapes, so the stages' runtime
    # (ragguard.layers._stage), which imports them, is imported by none of them.
    packages = {module.rpartition(".")[0] for module in GRAPH}
    modules = {module: edges - packages for module, edges in GRAPH.items() if module not in packages}
    assert circles(modules) == []


def test_every_import_counts_and_the_checks_see_an_escape() -> None:
    source = textwrap.dedent(
        """
        from typing import TYPE_CHECKING
        from . import _errors
        from ..redis import RedisBackend
        if TYPE_CHECKING:
            from ..grpc import TENANT_KEY
        def late():
            from ragguard_tools import cli
            import ragguard.metrics
        """
    )
    names = imported(source, "ragguard.layers._retry", is_package=False)
    assert names == {"typing.TYPE_CHECKING", "ragguard.layers._errors", "ragguard.redis.RedisBackend",
                     "ragguard.grpc.TENANT_KEY", "ragguard_tools.cli", "ragguard.metrics"}
    graph = {
        "ragguard.guard": {"ragguard.layers"},
        "ragguard.layers": {"ragguard.options", "ragguard.status"},
        "ragguard.status": {"ragguard.rag"},  # a core module reaching a wing, two imports down
        "ragguard.options": set(),
        "ragguard.rag": {"ragguard.guard"},
    }
    assert escapes(graph)[0] == "ragguard.guard -> ragguard.layers -> ragguard.status -> ragguard.rag"
    assert circles_across_folders(graph) == [
        ["ragguard.guard", "ragguard.layers", "ragguard.rag", "ragguard.status"]
    ]
    graph["ragguard.layers._stage"] = {"ragguard.layers._retry"}  # a circle inside one folder
    graph["ragguard.layers._retry"] = {"ragguard.layers._stage"}
    assert circles_across_folders(graph) == [
        ["ragguard.guard", "ragguard.layers", "ragguard.rag", "ragguard.status"]
    ]
    assert ["ragguard.layers._retry", "ragguard.layers._stage"] in circles(graph)


LOADED = """
import asyncio, sys
import ragguard

@ragguard.guard("embedding")
async def embed(texts):
    return [[0.0, 1.0] for _ in texts]

@ragguard.guard("generation")
async def answer(question):
    yield "an"
    yield "answer"

async def main():
    assert await embed(["a question"]) == [[0.0, 1.0]]
    assert [item async for item in answer("a question")] == ["an", "answer"]

asyncio.run(main())
assert "embedding" in ragguard.layers._presets.PRESETS and "generation" in ragguard.layers._presets.PRESETS
print("\\n".join(sorted(m for m in sys.modules if m.split(".")[0] in ("ragguard", "ragguard_tools"))))
"""


@pytest.mark.timeout(60)
def test_import_and_a_guarded_call_and_stream_load_no_tool_and_no_wing_but_the_presets() -> None:
    done = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert "ragguard._guard" in loaded and "ragguard.rag._presets" in loaded
    tools = [m for m in loaded if area(m) == "tool"]
    wings = [m for m in loaded if area(m) == "wing" and m.split(".")[1] != "rag"]
    assert tools == [] and wings == [], (tools, wings)
