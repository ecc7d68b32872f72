"""Token quotas and pacing shared through a real redis-server (and a real Redis Cluster).

Replicas are Guards with their own clients in one process here (the three-process measurement is
test_tokens_accuracy.py). The shared clock is a FakeClock (``Guard(clock=...)`` passes it to the
scripts as ``now``), so the GCRA arithmetic is exact; the outage tests run on Redis's own time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import pytest
import redis.asyncio as aredis
from distributed_helpers import PATIENT_S, make_client, until
from redis.asyncio.cluster import ClusterNode, RedisCluster

from ragguard import (
    ConfigError,
    FakeClock,
    Guard,
    Policy,
    QuotaExceeded,
    StagePolicy,
    TenantQuota,
    TokenLimits,
)
from ragguard.rag import Usage, token_accounts
from ragguard.redis import RedisBackend, RedisTokens, SharedStateDegraded, SharedStateRestored
from ragguard.redis._tokens import token_key

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

PATIENT = {"tokens": {"redis_timeout_s": PATIENT_S}, "quotas": {"redis_timeout_s": PATIENT_S}}


def policy(**quota: Any) -> Policy:
    return Policy(
        stages={"answer": StagePolicy(preset="generation")},
        tenants={"acme": TenantQuota(**quota)},
    )


class Replica:
    """One replica: a Guard with its own client, and a stream of ``n`` one-token items."""

    def __init__(self, host: str, port: int, pol: Policy, clock: Any = None, **backend: Any) -> None:
        self.client = make_client(host, port, socket_timeout=PATIENT_S, socket_connect_timeout=PATIENT_S)
        options: dict[str, Any] = {} if clock is None else {"clock": clock}
        self.guard = Guard(pol, backend=RedisBackend(self.client, **(backend or PATIENT)), **options)
        self.ledger: RedisTokens = token_accounts(self.guard)  # type: ignore[assignment]

        @self.guard.guard("answer", estimate=lambda n, **kw: kw.get("estimate", n), **self.options())
        async def answer(n: int, **kw: Any) -> AsyncIterator[Any]:
            for _ in range(n):
                yield "abcd"  # one token each
            if kw.get("usage") is not None:
                yield kw["usage"]

        self.answer = answer

    def options(self) -> dict[str, Any]:
        return {
            "tokens": lambda item: item if isinstance(item, Usage) else 1,
            "input_tokens": lambda n, **kw: kw.get("prompt", 0),
            "model": lambda n, **kw: kw.get("model"),
        }

    async def run(self, n: int, tenant: str = "acme", **kw: Any) -> int:
        got = 0
        async with self.guard.tenant(tenant), aclosing(self.answer(n, **kw)) as stream:
            async for _ in stream:
                got += 1
        return got

    async def close(self) -> None:
        await self.guard.aclose()
        await self.client.aclose()


@pytest.fixture
async def replicas(redis_server: Any) -> AsyncIterator[Callable[..., Replica]]:
    made: list[Replica] = []

    def make(pol: Policy, clock: Any = None, **backend: Any) -> Replica:
        r = Replica(redis_server.host, redis_server.port, pol, clock, **backend)
        made.append(r)
        return r

    yield make
    for r in made:
        await r.close()


async def settled(*rs: Replica) -> None:
    """Wait until every replica's background settlements reached Redis."""
    for r in rs:
        while r.ledger._tasks:
            await asyncio.wait(list(r.ledger._tasks))


async def tat(client: aredis.Redis, bucket: str, tenant: str = "acme") -> float | None:
    raw = await client.get(token_key(tenant, bucket))
    return None if raw is None else float(raw)


# -- one quota across replicas --------------------------------------------------------------------


async def test_two_replicas_share_one_token_quota_and_its_refunds(
    replicas: Callable[..., Replica], client: aredis.Redis
) -> None:
    clock = FakeClock(1000.0)
    pol = policy(token_quota=1000, token_window_s=60.0)
    a, b = replicas(pol, clock), replicas(pol, clock)

    assert await a.run(10, estimate=400) == 10  # reserves 400, settles 10: 390 given back
    await settled(a)
    assert await tat(client, ":q:total") == pytest.approx(1000.0 + 10 * 0.06)
    assert await b.run(10, estimate=900) == 10  # fits only because a's refund reached Redis
    await settled(b)
    with pytest.raises(QuotaExceeded) as info:
        await a.run(1, estimate=990)  # 20 used of 1000: 990 does not fit on either replica
    assert info.value.reason == "tokens"
    assert info.value.retry_after_s == pytest.approx(10 * 0.06, abs=1e-6)
    assert a.ledger.reserved("acme") == 0 and b.ledger.reserved("acme") == 0
    assert await client.hlen(token_key("acme", ":res")) == 0  # every reservation settled


