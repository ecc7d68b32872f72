"""Issue 11, scenario 7: any stage name works with Redis. The name is percent-encoded into the
breaker's keys, so braces never break the hash tag (Redis Cluster: one slot per breaker) and two
names never share keys. Real redis-server, through ``Guard(redis=...)``."""

from __future__ import annotations

from typing import Any

import pytest
from distributed_helpers import PATIENT, breaker_policy
from redis.crc import key_slot

from ragguard import BreakerState, Guard, Policy
from ragguard.redis import RedisBackend
from ragguard.redis._breaker import breaker_keys

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

NAMES = ["llm{gpt-4o}", "llm%7Bgpt-4o%7D", "}{", "{", "rerank: bge {v2} / ü", "%"]


def policy_for(names: list[str]) -> Policy:
    stages = {}
    for name in names:
        stages.update(breaker_policy(name, minimum_calls=2, window_size=2).stages)
    return Policy(stages=stages)


async def test_any_stage_name_trips_its_own_shared_breaker(client: Any) -> None:
    g = Guard(policy_for(NAMES), backend=RedisBackend(client, **PATIENT))

    async def down() -> str:
        raise ConnectionRefusedError("down")

    try:
        for name in NAMES:
            guarded = g.guard(name)(down)
            for _ in range(2):
                with pytest.raises(ConnectionRefusedError):  # never ConfigError
                    await guarded()
            await g.breaker(name).refresh()
            assert g.breaker(name).state is BreakerState.OPEN, name

        seen_keys: set[str] = set()
        for name in NAMES:
            keys = breaker_keys(name)
            assert not seen_keys & set(keys)  # no two names share a key
            seen_keys.update(keys)
            assert len({key_slot(k.encode()) for k in keys}) == 1  # one hash tag, one slot
            tag = keys[0][1:keys[0].index("}")]
            assert "{" not in tag and tag == f"ragguard:breaker:{keys[0][18:keys[0].index('}')]}"
            assert await client.hget(keys[0], "state") == b"open", name
    finally:
        await g.aclose()
