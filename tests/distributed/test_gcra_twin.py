"""The GCRA is written once in Python (ragguard.quotas._gcra) and once in Lua (the ``GCRA`` prelude
of ragguard.redis._scripts): the two step alike, float for float, on a real redis-server; and the
quotas built on them, in one process and through Redis, admit and refuse the same requests with
the same ``retry_after_s``."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
import redis
from distributed_helpers import PATIENT_S, make_client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragguard import FakeClock, QuotaExceeded, TenantQuota
from ragguard.options._policy import burst_of
from ragguard.quotas import LocalQuotas
from ragguard.quotas._gcra import EPSILON_S, Rate
from ragguard.quotas._local import WAIT
from ragguard.redis import RedisQuotas
from ragguard.redis._scripts import GCRA

pytestmark = [pytest.mark.timeout(120)]

_tenants = itertools.count()

# Steps a bucket through ARGV: interval, tolerance, the first tat, then (op, now, n) per step: 't'
# takes n tokens if they fit now, 's' takes them whatever the wait (pacing), 'b' gives n back.
# Returns every step's tat' and wait, then the bucket's tat, as exact decimal text.
_STEPS = GCRA + r"""
local interval, tolerance, tat = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i = 4, #ARGV, 3 do
  local op, now, n = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  if op == 'b' then
    tat = gcra_back(tat, n, interval)
  else
    local after, wait = gcra(tat, now, n, interval, tolerance)
    if op == 's' or wait <= GCRA_EPSILON then tat = after end
    out[#out + 1] = string.format('%.17g %.17g', after, wait)
  end
  out[#out + 1] = string.format('%.17g', tat)
end
return table.concat(out, ' ')
"""


def _python_steps(rate: Rate, tat: float, steps: list[tuple[str, float, int]]) -> list[float]:
    out: list[float] = []
    for op, now, n in steps:
        if op == "b":
            tat = rate.give_back(tat, n)
        else:
            after, wait = rate.step(tat, now, n)
            if op == "s" or wait <= EPSILON_S:
                tat = after
            out += [after, wait]
        out.append(tat)
    return out


_step = st.tuples(
    st.sampled_from(["t", "s", "b"]),
    st.one_of(st.sampled_from([0.0, 1e-9, 0.001, 0.5, 1.0]), st.floats(0.0, 100.0)),
    st.integers(1, 5000),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rate_per_s=st.one_of(st.sampled_from([0.1, 1.0, 3.0, 7.5, 1e4]), st.floats(0.01, 1e6)),
    burst=st.one_of(st.none(), st.integers(1, 10_000)),
    start=st.floats(0.0, 1e6),
    steps=st.lists(_step, min_size=1, max_size=40),
)
def test_the_lua_gcra_steps_as_the_python_one(
    module_redis: Any, rate_per_s: float, burst: int | None, start: float, steps: list[tuple[str, float, int]]
) -> None:
    rate = Rate(rate_per_s, burst_of(rate_per_s, burst))
    timeline, now = [], start
    for op, dt, n in steps:
        now += dt
        timeline.append((op, now, n))
    args: list[Any] = [repr(rate.interval_s), repr(rate.tolerance_s), repr(start)]
    for op, at, n in timeline:
        args += [op, repr(at), n]
    client = redis.Redis(host=module_redis.host, port=module_redis.port, socket_timeout=PATIENT_S)
    try:
        lua = [float(x) for x in client.eval(_STEPS, 0, *args).split()]
    finally:
        client.close()
    assert lua == _python_steps(rate, start, timeline)


def test_take_is_the_one_token_step_that_fits() -> None:
    rate = Rate(2.0, 3)
    tat = 0.0
    admitted = []
    for now in (0.0, 0.0, 0.0, 0.0, 0.25, 0.5, 0.5):
        after = rate.take(tat, now)
        stepped, wait = rate.step(tat, now)
        assert (after is not None) == (wait <= EPSILON_S) and (after is None or after == stepped)
        admitted.append(after is not None)
        tat = tat if after is None else after
    # a burst of 3, then one token each 0.5 s
    assert admitted == [True, True, True, False, False, True, False]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rate_per_s=st.sampled_from([0.5, 1.0, 2.0, 10.0, 1000.0, 3.3]),
    burst=st.one_of(st.none(), st.integers(1, 5)),
    gaps=st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.1, 0.3, 0.5, 1.0, 2.0]), min_size=1, max_size=25),
)
def test_shared_and_local_quotas_admit_alike(
    module_redis: Any, rate_per_s: float, burst: int | None, gaps: list[float]
) -> None:
    quota = TenantQuota(rate_per_s=rate_per_s, burst=burst)
    tenant = f"twin{next(_tenants)}"
    clock = FakeClock(1000.0)

    async def run() -> tuple[list[Any], list[Any]]:
        client = make_client(module_redis.host, module_redis.port, socket_timeout=PATIENT_S)
        shared = RedisQuotas(lambda t: quota, client, clock=clock, redis_timeout_s=PATIENT_S)
        local = LocalQuotas(lambda t: quota, clock=clock)
        seen_local, seen_shared = [], []
        try:
            for gap in gaps:
                clock.advance(gap)
                seen_local.append(await _admit(local, tenant))
                seen_shared.append(await _admit(shared, tenant))
        finally:
            await shared.aclose()
            await client.aclose()
        return seen_local, seen_shared

    seen_local, seen_shared = asyncio.run(run())
    assert seen_shared == seen_local


async def _admit(quotas: Any, tenant: str) -> Any:
    """True when admitted at once, else the refusal's ``(reason, retry_after_s)``."""
    lease = quotas.admit_now(tenant)
    try:
        if lease is WAIT:
            lease = await quotas.acquire(tenant)
    except QuotaExceeded as exc:
        return exc.reason, exc.retry_after_s
    quotas.release(lease)
    return True
