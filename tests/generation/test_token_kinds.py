"""Input and output token quotas, per-model limits and the provider's reported usage, in one
process (tests/distributed/test_tokens_shared.py runs the same through Redis)."""

from __future__ import annotations

from typing import Any

import pytest
from gen_helpers import answer_policy, collect, guard

from ragguard import ConfigError, FakeClock, InvalidInput, QuotaExceeded, TenantQuota, TokenLimits
from ragguard.rag import Usage, token_accounts

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def _guard(clock: FakeClock, **quota: Any) -> Any:
    return guard(answer_policy(tenants={"acme": TenantQuota(**quota)}), clock)


def _model(g: Any) -> Any:
    @g.guard(
        "answer",
        estimate=lambda n, **kw: kw.get("estimate", n),
        input_tokens=lambda n, **kw: kw.get("prompt", 0),
        model="model",
        tokens=lambda item: item if isinstance(item, Usage) else 1,
    )
    async def answer(n: int, model: str | None = None, **kw: Any) -> Any:
        for _ in range(n):
            yield "abcd"
        if kw.get("usage") is not None:
            yield kw["usage"]

    return answer


async def test_input_and_output_quotas_are_buckets_of_their_own() -> None:
    clock = FakeClock()
    g = _guard(clock, input_token_quota=100, output_token_quota=50, token_window_s=10.0)
    answer = _model(g)
    accounts = token_accounts(g)
    async with g.tenant("acme"):
        assert len(await collect(answer(10, prompt=80))) == 10
        with pytest.raises(QuotaExceeded) as info:
            await collect(answer(1, prompt=30))  # 80 of 100 input tokens used
        assert info.value.reason == "tokens"
        assert info.value.retry_after_s == pytest.approx(10 * 0.1)
        with pytest.raises(QuotaExceeded):
            await collect(answer(1, estimate=45, prompt=0))  # 10 of 50 output used: 45 does not fit
        assert len(await collect(answer(40, prompt=0))) == 40  # 40 fits the output bucket
    assert accounts.bucket_tat("acme", ":q:input") == pytest.approx(8.0)
    assert accounts.bucket_tat("acme", ":q:output") == pytest.approx(50 * 0.2)
    assert accounts.settled("acme") == 80 + 50
    assert accounts.reserved("acme") == 0


async def test_a_listed_model_adds_its_limits_and_others_take_the_tenants() -> None:
    clock = FakeClock()
    models = {"gpt-4o": TokenLimits(token_quota=100, token_window_s=10.0)}
    g = _guard(clock, token_quota=1000, token_window_s=10.0, models=models)
    answer = _model(g)
    async with g.tenant("acme"):
        assert len(await collect(answer(80, model="gpt-4o"))) == 80
        with pytest.raises(QuotaExceeded):
            await collect(answer(30, model="gpt-4o"))
        assert len(await collect(answer(300, model="gpt-4o-mini"))) == 300  # not listed
        assert len(await collect(answer(300))) == 300
    accounts = token_accounts(g)
    assert accounts.bucket_tat("acme", "m:gpt-4o:q:total") == pytest.approx(8.0)
    assert accounts.bucket_tat("acme", ":q:total") == pytest.approx(680 * 0.01)


async def test_the_providers_usage_replaces_the_estimate_and_the_count() -> None:
    clock = FakeClock()
    g = _guard(clock, token_quota=1000, input_token_quota=500, token_window_s=10.0)
    answer = _model(g)
    async with g.tenant("acme"):
        got = await collect(answer(3, prompt=400, usage=Usage(input_tokens=120, output_tokens=9)))
    assert len(got) == 4
    accounts = token_accounts(g)
    assert accounts.bucket_tat("acme", ":q:input") == pytest.approx(120 * 0.02)
    assert accounts.bucket_tat("acme", ":q:total") == pytest.approx(129 * 0.01)
    assert accounts.settled("acme") == 129


async def test_bad_token_options_and_limits_are_named() -> None:
    clock = FakeClock()
    g = _guard(clock, token_quota=10)
    with pytest.raises(ConfigError, match="input_tokens must be an int"):

        @g.guard("answer", input_tokens="many")
        async def many(n: int) -> Any:
            yield n

    with pytest.raises(ConfigError, match="model='nope': no such parameter"):

        @g.guard("answer", model="nope")
        async def answer(n: int) -> Any:
            yield n

    with pytest.raises(ConfigError, match="models"):
        TenantQuota(models={"x" * 129: TokenLimits(token_quota=1)})
    with pytest.raises(ConfigError, match="output_token_quota"):
        TenantQuota(output_token_quota=0)
    with pytest.raises(ValueError, match="input_tokens"):
        Usage(input_tokens=-1)

    @g.guard("answer", input_tokens=lambda n: -1)
    async def negative(n: int) -> Any:
        yield "abcd"

    async with g.tenant("acme"):
        with pytest.raises(InvalidInput, match="input_tokens"):
            await collect(negative(1))
    assert token_accounts(g).reserved("acme") == 0 and token_accounts(g).open_streams("acme") == 0


async def test_the_usage_hook_may_report_input_tokens_too() -> None:
    clock = FakeClock()
    g = _guard(clock, token_quota=1000, input_token_quota=500, token_window_s=10.0)

    @g.guard(
        "answer",
        input_tokens=300,
        usage=lambda item: Usage(input_tokens=50, output_tokens=7) if item == "usage" else None,
    )
    async def answer() -> Any:
        yield "abcd"
        yield "usage"

    async with g.tenant("acme"):
        assert await collect(answer()) == ["abcd", "usage"]
    accounts = token_accounts(g)
    assert accounts.bucket_tat("acme", ":q:input") == pytest.approx(50 * 0.02)  # not the 300 estimated
    assert accounts.settled("acme") == 57