async def test_a_stream_longer_than_its_estimate_leaves_a_debt_the_other_replica_waits_for(
    replicas: Callable[..., Replica], client: aredis.Redis
) -> None:
    clock = FakeClock(0.0)
    a, b = replicas(policy(token_quota=100, token_window_s=10.0), clock), None
    b = replicas(policy(token_quota=100, token_window_s=10.0), clock)
    assert await a.run(150, estimate=10) == 150  # reserved 10, used 150: 50 tokens of debt
    await settled(a)
    assert await tat(client, ":q:total") == pytest.approx(15.0)  # 150 tokens x 0.1 s
    with pytest.raises(QuotaExceeded) as info:
        await b.run(1, estimate=1)
    assert info.value.retry_after_s == pytest.approx(5.1)  # the debt (5 s), then its own token


async def test_the_provider_reported_usage_settles_input_and_output_buckets(
    replicas: Callable[..., Replica], client: aredis.Redis
) -> None:
    clock = FakeClock(0.0)
    pol = policy(token_quota=10_000, input_token_quota=1000, output_token_quota=500, token_window_s=100.0)
    a = replicas(pol, clock)
    # reserves 300 input + 50 output; the provider reports 200 in, 80 out
    assert await a.run(3, estimate=50, prompt=300, usage=Usage(input_tokens=200, output_tokens=80)) == 4
    await settled(a)
    assert await tat(client, ":q:input") == pytest.approx(200 * 0.1)
    assert await tat(client, ":q:output") == pytest.approx(80 * 0.2)
    assert await tat(client, ":q:total") == pytest.approx(280 * 0.01)
    assert a.ledger.settled("acme") == 280
    with pytest.raises(QuotaExceeded):
        await a.run(1, estimate=1, prompt=801)  # 200 of 1000 input used: 801 does not fit


async def test_a_model_listed_for_the_tenant_has_its_own_buckets_too(
    replicas: Callable[..., Replica], client: aredis.Redis
) -> None:
    clock = FakeClock(0.0)
    pol = policy(
        token_quota=1000,
        token_window_s=10.0,
        models={"big{1}": TokenLimits(token_quota=100, token_window_s=10.0)},
    )
    a, b = replicas(pol, clock), replicas(pol, clock)
    assert await a.run(60, estimate=60, model="big{1}") == 60
    await settled(a)
    with pytest.raises(QuotaExceeded):
        await b.run(50, estimate=50, model="big{1}")  # the model's 100: 60 used
    assert await b.run(50, estimate=50, model="small") == 50  # another model: the tenant's 1000 only
    assert await b.run(50, estimate=50) == 50  # no model: likewise
    await settled(b)
    assert await tat(client, "m:big{1}:q:total") == pytest.approx(60 * 0.1)
    assert await tat(client, ":q:total") == pytest.approx(160 * 0.01)
    assert token_key("acme", "m:big{1}:q:total") == "{ragguard:tokens:acme}m:big%7B1%7D:q:total"


# -- pacing across replicas -------------------------------------------------------------------------


async def test_two_replicas_pace_to_one_shared_rate(
    replicas: Callable[..., Replica], client: aredis.Redis
) -> None:
    clock = FakeClock(0.0)  # sleeps advance it: the paced streams' waits add up on it
    pol = policy(tokens_per_s=100.0, token_burst=10)
    a, b = replicas(pol, clock), replicas(pol, clock)
    start = clock()
    await asyncio.gather(a.run(200), b.run(200))
    elapsed = clock() - start
    # 400 tokens at 100/s past a burst of 10: at least 3.9 s, whichever replica handed them over
    assert elapsed >= 3.9 - 1e-6
    assert elapsed <= 3.9 + 0.2  # and not much more: at most a block (5 tokens) left unused each


# -- Redis away, back, refusing credentials ---------------------------------------------------------


async def test_when_redis_goes_down_streams_run_on_local_accounts_and_settle_in_redis_once_back(
    replicas: Callable[..., Replica], redis_server: Any, seen: list[Any]
) -> None:
    a = replicas(
        policy(token_quota=100_000, tokens_per_s=10_000.0),
        tokens={"redis_timeout_s": PATIENT_S, "probe_every_s": 0.05},
    )
    assert await a.run(5) == 5
    redis_server.stop()
    for _ in range(3):
        assert await a.run(5) == 5  # no stream fails: the second failure in a row switches to local
    assert a.ledger.link.degraded
    assert any(isinstance(e, SharedStateDegraded) and e.component == "tokens" for e in seen)
    assert a.ledger.reserved("acme") == 0
    redis_server.start()  # empty, on the same port
    assert await until(lambda: not a.ledger.link.degraded, 5.0) < 5.0
    # the bus hands its events to listeners on a later turn of the loop
    restored = lambda: any(isinstance(e, SharedStateRestored) and e.component == "tokens" for e in seen)  # noqa: E731
    assert await until(restored, 1.0) < 1.0
    assert await a.run(5) == 5
    await settled(a)
    assert a.ledger.unsettled == 0


