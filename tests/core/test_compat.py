"""ragguard._compat: each private asyncio name matches its public counterpart on the running
Python, and no other module of ragguard names a private asyncio attribute."""

from __future__ import annotations

import ast
import asyncio
import sys
from pathlib import Path

import pytest

import ragguard
from ragguard import _compat

SOURCE = Path(ragguard.__file__).parent


def test_py311_names_the_pythons_whose_wait_for_can_lose_a_cancellation() -> None:
    assert _compat.PY311 is (sys.version_info < (3, 12))


def test_running_loop_is_get_running_loop_or_none() -> None:
    assert _compat.running_loop() is None  # no loop here; the public call raises instead
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()

    async def inside() -> None:
        assert _compat.running_loop() is asyncio.get_running_loop()

    asyncio.run(inside())


def test_running_loop_is_none_under_trio() -> None:
    trio = pytest.importorskip("trio")

    async def inside() -> None:
        assert _compat.running_loop() is None

    trio.run(inside)


def test_current_task_is_asyncios_current_task() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert _compat.current_task(loop) is asyncio.current_task(loop)
        assert _compat.current_task(loop) is asyncio.current_task()
        child = asyncio.ensure_future(asyncio.sleep(0, "child"))
        others = await asyncio.gather(_task_seen(), _task_seen())
        assert others[0] is not others[1]
        await child
        seen: list[object] = []
        loop.call_soon(lambda: seen.append(_compat.current_task(loop)))  # a callback: no task
        await asyncio.sleep(0)
        assert seen == [None] and asyncio.current_task(loop) is not None

    asyncio.run(main())


async def _task_seen() -> object:
    loop = asyncio.get_running_loop()
    task = _compat.current_task(loop)
    assert task is asyncio.current_task()
    return task


def _private_asyncio_uses(path: Path) -> list[str]:
    """Where ``path`` names a private attribute of asyncio (``asyncio._x``, ``asyncio.tasks._x``,
    ``from asyncio.tasks import _x``, ``import _asyncio``), as ``line: name``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    aliases: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "_asyncio" or alias.name.startswith("asyncio."):
                    if any(part.startswith("_") for part in alias.name.split(".")):
                        found.append(f"{node.lineno}: import {alias.name}")
                if alias.name == "asyncio" or alias.name.startswith("asyncio."):
                    aliases.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            root = node.module.split(".")[0]
            if root in ("asyncio", "_asyncio"):
                for alias in node.names:
                    private = alias.name.startswith("_") or root == "_asyncio"
                    if private or any(p.startswith("_") for p in node.module.split(".")):
                        found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                    aliases.add(alias.asname or alias.name)  # a submodule of asyncio
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts: list[str] = []
            inner: ast.expr = node
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in aliases:
                private = [p for p in parts if p.startswith("_") and not p.startswith("__")]
                if private:
                    found.append(f"{node.lineno}: {inner.id}.{'.'.join(reversed(parts))}")
    return sorted(set(found))


def test_the_detector_finds_what_it_looks_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import asyncio\nimport asyncio as aio\nfrom asyncio import tasks\n"
        "from asyncio.tasks import _enter_task\n"
        "a = asyncio._get_running_loop\nb = aio.tasks._current_tasks\nc = tasks._register_task\n"
        "d = asyncio.get_running_loop\ne = asyncio.Task.__name__\n"
    )
    uses = _private_asyncio_uses(sample)
    assert [u.split(": ")[0] for u in uses] == ["4", "5", "6", "7"]


def test_no_module_but_compat_names_a_private_asyncio_attribute() -> None:
    offenders = {
        str(path.relative_to(SOURCE)): uses
        for path in sorted(SOURCE.rglob("*.py"))
        if path.name != "_compat.py" and (uses := _private_asyncio_uses(path))
    }
    assert offenders == {}
