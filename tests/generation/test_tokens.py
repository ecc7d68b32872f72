"""Per-tenant tokens of the generation preset: pacing to ``tokens_per_s`` (items delayed, never
refused) and the token quota's reserve-then-settle accounting, which leaves nothing reserved
however a stream ends."""

from __future__ import annotations

import asyncio
import random
from contextlib import aclosing
from typing import Any

import anyio
import pytest
from gen_helpers import Recorder, answer_policy, collect, drive, guard

from ragguard import FakeClock, InvalidInput, QuotaExceeded, StreamTimeout, TenantQuota
from ragguard.events import StreamSettled
from ragguard.rag import count_tokens, token_accounts

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def endless(seed: int = 7) -> Any:
    """A model that answers for ever, in items of 1 to 24 characters (1 to 6 tokens)."""

    async def model() -> Any:
        rng = random.Random(seed)
        while True:
            yield "x" * rng.randint(1, 24)

    return model


def tokens_of(n: int) -> Any:
    """A model that answers ``n`` items of one token each."""

    async def model() -> Any:
        for _ in range(n):
            yield "abcd"

    return model


# -- counting -------------------------------------------------------------------------------------


def test_the_default_count_is_characters_over_four_and_at_least_one() -> None:
    assert [count_tokens(t) for t in ("", "a", "abcd", "abcdef", "x" * 400)] == [0, 1, 1, 2, 100]
    assert count_tokens(b"abcdefgh") == 2
    assert count_tokens({"delta": "anything"}) == 1  # not text: one per item


async def test_a_user_counter_counts_and_a_bad_one_is_named() -> None:
    clock = FakeClock()
    g = guard(answer_policy(tenants={"acme": TenantQuota(token_quota=10_000)}), clock)
    accounts = token_accounts(g)

    @g.guard("answer", tokens=len)
    async def chars() -> Any:
        for word in ("one", "three"):
            yield word

    async with g.tenant("acme"):
        assert await collect(chars()) == ["one", "three"]
    assert accounts.settled("acme") == 8

    @g.guard("answer", tokens=lambda item: "many")
    async def bad() -> Any:
        yield "x"

    async with g.tenant("acme"):
        with pytest.raises(InvalidInput, match="tokens: the counter must return an int"):
            await collect(bad())
    assert accounts.reserved("acme") == 0


# -- pacing ---------------------------------------------------------------------------------------


async def test_pacing_keeps_a_tenant_within_five_percent_of_tokens_per_s_over_ten_seconds() -> None:
    clock = FakeClock()  # the pacing waits move it: nothing else takes time
    rate, burst = 50.0, 20
    g = guard(answer_policy(tenants={"greedy": TenantQuota(tokens_per_s=rate, token_burst=burst)}), clock)
    model = g.guard("answer")(endless())
    delivered = 0
    async with g.tenant("greedy"), aclosing(model()) as stream:
        async for item in stream:
            if clock() > 10.0 or delivered > 100_000:  # (an unpaced stream never moves the clock)
                break
            delivered += count_tokens(item)
            # GCRA's promise, at every item: never more than the burst above the rate
            assert delivered <= burst + rate * clock() + 1e-6
    steady = (delivered - burst) / 10.0
    assert abs(steady - rate) <= 0.05 * rate, steady
    assert token_accounts(g).open_streams("greedy") == 0


async def test_pacing_holds_for_a_tenants_streams_together_and_leaves_others_alone(
    events: Recorder,
) -> None:
    clock = FakeClock(auto_advance=False)
    rate, burst = 40.0, 10
    g = guard(answer_policy(tenants={"greedy": TenantQuota(tokens_per_s=rate, token_burst=burst)}), clock)
    delivered = {"greedy": 0, "polite": 0}
    polite_done_at: list[float] = []

    async def read(tenant: str, seed: int) -> None:
        async with g.tenant(tenant), aclosing(g.guard("answer")(endless(seed))()) as stream:
            async for item in stream:
                if clock() > 10.0 or delivered[tenant] >= (2000 if tenant == "polite" else 100_000):
                    break
                delivered[tenant] += count_tokens(item)
        if tenant == "polite":
            polite_done_at.append(clock())

    async def all_of_them() -> None:
        async with anyio.create_task_group() as tasks:
            for seed in range(3):
                tasks.start_soon(read, "greedy", seed)
            tasks.start_soon(read, "polite", 99)

    await drive(clock, all_of_them(), step=0.005)
    steady = (delivered["greedy"] - burst) / 10.0
    assert abs(steady - rate) <= 0.05 * rate, steady  # three streams share the tenant's rate
    assert polite_done_at == [0.0]  # the other tenant's 2000 tokens came at once
    await events.settle()
    paced = {e.tenant: e.paced_s for e in events.of(StreamSettled) if e.tenant == "polite"}
    assert paced == {"polite": 0.0}