async def test_a_settlement_sent_while_redis_is_away_is_sent_once_it_is_back(
    replicas: Callable[..., Replica], redis_server: Any, client: aredis.Redis
) -> None:
    clock = FakeClock(0.0)
    a = replicas(
        policy(token_quota=1000, token_window_s=10.0),
        clock,
        tokens={"redis_timeout_s": PATIENT_S, "probe_every_s": 0.05},
    )
    stream = a.answer(10, estimate=500)
    async with a.guard.tenant("acme"):
        assert await stream.__anext__() == "abcd"  # reserved 500 in Redis
        # Redis loses its connection for a moment (a restart keeps nothing: stop the client's link)
        await client.client_kill_filter(skipme=True, _type="normal")
        a.ledger.link._degrade(ConnectionError("test: link down"))
        await stream.aclose()  # settles 1 token: the settlement waits for the link
    await asyncio.sleep(0.01)
    assert a.ledger.unsettled == 1
    assert await until(lambda: not a.ledger.link.degraded, 5.0) < 5.0
    await settled(a)
    assert a.ledger.unsettled == 0
    assert await tat(client, ":q:total") == pytest.approx(1 * 0.01)  # 500 reserved, 1 charged
    assert await client.hlen(token_key("acme", ":res")) == 0


async def test_a_settlement_counts_once_however_often_it_is_sent(
    replicas: Callable[..., Replica], client: aredis.Redis
) -> None:
    clock = FakeClock(0.0)
    a = replicas(policy(token_quota=1000, token_window_s=10.0), clock)
    account = a.ledger.open("acme")
    assert account is not None
    reservation, wait = await a.ledger.reserve_async(account, 300)
    assert wait == 0.0 and reservation.ref is not None
    for _ in range(3):
        a.ledger.settle(account, reservation, 100)
    await settled(a)
    a.ledger.close(account)
    assert await tat(client, ":q:total") == pytest.approx(100 * 0.01)  # +300 then -200, once


async def test_a_reservation_cancelled_in_flight_is_given_back(
    replicas: Callable[..., Replica], client: aredis.Redis
) -> None:
    clock = FakeClock(0.0)
    a = replicas(policy(token_quota=1000, token_window_s=10.0), clock)
    account = a.ledger.open("acme")
    assert account is not None
    task = asyncio.get_running_loop().create_task(a.ledger.reserve_async(account, 300))
    await asyncio.sleep(0)  # the script is sent; cancel while its reply is on the way
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await settled(a)
    a.ledger.close(account)
    assert (await tat(client, ":q:total") or 0.0) == pytest.approx(0.0, abs=1e-6)
    assert await client.hlen(token_key("acme", ":res")) == 0


async def test_refused_credentials_run_the_streams_on_local_accounts(
    redis_server: Any, seen: list[Any]
) -> None:
    bad = make_client(redis_server.host, redis_server.port, password="wrong", username="nobody")
    g = Guard(policy(token_quota=100), backend=RedisBackend(bad, **PATIENT))

    @g.guard("answer", estimate=10)
    async def answer() -> AsyncIterator[str]:
        yield "abcd"

    try:
        for _ in range(3):
            async with g.tenant("acme"), aclosing(answer()) as stream:
                assert [x async for x in stream] == ["abcd"]
        ledger: RedisTokens = token_accounts(g)  # type: ignore[assignment]
        assert ledger.link.degraded
        assert ledger.settled("acme") == 3
    finally:
        await g.aclose()
        await bad.aclose()


# -- Redis Cluster ----------------------------------------------------------------------------------


