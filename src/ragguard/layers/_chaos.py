"""Chaos injection: the faults of :mod:`ragguard.chaos` reach the innermost call of a stage.

A wrapper, innermost in the chain, so an injected latency is cut by the attempt timeout and an
injected error is counted by the breaker and retried like a real one. In the chain only while a
chaos injector is installed, for this Guard (``Guard(chaos=...)``, ``chaos.install(guard)``) or for
the whole process (``chaos.install()``); a Guard's own injector wins. For a stream, the faults hit
its opening, up to the first item (the time to first item), and faults that rewrite a result are
not applied.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .._context import current_tenant
from .._inject import Injector
from ..pipeline import Call

if TYPE_CHECKING:
    from ._shapes import Bound, Stage

__all__ = ["ChaosLayer", "build"]


class ChaosLayer:
    """Runs each attempt of stage ``stage`` through ``injector``."""

    __slots__ = ("injector",)

    def __init__(self, injector: Injector) -> None:
        self.injector = injector

    async def around(self, call: Call, proceed: Callable[[], Awaitable[Any]]) -> Any:
        if call.stream:
            return await self.injector(call.stage, current_tenant(), proceed, stream=True)
        return await self.injector(call.stage, current_tenant(), proceed)


def build(stage: Stage, bound: Bound) -> ChaosLayer | None:
    injector = stage.context.injector
    return None if injector is None else ChaosLayer(injector)
