"""``ragguard bench``: the demo's real RAG service under stepped load, four contenders in one run.

Needs the ``demo`` extra (numpy, wordllama, faiss-cpu, bm25s, matplotlib, aiolimiter)::

    from ragguard_tools.bench import BenchOptions, run_bench
    report = run_bench(BenchOptions(quick=True))
    report.targets()

Names are imported on first use (the demo's models load only when a bench runs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._report import BenchReport
    from ._runner import BenchOptions, cli_main, run_bench, run_bench_async

__all__ = ["BenchOptions", "BenchReport", "cli_main", "run_bench", "run_bench_async"]


def __getattr__(name: str) -> Any:
    if name == "BenchReport":
        from ._report import BenchReport

        return BenchReport
    if name in __all__:
        from . import _runner

        return getattr(_runner, name)
    raise AttributeError(f"module 'ragguard_tools.bench' has no attribute {name!r}")