async def test_token_buckets_run_on_a_cluster_under_one_hash_tag(redis_cluster_session: Any) -> None:
    nodes = [ClusterNode(h, p) for h, p in redis_cluster_session.startup_nodes]
    clients = [RedisCluster(startup_nodes=nodes, socket_timeout=PATIENT_S) for _ in range(2)]
    clock = FakeClock(0.0)
    pol = Policy(
        stages={"answer": StagePolicy(preset="generation")},
        tenants={
            t: TenantQuota(token_quota=100, input_token_quota=100, models={"m": TokenLimits(token_quota=50)})
            for t in ("acme", "globex")
        },
    )
    guards = [Guard(pol, backend=RedisBackend(c, prefix="tok", **PATIENT), clock=clock) for c in clients]
    try:
        for g in guards:

            @g.guard("answer", estimate=30, input_tokens=5, model=lambda: "m")
            async def answer() -> AsyncIterator[str]:
                yield "abcd"

            for tenant in ("acme", "globex"):
                async with g.tenant(tenant), aclosing(answer()) as stream:
                    assert [x async for x in stream] == ["abcd"]
        ledgers: list[RedisTokens] = [token_accounts(g) for g in guards]  # type: ignore[misc]
        for ledger in ledgers:
            while ledger._tasks:
                await asyncio.wait(list(ledger._tasks))
            assert not ledger.link.degraded  # every script ran on the cluster
        for tenant in ("acme", "globex"):
            keys = [token_key(tenant, k, "tok") for k in (":q:total", ":q:input", "m:m:q:total", ":res")]
            slots = {int(await clients[0].cluster_keyslot(k)) for k in keys}
            assert len(slots) == 1
            raw = await clients[0].get(token_key(tenant, ":q:total", "tok"))
            assert float(raw) == pytest.approx(2 * 6 * 0.6)  # two streams of 5 in + 1 out, 0.6 s each
    finally:
        for g in guards:
            await g.aclose()
        for c in clients:
            await c.aclose()


async def test_start_strict_names_refused_credentials_and_a_good_client_starts(redis_server: Any) -> None:
    bad = make_client(redis_server.host, redis_server.port, password="s3cret-pw", username="nobody")
    good = make_client(redis_server.host, redis_server.port, socket_timeout=PATIENT_S)
    try:
        for client_, strict_fails in ((bad, True), (good, False)):
            g = Guard(policy(token_quota=100), backend=RedisBackend(client_, **PATIENT))

            @g.guard("answer")
            async def answer() -> AsyncIterator[str]:
                yield "abcd"

            ledger: RedisTokens = token_accounts(g)  # type: ignore[assignment]
            if strict_fails:
                with pytest.raises(ConfigError, match="tokens: authentication failed") as info:
                    await ledger.start(strict=True)
                assert "s3cret-pw" not in str(info.value)
                assert ledger.link.degraded
                ledger.link.degraded = False
                await g.start()  # not strict: the Guard starts its token accounts too, on local state
                assert ledger.link.degraded
            else:
                await g.start(strict=True)
                assert not ledger.link.degraded
            await g.aclose()
    finally:
        await bad.aclose()
        await good.aclose()


async def test_the_input_tokens_openai_reports_fill_the_shared_input_quota_of_every_replica(
    redis_server: Any, client: aredis.Redis
) -> None:
    """Two replicas call an OpenAI-compatible server through the real SDK: each stream reserves
    its messages' text before it is sent and settles the ``prompt_tokens`` the server reports, in
    the tenant's one input bucket in Redis, so the replica that did not spend them refuses the
    next call before it is sent."""
    import openai

    from ragguard.integrations.openai import guard_openai
    from wire import OpenAIWire

    clock = FakeClock(1000.0)
    pol = policy(input_token_quota=30, token_window_s=3600.0)
    a, b = (Replica(redis_server.host, redis_server.port, pol, clock) for _ in range(2))
    wire = OpenAIWire(usage_prompt_tokens=15)
    sdks: list[Any] = []
    ask = [{"role": "user", "content": "q" * 20}]  # 5 input tokens reserved, 15 reported
    try:
        with wire.running() as url:
            clients = []
            for r in (a, b):
                raw = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k")
                guarded = guard_openai(raw, guard=r.guard)
                sdks += [raw, guarded.client]
                clients.append(guarded)
            for _ in range(2):
                async with a.guard.tenant("acme"):
                    stream = await clients[0].chat.completions.create(model="m", messages=ask, stream=True)
                    assert [c async for c in stream]
            await settled(a)
            assert await tat(client, ":q:input") == pytest.approx(1000.0 + 30 * 120.0)  # 2 x 15
            async with b.guard.tenant("acme"):
                with pytest.raises(QuotaExceeded):  # b reserves 5 more of a spent bucket
                    await clients[1].chat.completions.create(model="m", messages=ask, stream=True)
            assert wire.faults.seen["chat"] == 2
            assert b.ledger.reserved("acme") == 0
    finally:
        for sdk in sdks:
            await sdk.close()
        await a.close()
        await b.close()
