"""The demo RAG service that ``ragguard demo`` runs under chaos, unguarded and guarded.

Needs the ``demo`` extra (numpy, wordllama, faiss-cpu, bm25s, matplotlib)::

    from ragguard_tools.demo import DemoOptions, run_demo
    report = run_demo(DemoOptions(quick=True))
    report.summaries["guarded"]["success_rate"]

Names are imported on first use, so the backends' child process loads only what it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .report import DemoReport
    from .runner import DemoOptions, cli_main, run_demo, run_demo_async

__all__ = ["DemoOptions", "DemoReport", "cli_main", "run_demo", "run_demo_async"]


def __getattr__(name: str) -> Any:
    if name == "DemoReport":
        from .report import DemoReport

        return DemoReport
    if name in __all__:
        from . import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'ragguard_tools.demo' has no attribute {name!r}")
