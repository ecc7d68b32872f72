"""What a layer may write on a :class:`ragguard.pipeline.Call` is declared (``Call.WRITERS``), and
the package's code writes nothing else: a layer that tells another something through the call
record says so in the contract first."""

from __future__ import annotations

import ast
from pathlib import Path

import ragguard
from ragguard.pipeline import Call

SRC = Path(ragguard.__file__).parent
RECORDS = {"call", "twin"}  # the names the package gives a Call record
FIELDS = {"stage", "fn", "stream", *Call.WRITERS}


def _record_subclass_bodies(tree: ast.AST) -> set[int]:
    """The ids of the nodes inside the methods of classes derived from ``Call`` (there ``self`` is
    a record), its constructor excepted (which makes the record, as ``Call.__init__`` does)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        if any(isinstance(b, ast.Name) and b.id == "Call" for b in node.bases):
            for method in node.body:
                if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method.name != "__init__":
                    inside.update(id(n) for n in ast.walk(method))
    return inside


def _writes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, field) for every ``call.field = ...`` / ``call.field += ...`` in ``tree`` (and
    ``self.field`` of a Call field in a class derived from Call)."""
    out: list[tuple[int, str]] = []
    in_record = _record_subclass_bodies(tree)
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
            elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                record = t.value.id in RECORDS or (t.value.id == "self" and id(t) in in_record)
                if record and (t.value.id != "self" or t.attr in FIELDS):
                    out.append((t.lineno, t.attr))
    return out


def _violations(module: str, source: str) -> list[str]:
    bad = []
    for line, field in _writes(ast.parse(source)):
        if module not in Call.WRITERS.get(field, frozenset()):
            bad.append(f"{module}:{line} writes call.{field}")
    return bad


def test_the_checker_sees_an_undeclared_write() -> None:
    source = "def enter(call):\n    call.started = 1.0\n    call.args, call.note = (), 'x'\n"
    assert sorted(_violations("ragguard.layers._quota", source)) == [
        "ragguard.layers._quota:2 writes call.started",
        "ragguard.layers._quota:3 writes call.args",
        "ragguard.layers._quota:3 writes call.note",
    ]
    assert _violations("ragguard.layers._breaker", "def f(call):\n    call.started = 0.0\n") == []


def test_every_write_of_a_call_field_in_the_package_is_declared() -> None:
    bad: list[str] = []
    seen: set[str] = set()
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        module = ".".join(parts)
        source = path.read_text(encoding="utf-8")
        bad += _violations(module, source)
        if _writes(ast.parse(source)):
            seen.add(module)
    assert bad == []
    # every declared writer really writes (a stale declaration is a wrong contract too)
    declared = {m for writers in Call.WRITERS.values() for m in writers}
    assert declared <= seen, sorted(declared - seen)


def test_the_declared_fields_are_the_calls_own() -> None:
    record = Call("s", print, (), {})
    for field in Call.WRITERS:
        assert hasattr(record, field), field
    assert {"stage", "fn", "stream"}.isdisjoint(Call.WRITERS)
