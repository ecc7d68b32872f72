"""RedisLink's turns (at most ``max_in_flight`` commands in flight, waiters served first come first
served, a cancelled waiter never loses or leaks a turn) and Script (EVALSHA, loaded again after a
NOSCRIPT)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ragguard.distributed._link import RedisLink, Script
from ragguard.distributed._scripts import QUOTA

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


class _Client:
    def register_script(self, source: str) -> Any:
        raise AssertionError("not used")


async def test_turns_cap_commands_in_flight_and_serve_waiters_in_order() -> None:
    link = RedisLink(_Client(), "test", timeout_s=5.0, max_in_flight=2)
    gates = [asyncio.Event() for _ in range(6)]
    running: list[int] = []
    peak = 0

    async def command(i: int) -> int:
        nonlocal peak
        running.append(i)
        peak = max(peak, len(running))
        await gates[i].wait()
        running.remove(i)
        return i

    tasks = [asyncio.create_task(link.call(command, i)) for i in range(6)]
    await asyncio.sleep(0.01)
    assert running == [0, 1]  # 2..5 wait for a turn
    tasks[2].cancel()  # a waiter that gives up leaves the queue
    await asyncio.sleep(0)
    gates[0].set()
    await asyncio.sleep(0)  # 0 ends: its turn goes to the oldest waiter left (3)...
    tasks[3].cancel()  # ...which is cancelled before it runs: the turn passes on to 4
    await asyncio.sleep(0.01)
    assert running == [1, 4]
    for gate in gates:
        gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    outcomes = [r if isinstance(r, int) else "cancelled" for r in results]
    assert outcomes == [0, 1, "cancelled", "cancelled", 4, 5]
    assert peak == 2
    assert link._turns._value == 2  # every turn came back
    assert await link.call(command, 5) == 5  # and the link still takes commands at once


async def test_script_is_loaded_again_after_noscript(client: Any) -> None:
    script = Script(client, "return ARGV[1] .. KEYS[1]", 1)
    assert await script(b"k", "v") == b"vk"
    await client.script_flush()  # a restarted or flushed Redis has forgotten every script
    assert await script(b"k", "w") == b"wk"
    admit = Script(client, QUOTA, 3)
    assert admit.sha == (await client.script_load(QUOTA))  # the SHA1 redis-py would send
