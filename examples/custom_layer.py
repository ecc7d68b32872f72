"""A layer of your own: log the calls of a stage that take longer than a threshold.

    python examples/custom_layer.py

A new layer is one file (this one), one policy model (``SlowCallPolicy``) and one registry line
(``register_layer(...)`` at the bottom). The layer is a *gate*: ``enter`` runs before the layers
inside it and returns a token (here, the start time on the Guard's clock), ``exit`` runs after
them with the outcome. Placed right after ``observe`` it sees each call as its caller does,
fallbacks and retries included, and for a stream the whole stream. A stage whose policy has no
``layers: {slow_calls: ...}`` entry does not get the layer at all, so it costs those stages nothing.

The policy, in Python or in a policy file::

    stages:
      search: {layers: {slow_calls: {threshold_s: 0.5}}}

The demo below runs on a FakeClock: nothing sleeps.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

import ragguard
from ragguard.layers import Bound, Stage, register_layer
from ragguard.pipeline import Call

log = logging.getLogger("slow_calls")


class SlowCallPolicy(BaseModel):
    """``threshold_s``: a call that takes longer than this many seconds is logged (0 < s <= 3600)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    threshold_s: float = Field(gt=0, le=3600)


class SlowCallLog:
    """Logs a warning for each call of ``stage`` slower than ``threshold_s`` on ``clock``."""

    scope: ClassVar[str] = "call"  # a stream holds it from its opening to its end
    __slots__ = ("clock", "stage", "threshold_s")

    def __init__(self, stage: str, threshold_s: float, clock: Any) -> None:
        self.stage = stage
        self.threshold_s = threshold_s
        self.clock = clock

    def enter(self, call: Call) -> float:
        return float(self.clock())  # no allocation, no event: this runs on every call

    async def enter_async(self, call: Call) -> float:  # never asked: enter never returns WAIT
        return self.enter(call)

    def exit(self, call: Call, started: float, exc: BaseException | None) -> BaseException | None:
        took = self.clock() - started
        if took > self.threshold_s:
            outcome = "ok" if exc is None else type(exc).__name__
            log.warning("stage %r took %.3fs (over %.3fs): %s", self.stage, took, self.threshold_s, outcome)
        return None  # never changes the outcome


def build(stage: Stage, bound: Bound) -> SlowCallLog | None:
    options: SlowCallPolicy | None = stage.layer_policy("slow_calls")
    if options is None:
        return None  # not configured for this stage: left out of its chain
    return SlowCallLog(stage.name, options.threshold_s, stage.clock)


register_layer("slow_calls", build, policy=SlowCallPolicy, after="observe")


async def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    clock = ragguard.FakeClock()
    policy = ragguard.Policy.parse({"stages": {"search": {"layers": {"slow_calls": {"threshold_s": 0.5}}}}})
    g = ragguard.Guard(policy, clock=clock)

    @g.guard("search")
    async def search(query: str, delay_s: float) -> list[str]:
        await clock.sleep(delay_s)  # the store's latency, on the FakeClock
        return [f"hit for {query}"]

    @g.guard("rerank_v2")  # no slow_calls entry: no such layer in its chain
    async def rerank(query: str, delay_s: float) -> list[str]:
        await clock.sleep(delay_s)
        return [query]

    await search("fast", 0.1)
    await search("slow", 1.5)  # logged
    await rerank("slow", 9.0)  # not logged
    print(g.stage("search").layer_policy("slow_calls"))


if __name__ == "__main__":
    asyncio.run(main())
