"""``Guard(backend=RedisBackend(client, quotas=..., breakers=..., tokens=...))`` tunes the shared
quotas, breakers and token accounts the Guard builds; a bad option is a ConfigError naming it."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aredis

import ragguard
from ragguard import ConfigError, Guard, Policy
from ragguard.redis import RedisBackend


def _client() -> aredis.Redis:
    return aredis.Redis(host="127.0.0.1", port=1)  # never connected: building needs no server


def test_backend_options_reach_the_shared_quotas_and_breakers() -> None:
    client = _client()
    clock = ragguard.FakeClock()
    g = Guard(
        Policy(),
        backend=RedisBackend(client, quotas={"lease_s": 3.0}, breakers={"staleness_s": 2.0}),
        clock=clock,
    )
    assert g.quotas.lease_s == 3.0
    assert g.quotas.clock is clock  # a test clock drives the shared quotas; else Redis server time
    shared = g.breaker("vector_store")
    assert shared.staleness_s == 2.0
    assert shared.clock is clock
    assert Guard(Policy(), backend=RedisBackend(client)).quotas.clock is None  # production: Redis server time


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"quotas": 3}, "quotas"),
        ({"quotas": {"no_such_option": 1}}, "quotas.no_such_option"),
        ({"breakers": {"no_such_option": 1}}, "breakers.no_such_option"),
        ({"tokens": {"no_such_option": 1}}, "tokens.no_such_option"),
    ],
)
def test_bad_backend_options_are_config_errors_naming_the_option(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as bad:
        RedisBackend(_client(), **options)
    assert bad.value.field == field
    assert field.split(".")[-1] in str(bad.value)


def test_a_bad_value_is_a_config_error_when_the_part_is_built() -> None:
    with pytest.raises(ConfigError, match="lease_s"):
        Guard(Policy(), backend=RedisBackend(_client(), quotas={"lease_s": -1.0}))
    g = Guard(Policy(), backend=RedisBackend(_client(), breakers={"staleness_s": -1.0}))
    with pytest.raises(ConfigError, match="staleness_s"):
        g.stage("vector_store")


def test_the_backend_and_its_client_are_checked() -> None:
    with pytest.raises(ConfigError) as bad:
        RedisBackend("redis://127.0.0.1:6379")
    assert bad.value.field == "client"
    with pytest.raises(ConfigError, match="backend"):
        Guard(backend="redis://127.0.0.1:6379")  # type: ignore[arg-type]