async def test_an_item_larger_than_the_burst_is_delayed_not_refused() -> None:
    clock = FakeClock()
    g = guard(answer_policy(tenants={"acme": TenantQuota(tokens_per_s=50, token_burst=10)}), clock)

    @g.guard("answer")
    async def one_big_item() -> Any:
        yield "x" * 400  # 100 tokens

    async with g.tenant("acme"):
        assert await collect(one_big_item()) == ["x" * 400]
    assert clock() == pytest.approx((100 - 10) / 50)


async def test_pacing_waits_are_not_the_models_time(events: Recorder) -> None:
    clock = FakeClock()
    tenants = {"acme": TenantQuota(tokens_per_s=1, token_burst=1)}
    policy = answer_policy(first_item_s=0.5, idle_s=0.5, total_s=1.0, tenants=tenants)
    g = guard(policy, clock)
    model = g.guard("answer")(tokens_of(6))

    async def read() -> list[str]:
        async with g.tenant("acme"):
            return await collect(model())

    assert len(await read()) == 6  # 5 s of pacing, no budget cut
    assert clock() == pytest.approx(5.0)
    await events.settle()
    (settled,) = events.of(StreamSettled)
    assert (settled.tenant, settled.items, settled.tokens, settled.outcome) == ("acme", 6, 6, "ok")
    assert settled.paced_s == pytest.approx(5.0)


async def test_a_cancelled_pacing_wait_gives_its_place_back() -> None:
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(tenants={"acme": TenantQuota(tokens_per_s=10, token_burst=1)}), clock)
    accounts = token_accounts(g)
    model = g.guard("answer")(tokens_of(50))

    async def read_until_cancelled() -> int:
        got = 0
        with anyio.move_on_after(0.01):  # real time: cancels while the fake clock stands still
            async with g.tenant("acme"), aclosing(model()) as stream:
                async for _ in stream:
                    got += 1
        return got

    assert await read_until_cancelled() == 1  # the burst; the second item waits for the clock
    # only the item handed over holds its place
    assert accounts.bucket_tat("acme", ":pace") == pytest.approx(0.1)
    assert accounts.reserved("acme") == 0 and accounts.open_streams("acme") == 0


# -- the token quota: reserve, then settle ----------------------------------------------------------


def quota_guard(clock: FakeClock, *, max_wait_s: float = 0.0, estimate: int = 600) -> Any:
    tenants = {"acme": TenantQuota(token_quota=1000, token_window_s=60.0, max_wait_s=max_wait_s)}
    policy = answer_policy(tenants=tenants, idle_s=1.0)
    policy = policy.model_copy(
        update={
            "stages": {
                "answer": policy.stages["answer"].model_copy(
                    update={
                        "generation": policy.stages["answer"].generation.model_copy(
                            update={"estimate_tokens": estimate}
                        )
                    }
                )
            }
        }
    )
    return guard(policy, clock)


async def test_a_stream_reserves_its_estimate_and_settles_with_the_real_count() -> None:
    clock = FakeClock()
    g = quota_guard(clock)
    accounts = token_accounts(g)
    seen: list[int] = []

    @g.guard("answer")
    async def model(n: int) -> Any:
        seen.append(accounts.reserved("acme"))  # while the stream is open
        for _ in range(n):
            yield "abcd"

    async with g.tenant("acme"):
        assert len(await collect(model(100))) == 100
    assert seen == [600]
    assert (accounts.reserved("acme"), accounts.settled("acme")) == (0, 100)

    # 100 of 1000 spent: another 600 fits now; had the first kept its 600, it would not
    async with g.tenant("acme"):
        assert len(await collect(model(900))) == 900  # more than its estimate: owed, not cut
    assert accounts.settled("acme") == 1000

    with pytest.raises(QuotaExceeded) as refused:
        async with g.tenant("acme"):
            await collect(model(1))
    assert refused.value.reason == "tokens" and refused.value.tenant == "acme"
    assert refused.value.retry_after_s == pytest.approx(600 * 60.0 / 1000)  # the quota refills at 1000/min
    assert accounts.reserved("acme") == 0 and accounts.open_streams("acme") == 0


async def test_a_reservation_waits_within_max_wait_s_and_a_cancelled_wait_reserves_nothing() -> None:
    clock = FakeClock(auto_advance=False)
    g = quota_guard(clock, max_wait_s=60.0)
    accounts = token_accounts(g)
    model = g.guard("answer")(tokens_of(1000))

    async def read() -> int:
        async with g.tenant("acme"):
            return len(await collect(model()))

    assert await drive(clock, read()) == 1000  # the bucket is empty now
    with anyio.move_on_after(0.01):  # gives up while waiting for its 600 tokens
        await read()
    assert accounts.reserved("acme") == 0
    started = clock()
    assert await drive(clock, read(), step=0.5) == 1000  # waits 36 s for 600 of 1000 tokens
    assert 36.0 <= clock() - started <= 36.5


