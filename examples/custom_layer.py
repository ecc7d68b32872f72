"""A layer of your own: a bulkhead, at most ``max_concurrent`` calls of a stage in flight at once.

    python examples/custom_layer.py

A new layer is this one file: its options model (``BulkheadPolicy``), the layer, its builder, and
one registration call (``register_layer(...)`` at the bottom), made before or after a policy that
configures it is loaded. The layer is a *gate*: ``enter`` runs before the layers inside it (here it
takes a slot, or refuses the call with :class:`ragguard.Overloaded`), ``exit`` runs once after them
however the call ended (it gives the slot back: a failure or a cancellation too). Its state, the
slots in use, is per stage: every function guarded as the stage shares it (``stage.part``). Placed
after ``quota`` it holds its slot across the retries, and for a stream until the stream ends. A
stage whose policy has no ``layers: {bulkhead: ...}`` entry does not get the layer at all.

The policy, in Python or in a policy file::

    stages:
      search: {layers: {bulkhead: {max_concurrent: 2}}}

The demo below runs on a FakeClock: nothing sleeps.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

import ragguard
from ragguard.layers import Bound, Stage, register_layer
from ragguard.pipeline import Call


class BulkheadPolicy(BaseModel):
    """``max_concurrent``: calls of the stage in flight at once, 1 to 10,000; ``retry_after_s``:
    the wait a refused caller is told to make (seconds, >= 0)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    max_concurrent: int = Field(ge=1, le=10_000)
    retry_after_s: float = Field(default=0.1, ge=0, le=60)


class Slots:
    """The stage's slots in use (one object per stage, shared by its functions)."""

    __slots__ = ("in_use",)

    def __init__(self) -> None:
        self.in_use = 0


class Bulkhead:
    """Admits at most ``options.max_concurrent`` calls of ``stage`` at once; refuses the rest."""

    scope: ClassVar[str] = "call"  # a stream holds its slot from its opening to its end
    __slots__ = ("options", "slots", "stage")

    def __init__(self, stage: str, options: BulkheadPolicy, slots: Slots) -> None:
        self.stage = stage
        self.options = options
        self.slots = slots

    def enter(self, call: Call) -> None:
        slots = self.slots
        if slots.in_use >= self.options.max_concurrent:
            raise ragguard.Overloaded(self.stage, self.options.retry_after_s, "bulkhead")
        slots.in_use += 1  # no allocation, no event: this runs on every call

    async def enter_async(self, call: Call) -> None:  # never asked: enter never returns WAIT
        self.enter(call)

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        self.slots.in_use -= 1  # however the call ended
        return None  # never changes the outcome


def build(stage: Stage, bound: Bound) -> Bulkhead | None:
    options: BulkheadPolicy | None = stage.layer_policy("bulkhead")
    if options is None:
        return None  # not configured for this stage: left out of its chain
    return Bulkhead(stage.name, options, stage.part("bulkhead", Slots))


register_layer("bulkhead", build, policy=BulkheadPolicy, after="quota")


async def main() -> None:
    clock = ragguard.FakeClock()
    policy = ragguard.Policy.parse({"stages": {"search": {"layers": {"bulkhead": {"max_concurrent": 2}}}}})
    g = ragguard.Guard(policy, clock=clock)

    @g.guard("search")
    async def search(query: str) -> str:
        await clock.sleep(1.0)  # the store's latency, on the FakeClock
        return f"hit for {query}"

    @g.guard("search")  # another function of the stage: the same two slots
    async def suggest(query: str) -> str:
        await clock.sleep(1.0)
        return f"{query}..."

    said = await asyncio.gather(search("a"), suggest("b"), search("c"), return_exceptions=True)
    for result in said:
        print(type(result).__name__ if isinstance(result, Exception) else result)
    print(await search("d"))  # the slots were given back
    print(g.stage("search").layer_policy("bulkhead"))


if __name__ == "__main__":
    asyncio.run(main())
