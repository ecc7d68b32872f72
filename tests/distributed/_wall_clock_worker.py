"""A replica whose wall clock steps back an hour mid-run (run as a script by test_wall_clock).

Usage: python _wall_clock_worker.py PORT
``time.time`` is replaced before ragguard is imported, so every use of the wall clock in this
process (defaults bound at import included) sees the step, as after an NTP correction.
Prints one JSON line: the calls that reached the dependency after the open duration, the breaker's
retry_after_s and state then.
"""

from __future__ import annotations

import time

_real_time = time.time
_step_s = [0.0]
time.time = lambda: _real_time() + _step_s[0]

import asyncio  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

import redis.asyncio as aredis  # noqa: E402
from redis.asyncio.retry import Retry  # noqa: E402
from redis.backoff import NoBackoff  # noqa: E402

from ragguard import Guard, Policy  # noqa: E402
from ragguard.options import BreakerPolicy, StagePolicy  # noqa: E402
from ragguard.redis import RedisBackend  # noqa: E402


async def main(port: int) -> dict[str, Any]:
    client = aredis.Redis(port=port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    policy = Policy(stages={"llm": StagePolicy(breaker=BreakerPolicy(
        kind="generic", minimum_calls=2, window_size=2, half_open_permits=1, open_for_s=0.5))})
    g = Guard(policy, backend=RedisBackend(client))
    reached = 0

    async def generate() -> str:
        nonlocal reached
        reached += 1
        raise ConnectionRefusedError("llm down")

    guarded = g.guard("llm")(generate)
    breaker = g.breaker("llm")
    await breaker.start()
    for _ in range(2):
        try:
            await guarded()
        except ConnectionRefusedError:
            pass
    await breaker.refresh()
    tripped = breaker.state.value
    _step_s[0] = -3600.0  # the host's wall clock steps back an hour
    await asyncio.sleep(0.7)  # longer than open_for_s
    await breaker.refresh()
    reached = 0
    try:
        await guarded()
    except Exception as exc:  # the trial's own failure, or BreakerOpen if still open
        outcome = type(exc).__name__
    await breaker.refresh()  # the trial's result is in Redis: read the state it led to
    result = {"tripped": tripped, "reached": reached, "outcome": outcome,
              "retry_after_s": breaker.retry_after_s}
    await g.aclose()
    await client.aclose()
    return result


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(int(sys.argv[1])))))
