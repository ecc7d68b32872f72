"""Count ragguard's public names: the ``__all__`` of every public module.

A module is public when no component of its dotted path below ``ragguard`` starts with ``_``
(``ragguard.breakers`` is public, ``ragguard.breakers._window`` and ``ragguard._errors`` are not).
Each module's ``__all__`` is counted once, so a name re-exported by ``ragguard`` and by
``ragguard.breakers`` counts twice: it is public in both places. The last line also gives the
number of distinct names (issue 30's "396 public names" at 9b27c28 is that figure).

The modules are read, not imported (``__all__`` is taken from the source's literal lists and
tuples, ``+=`` included), so the count works on any checkout without its dependencies::

    python scripts/public_names.py            # src/ragguard of this checkout
    python scripts/public_names.py path/to/src/ragguard --names
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "src" / "ragguard"


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def is_public(module: str) -> bool:
    return not any(part.startswith("_") for part in module.split(".")[1:])


def _strings(node: ast.expr) -> list[str]:
    if isinstance(node, ast.List | ast.Tuple):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def all_of(path: Path) -> list[str] | None:
    """The names in the module's ``__all__``, or None when it declares none."""
    names: list[str] | None = None
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                names = _strings(node.value)
        elif isinstance(node, ast.AugAssign):
            if isinstance(node.target, ast.Name) and node.target.id == "__all__":
                names = [*(names or []), *_strings(node.value)]
    return names


def public_names(root: Path = DEFAULT_ROOT) -> dict[str, list[str]]:
    """Each public module of the package at ``root`` mapped to the names in its ``__all__``."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        module = module_name(root, path)
        if is_public(module):
            names = all_of(path)
            if names:
                found[module] = sorted(set(names))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=DEFAULT_ROOT, help="the ragguard package")
    parser.add_argument("--names", action="store_true", help="list each module's names too")
    args = parser.parse_args()
    found = public_names(args.root)
    for module, names in found.items():
        print(f"{len(names):4d}  {module}")
        if args.names:
            for name in names:
                print(f"        {name}")
    total = sum(map(len, found.values()))
    distinct = {name for names in found.values() for name in names}
    print(f"{total:4d}  total in {len(found)} public modules ({len(distinct)} distinct names)")


if __name__ == "__main__":
    main()
