"""``Guard(redis=..., redis_options=...)`` tunes the shared quotas and breakers it builds."""

from __future__ import annotations

import pytest
import redis.asyncio as aredis

import ragguard
from ragguard import ConfigError, Guard, Policy


def test_redis_options_reach_the_shared_quotas_and_breakers() -> None:
    client = aredis.Redis(host="127.0.0.1", port=1)  # never connected: building needs no server
    clock = ragguard.FakeClock()
    g = Guard(
        Policy(),
        redis=client,
        clock=clock,
        redis_options={"quotas": {"lease_s": 3.0}, "breakers": {"staleness_s": 2.0}},
    )
    assert g.quotas.lease_s == 3.0
    assert g.quotas.clock is clock  # a test clock drives the shared quotas; else Redis server time
    shared = g.breaker("vector_store")
    assert shared.staleness_s == 2.0
    assert shared.clock is clock
    assert Guard(Policy(), redis=client).quotas.clock is None  # production: Redis server time


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"quota": {}}, "redis_options"),
        ({"quotas": 3}, "redis_options"),
        ({"quotas": {"no_such_option": 1}}, "redis_options['quotas']"),
    ],
)
def test_bad_redis_options_are_config_errors(options: dict, words: str) -> None:
    client = aredis.Redis(host="127.0.0.1", port=1)
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        Guard(Policy(), redis=client, redis_options=options)


def test_bad_breaker_options_are_config_errors_when_the_stage_is_built() -> None:
    g = Guard(Policy(), redis=aredis.Redis(host="127.0.0.1", port=1),
              redis_options={"breakers": {"no_such_option": 1}})
    with pytest.raises(ConfigError, match=r"redis_options\['breakers'\]"):
        g.stage("vector_store")
