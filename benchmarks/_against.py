"""``--against COMMIT``: the ragguard of an older commit beside the current one, in the same
interleaved run (a change must not make what it touches slower).

The commit's ``src/ragguard`` is imported as ``ragguard_against`` (see :mod:`_baseline`); a
benchmark builds its ragguard contenders once more from that package, names them
``<name> @ <commit>``, and :func:`targets` compares each pair: the current code at most
``limit`` times the older one's cost (default 1.05: no worse, within noise).
"""

from __future__ import annotations

import argparse
from types import ModuleType

import _baseline
import _bench

__all__ = ["add_argument", "load", "named", "targets"]


def add_argument(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    parser.add_argument("--against", metavar="COMMIT", default=default,
                        help="also run the ragguard contenders on this commit's code (e.g. main)"
                        + ("" if default is None else f"; {default} unless told"))  # fmt: skip


def load(commit: str | None) -> ModuleType | None:
    """The package of ``commit`` (None: no comparison), saying where it comes from."""
    if commit is None:
        return None
    package, note = _baseline.load(commit, "ragguard_against", f"commit {commit}")
    _bench.console.print(note, markup=False)
    return package


def named(name: str, commit: str) -> str:
    return f"{name} @ {commit}"


def targets(results: _bench.Results, names: list[str], commit: str, limit: float = 1.05) -> list[_bench.Target]:
    """For each contender of ``names``: its cost over the same contender at ``commit``."""
    return [
        _bench.ratio_target(results, f"{name} vs {commit} (lower is better)", name, named(name, commit), limit)
        for name in names
    ]
