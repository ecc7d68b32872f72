"""SharedCircuitBreaker against a real redis-server: several replicas (instances) share one state."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest
from distributed_helpers import BREAKER_PATIENT_S, PATIENT

import ragguard
from ragguard import (
    BreakerOpen,
    BreakerPolicy,
    BreakerState,
    CircuitBreaker,
    ConfigError,
    FakeClock,
    Guard,
    Policy,
    RetryPolicy,
    StagePolicy,
)
from ragguard.redis import RedisBackend, SharedCircuitBreaker
from ragguard.redis._breaker import breaker_keys

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


def replica(client: Any, clock: Any, name: str = "search", **options: Any) -> SharedCircuitBreaker:
    shared = {k: options.pop(k) for k in list(options) if k in {"trial_lease_s", "staleness_s",
                                                                  "flush_interval_s", "batch_size",
                                                                  "redis_timeout_s"}}
    shared.setdefault("redis_timeout_s", BREAKER_PATIENT_S)  # no test here is about a slow Redis
    options.setdefault("minimum_calls", 4)
    options.setdefault("window_size", 4)
    options.setdefault("half_open_permits", 2)
    options.setdefault("open_for_s", 5.0)
    return SharedCircuitBreaker(CircuitBreaker(name, **options), client, clock=clock, **shared)


def fail(b: SharedCircuitBreaker, n: int) -> None:
    for _ in range(n):
        b.on_result(b.acquire(), 0.01, ConnectionRefusedError("down"))


def succeed(b: SharedCircuitBreaker, n: int) -> None:
    for _ in range(n):
        b.on_result(b.acquire(), 0.01, None)


async def test_a_trip_on_one_replica_opens_every_replica(client: Any, fake_clock: FakeClock) -> None:
    a = await replica(client, fake_clock).start()
    b = await replica(client, fake_clock).start()
    try:
        assert a.shared and b.shared and a.state is CLOSED
        succeed(a, 2)
        fail(b, 2)  # 2 of 4 calls failed across the replicas: 50% >= 50%
        await a.refresh()
        assert a.state is CLOSED  # a's outcomes alone: 0 of 2 failed, under minimum_calls
        await b.refresh()
        assert b.state is OPEN
        await a.refresh()
        assert a.state is OPEN
        fake_clock.advance(1.0)
        with pytest.raises(BreakerOpen) as info:
            a.acquire()
        assert info.value.retry_after_s == pytest.approx(4.0)
    finally:
        await a.aclose()
        await b.aclose()


async def test_replicas_see_a_trip_within_the_staleness_bound(client: Any) -> None:
    a = await replica(client, time.time, staleness_s=1.0).start()
    b = await replica(client, time.time, staleness_s=1.0).start()
    try:
        fail(a, 4)
        await a.refresh()
        tripped = time.monotonic()
        assert a.state is OPEN
        while b.state is not OPEN and time.monotonic() - tripped < 3.0:
            await asyncio.sleep(0.01)
        assert b.state is OPEN
        assert time.monotonic() - tripped <= 1.0
    finally:
        await a.aclose()
        await b.aclose()


async def test_outcomes_are_batched_not_sent_per_call(client: Any, fake_clock: FakeClock) -> None:
    a = await replica(client, fake_clock, minimum_calls=100, window_size=100).start()
    try:
        succeed(a, 30)
        state_key, window_key, _ = a.keys
        assert await client.strlen(window_key) == 0  # nothing sent yet: the happy path did no I/O
        await a.refresh()
        assert await client.strlen(window_key) == 30
        assert int(await client.hget(state_key, "calls")) == 30
    finally:
        await a.aclose()


async def test_a_full_batch_is_sent_at_once_in_order(client: Any, fake_clock: FakeClock) -> None:
    a = await replica(client, fake_clock, minimum_calls=100, window_size=100, batch_size=5,
                      flush_interval_s=5.0, staleness_s=6.0).start()
    try:
        _, window_key, _ = a.keys
        succeed(a, 2)
        fail(a, 1)
        a.on_result(a.acquire(), 120.0, None)  # slow success (the default slow_call_duration_s is 60)
        await asyncio.sleep(0.05)
        assert await client.strlen(window_key) == 0  # 4 of 5: the batch waits for the interval
        succeed(a, 1)  # the fifth outcome fills the batch: sent now, not after 5 s
        for _ in range(100):
            if await client.strlen(window_key) == 5:
                break
            await asyncio.sleep(0.01)
        assert await client.get(window_key) == bytes([0, 0, 1, 2, 0])  # the codes, in call order
    finally:
        await a.aclose()


async def test_a_joining_replica_writes_nothing(client: Any, fake_clock: FakeClock) -> None:
    a = await replica(client, fake_clock).start()
    assert await client.keys("*") == []  # a fresh breaker on an empty Redis writes nothing either
    fail(a, 4)
    await a.refresh()
    before = {k: await client.hgetall(k) for k in (a.keys[0],)}
    window_before = await client.get(a.keys[1])
    ttl_before = await client.pttl(a.keys[0])
    joined = await replica(client, fake_clock).start()
    try:
        await joined.refresh()
        assert joined.state is OPEN
        assert {k: await client.hgetall(k) for k in (a.keys[0],)} == before
        assert await client.get(a.keys[1]) == window_before
        assert await client.pttl(a.keys[0]) <= ttl_before  # not refreshed: nothing was written
    finally:
        await a.aclose()
        await joined.aclose()


async def test_keys_carry_one_hash_tag_and_expire(client: Any, fake_clock: FakeClock) -> None:
    a = await replica(client, fake_clock, name="rerank").start()
    try:
        fail(a, 4)
        await a.refresh()
        keys = sorted(k.decode() for k in await client.keys("*"))
        assert keys and all(k.startswith("{ragguard:breaker:rerank}:") for k in keys)
        per_replica = {k for k in keys if k.startswith("{ragguard:breaker:rerank}:seq:")}
        assert set(keys) - per_replica <= set(breaker_keys("rerank"))
        assert per_replica == {f"{{ragguard:breaker:rerank}}:seq:{a.replica_id}"}  # its last batch
        for k in set(keys) - per_replica:
            ttl_ms = await client.pttl(k)
            assert 3600_000 < ttl_ms <= 3600_000 + 5_000  # key_ttl_s plus the time left open
        for k in per_replica:
            assert 3590_000 < await client.pttl(k) <= 3600_000
    finally:
        await a.aclose()


async def test_half_open_trials_across_replicas_are_bounded(client: Any, fake_clock: FakeClock) -> None:
    replicas = [await replica(client, fake_clock, half_open_permits=2).start() for _ in range(3)]
    try:
        fail(replicas[0], 4)
        await replicas[0].refresh()
        fake_clock.advance(5.0)
        granted, rejected = [], 0
        for r in replicas:
            await r.refresh()
            for _ in range(3):
                try:
                    granted.append((r, await r.acquire_async()))
                except BreakerOpen as exc:
                    assert exc.state == "half_open"
                    rejected += 1
        assert len(granted) == 2 and rejected == 7
        for r, token in granted:
            r.on_result(token, 0.01, None)
            await r.refresh()
        for r in replicas:
            await r.refresh()
            assert r.state is CLOSED
    finally:
        for r in replicas:
            await r.aclose()


async def test_failed_trials_reopen_with_backoff(client: Any, fake_clock: FakeClock) -> None:
    a = await replica(client, fake_clock, half_open_permits=1, open_backoff_multiplier=2.0).start()
    try:
        fail(a, 4)
        await a.refresh()
        fake_clock.advance(5.0)
        token = await a.acquire_async()
        assert a.state is HALF_OPEN
        a.on_result(token, 0.01, ConnectionRefusedError("still down"))
        await a.refresh()
        assert a.state is OPEN
        assert a.retry_after_s == pytest.approx(10.0)
    finally:
        await a.aclose()


async def test_a_dead_replicas_trial_permit_comes_back(client: Any, fake_clock: FakeClock) -> None:
    a = await replica(client, fake_clock, half_open_permits=1, trial_lease_s=3.0).start()
    b = await replica(client, fake_clock, half_open_permits=1, trial_lease_s=3.0).start()
    try:
        fail(a, 4)
        await a.refresh()
        fake_clock.advance(5.0)
        await a.acquire_async()  # a takes the only permit, then "dies" without reporting
        await b.refresh()
        with pytest.raises(BreakerOpen):
            await b.acquire_async()
        fake_clock.advance(3.1)
        token = await b.acquire_async()
        b.on_result(token, 0.01, None)
        await b.refresh()
        assert b.state is CLOSED
    finally:
        await a.aclose()
        await b.aclose()


async def test_sync_acquire_uses_a_permit_fetched_in_the_background(client: Any,
                                                                   fake_clock: FakeClock) -> None:
    a = await replica(client, fake_clock, half_open_permits=1, staleness_s=1.0).start()
    try:
        fail(a, 4)
        await a.refresh()
        fake_clock.advance(5.0)
        with pytest.raises(BreakerOpen) as info:
            a.acquire()  # cannot wait on Redis: asks the background task for a permit
        assert info.value.state == "half_open" and info.value.retry_after_s == 0.0
        await a.refresh()
        token = a.acquire()
        a.on_result(token, 0.01, None)
        await a.refresh()
        assert a.state is CLOSED
    finally:
        await a.aclose()


async def test_an_unused_prefetched_permit_is_given_back(client: Any, fake_clock: FakeClock) -> None:
    a = await replica(client, fake_clock, half_open_permits=1).start()
    b = await replica(client, fake_clock, half_open_permits=1).start()
    try:
        fail(a, 4)
        await a.refresh()
        fake_clock.advance(5.0)
        with pytest.raises(BreakerOpen):
            a.acquire()
        await a.refresh()  # a now holds the only permit, unused
        await b.refresh()
        with pytest.raises(BreakerOpen):
            await b.acquire_async()
        fake_clock.advance(1.5)  # more than staleness_s: a gives it back
        await a.refresh()
        assert await b.acquire_async() is not None
    finally:
        await a.aclose()
        await b.aclose()


async def test_time_window_trips_and_forgets_old_seconds(client: Any, fake_clock: FakeClock) -> None:
    a = await replica(client, fake_clock, window_type="time", window_size=10, minimum_calls=4).start()
    try:
        fail(a, 3)
        await a.refresh()
        fake_clock.advance(11.0)  # those 3 failures leave the window
        fail(a, 1)
        succeed(a, 3)
        await a.refresh()
        assert a.state is CLOSED
        fail(a, 2)  # 3 of 6 in the window
        await a.refresh()
        assert a.state is OPEN
    finally:
        await a.aclose()


async def test_uncounted_errors_and_stale_tokens_change_nothing(client: Any, fake_clock: FakeClock) -> None:
    a = await replica(client, fake_clock).start()
    b = await replica(client, fake_clock).start()
    try:
        stale = a.acquire()
        for _ in range(6):
            a.on_result(a.acquire(), 0.01, ValueError("caller's bad input"))
        await a.refresh()
        assert await client.strlen(a.keys[1]) == 0
        fail(b, 4)
        await b.refresh()
        await b.reset()  # closed again, new epoch
        await a.refresh()
        a.on_result(stale, 0.01, ConnectionRefusedError("from before the reset"))
        await a.refresh()
        assert a.state is CLOSED and await client.strlen(a.keys[1]) == 0
    finally:
        await a.aclose()
        await b.aclose()


async def test_operators_apply_to_every_replica(client: Any, fake_clock: FakeClock) -> None:
    a = await replica(client, fake_clock).start()
    b = await replica(client, fake_clock).start()
    try:
        await a.force_open()
        await b.refresh()
        with pytest.raises(BreakerOpen) as info:
            b.acquire()
        assert info.value.state == "forced_open" and info.value.retry_after_s is None
        await a.disable()
        await b.refresh()
        b.on_result(b.acquire(), 0.01, ConnectionRefusedError("not recorded"))
        await a.reset()
        await b.refresh()
        assert b.state is CLOSED
    finally:
        await a.aclose()
        await b.aclose()


async def test_guard_stage_trips_through_the_shared_breaker(client: Any) -> None:
    g = Guard()
    shared = await replica(client, time.time, name="store").start()
    g.stage("store", breaker=shared)

    @g.guard("store")
    async def search() -> str:
        raise ConnectionRefusedError("store down")

    try:
        for _ in range(4):
            with pytest.raises(ConnectionRefusedError):
                await search()
        await shared.refresh()
        assert shared.state is OPEN
        with pytest.raises(BreakerOpen):
            await search()
    finally:
        await shared.aclose()


def test_options_are_validated(fake_clock: FakeClock) -> None:
    class _Client:
        def register_script(self, src: str) -> Any:
            return None

    with pytest.raises(ConfigError, match="staleness_s"):
        SharedCircuitBreaker(CircuitBreaker("x"), _Client(), staleness_s=0.2, flush_interval_s=0.1)
    with pytest.raises(ConfigError, match="key_prefix"):
        SharedCircuitBreaker(CircuitBreaker("x"), _Client(), key_prefix="a{b}")
    with pytest.raises(ConfigError, match="batch_size"):
        SharedCircuitBreaker(CircuitBreaker("x"), _Client(), batch_size=0)
    with pytest.raises(ConfigError, match="breaker"):
        SharedCircuitBreaker(object(), _Client())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="redis"):
        SharedCircuitBreaker(CircuitBreaker("x"), object())


@pytest.mark.parametrize("window_type", ["count", "time"])
async def test_the_shared_window_matches_the_in_memory_breaker(client: Any, fake_clock: FakeClock,
                                                               window_type: str) -> None:
    """The Lua state machine and the in-memory one, fed the same seeded outcomes, agree after
    every flush: state, calls, failures, slow calls and the run of consecutive failures."""
    opts: dict[str, Any] = dict(window_type=window_type, window_size=10, minimum_calls=5,
                                failure_rate_threshold=60.0, slow_call_rate_threshold=80.0,
                                slow_call_duration_s=1.0, consecutive_failures_threshold=4)
    ref = CircuitBreaker("reference", clock=fake_clock, **opts)
    b = await SharedCircuitBreaker(CircuitBreaker("mirror", **opts), client, clock=fake_clock,
                                   batch_size=10_000, redis_timeout_s=BREAKER_PATIENT_S).start()
    rng = random.Random(7)
    trips = 0
    try:
        for _ in range(40):
            for _ in range(rng.randint(1, 25)):
                duration = rng.choice((0.1, 2.0))
                exc = ConnectionRefusedError("down") if rng.random() < 0.35 else None
                b.on_result(b.acquire(), duration, exc)
                if ref.state is CLOSED:
                    ref.on_result(ref.acquire(), duration, exc)
            await b.refresh()
            assert b.state is ref.state
            if ref.state is OPEN:
                trips += 1
                ref.reset()
                await b.reset()
                continue
            m = ref.metrics()
            h = await client.hgetall(b.keys[0])
            got = tuple(int(h[f]) for f in (b"calls", b"failures", b"slow", b"consecutive"))
            assert got == (m.calls, m.failed_calls, m.slow_calls, m.consecutive_failures)
            fake_clock.advance(rng.choice((0.0, 0.4, 3.0)))
        assert trips >= 3  # every rule got exercised across the run
    finally:
        await b.aclose()


async def test_a_provider_turning_every_call_away_opens_the_shared_breaker_of_every_replica(
    client: Any,
) -> None:
    """Two replicas call an OpenAI-compatible provider through the real SDK; it answers every
    request 503 with Retry-After (a rejection, not a failure). Their rejections, counted together
    in Redis, make the rejection rate: the shared breaker opens for both, and the other replica
    sends nothing more."""
    import openai

    from ragguard.integrations.openai import guard_openai
    from wire import Fault, OpenAIWire

    async def no_wait(seconds: float) -> None:
        return None

    breaker = BreakerPolicy(kind="generic", minimum_calls=4, window_size=4, open_for_s=60)
    policy = Policy(stages={"generation": StagePolicy(breaker=breaker, retry=RetryPolicy(attempts=2))})
    wire = OpenAIWire()
    wire.faults.always("chat", Fault(status=503, headers={"retry-after": "1"}))
    guards = [Guard(policy, backend=RedisBackend(client, prefix="t-rejections", **PATIENT), sleep=no_wait)
              for _ in range(2)]
    sdks: list[Any] = []
    for g in guards:
        g.breaker("generation")  # built, then started: shared from the first call
        await g.start()
    try:
        with wire.running() as url:
            clients = []
            for g in guards:
                raw = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k")
                guarded = guard_openai(raw, guard=g)
                sdks += [raw, guarded.client]
                clients.append(guarded)
            ask = [{"role": "user", "content": "hi"}]
            for guarded in clients:  # one call each: two attempts each, four rejections together
                with pytest.raises(openai.InternalServerError):
                    await guarded.chat.completions.create(model="m", messages=ask)
            a, b = (g.breaker(*c.chat.completions.create.__ragguard_deployment__("m")[1:])
                    for g, c in zip(guards, clients, strict=True))  # fmt: skip
            await a.refresh()
            await b.refresh()
            await a.refresh()
            assert a.state is OPEN and b.state is OPEN
            for guarded in clients:
                with pytest.raises(ragguard.BreakerOpen):
                    await guarded.chat.completions.create(model="m", messages=ask)
            assert wire.faults.seen["chat"] == 4
    finally:
        for sdk in sdks:
            await sdk.close()
        for g in guards:
            await g.aclose()


async def test_a_call_admitted_before_the_first_read_and_ended_after_it_counts_fleet_wide(
    client: Any, fake_clock: FakeClock
) -> None:
    """A breaker that starts on its first call (a key's does) admits that call before it has read
    the shared state; the call ends after the read: its outcome counts in the shared window too,
    not only in the replica's own."""
    a, b = replica(client, fake_clock, name="early"), replica(client, fake_clock, name="early")
    try:
        tokens = [(r, r.acquire()) for r in (a, b) for _ in range(2)]  # each starts itself here
        await asyncio.sleep(0.05)  # ... and reads the shared state while the calls run
        assert a.shared and b.shared
        for r, token in tokens:
            r.on_result(token, 0.01, ConnectionRefusedError("down"))
        for r in (a, b, a):
            await r.refresh()
        assert a.state is OPEN and b.state is OPEN  # four failures of four, counted together
    finally:
        await a.aclose()
        await b.aclose()