async def test_nothing_stays_reserved_however_a_stream_ends() -> None:
    clock = FakeClock(auto_advance=False)
    g = quota_guard(clock, estimate=50)
    accounts = token_accounts(g)

    def source_of(fail_at: int | None = None, stall_at: int | None = None) -> Any:
        async def model() -> Any:
            for i in range(10):
                if i == fail_at:
                    raise ConnectionResetError("dropped")
                if i == stall_at:
                    await clock.sleep(100)
                yield "abcd"

        return model

    def fallback() -> list[str]:
        return ["abcd"] * 3  # a fallback's items are not the model's tokens

    async def read(source: Any, *, stop_after: int | None = None) -> int:
        got = 0
        async with g.tenant("acme"), aclosing(g.guard("answer", fallback=fallback)(source)()) as stream:
            async for _ in stream:
                got += 1
                if got == stop_after:
                    break
        return got

    async def cancelled(source: Any) -> None:
        task = asyncio.ensure_future(read(source))
        while accounts.open_streams("acme") == 0 or not clock.sleepers:
            await asyncio.sleep(0)
        task.cancel()  # mid-stream, while the model is stalled
        with pytest.raises(asyncio.CancelledError):
            await task

    expected = 0
    assert await drive(clock, read(source_of())) == 10
    expected += 10
    assert await drive(clock, read(source_of(), stop_after=2)) == 2  # closed early
    expected += 2
    with pytest.raises(ConnectionResetError):
        await drive(clock, read(source_of(fail_at=4)))  # failed after 4 items
    expected += 4
    with pytest.raises(StreamTimeout):
        await drive(clock, read(source_of(stall_at=6)))  # cut by its idle budget after 6
    expected += 6
    assert await drive(clock, read(source_of(fail_at=0))) == 3  # served by the fallback
    await cancelled(source_of(stall_at=5))  # cancelled mid-stream after 5
    expected += 5
    assert accounts.reserved("acme") == 0
    assert accounts.open_streams("acme") == 0
    assert accounts.settled("acme") == expected


async def test_many_streams_ending_every_way_leave_nothing_reserved(events: Recorder) -> None:
    clock = FakeClock(auto_advance=False)
    g = quota_guard(clock, max_wait_s=5.0, estimate=20)
    accounts = token_accounts(g)
    rng = random.Random(2026)

    @g.guard("answer", fallback=lambda n, mode: ["abcd"])
    async def model(n: int, mode: str) -> Any:
        for i in range(n):
            if mode == "fail" and i == n // 2:
                raise ConnectionResetError("dropped")
            await clock.sleep(0.01 if mode != "stall" or i < n // 2 else 100)
            yield "abcd"

    async def one(n: int, mode: str) -> None:
        try:
            async with g.tenant("acme"), aclosing(model(n, mode)) as stream:
                async for i, _ in _enumerate(stream):
                    if mode == "close" and i == n // 3:
                        break
        except (ConnectionResetError, StreamTimeout, QuotaExceeded):
            pass

    async def all_of_them() -> None:
        async with anyio.create_task_group() as tasks:
            for _ in range(60):
                tasks.start_soon(one, rng.randint(0, 30), rng.choice(["ok", "fail", "stall", "close"]))
            while clock() < 0.5:
                await asyncio.sleep(0)
            tasks.cancel_scope.cancel()  # whatever is still open (stalled, waiting) is cancelled

    await drive(clock, all_of_them(), step=0.05)
    assert accounts.reserved("acme") == 0 and accounts.open_streams("acme") == 0
    await events.settle()
    ended = events.of(StreamSettled)
    assert {e.outcome for e in ended} == {"ok", "error", "cancelled"}
    assert any(e.outcome == "cancelled" and e.items > 0 for e in ended)  # cancelled mid-stream
    assert accounts.settled("acme") == sum(e.tokens for e in ended)
    assert all(e.reserved == 20 for e in ended)  # every stream that opened had reserved


async def _enumerate(stream: Any) -> Any:
    i = 0
    async for item in stream:
        yield i, item
        i += 1


async def test_the_estimate_can_come_from_the_calls_arguments() -> None:
    clock = FakeClock()
    g = quota_guard(clock)
    accounts = token_accounts(g)
    seen: list[int] = []

    @g.guard("answer", estimate=lambda prompt, max_tokens: max_tokens)
    async def model(prompt: str, max_tokens: int) -> Any:
        seen.append(accounts.reserved("acme"))
        yield prompt

    async with g.tenant("acme"):
        await collect(model("hi", max_tokens=5000))  # more than the quota holds: reserves it all
        await collect(model("hi", max_tokens=120))  # the first gave back what it did not use
    assert seen == [1000, 120]
    assert accounts.reserved("acme") == 0
