"""guard_anthropic through the real ``anthropic`` SDK against the Anthropic wire server: 529 and
the overloaded event inside a 200 stream, Retry-After, stalls before the first token and
mid-stream, tokens settled from ``message_delta``, and a client leaving the front door."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from _door import Sleeps, deployment_breaker, eventually, leave_after_first_chunk, streaming_app

import ragguard
from ragguard import (
    BreakerPolicy,
    GenerationPolicy,
    Guard,
    Policy,
    RetryPolicy,
    StagePolicy,
    TenantQuota,
    TokenLimits,
)
from ragguard.breakers import BreakerState
from ragguard.integrations.anthropic import guard_anthropic
from ragguard.rag import token_accounts
from wire import OVERLOADED, AnthropicWire, Fault, serving

pytestmark = pytest.mark.anyio

ASK = [{"role": "user", "content": "hi"}]


def _policy(breaker: BreakerPolicy | None = None, **generation: Any) -> Policy:
    stage = StagePolicy(
        retry=RetryPolicy(attempts=3, initial_backoff_s=0, jitter_s=0),
        generation=GenerationPolicy(**generation) if generation else GenerationPolicy(),
        **({"breaker": breaker} if breaker else {}),
    )
    return Policy(stages={"generation": stage}, tenants={"acme": TenantQuota(token_quota=10_000)})


@pytest.fixture
def client_of(closing: list[Any]) -> Any:
    def make(wire: AnthropicWire, guard: Guard, **options: Any) -> Any:
        raw = anthropic.AsyncAnthropic(base_url=wire.url, api_key="k")
        guarded = guard_anthropic(raw, guard=guard, **options)
        closing.extend((raw, guarded.client))
        return guarded

    return make


async def _text(stream: Any) -> str:
    return "".join([e.delta.text async for e in stream if e.type == "content_block_delta"])


async def test_a_529_is_attempted_as_often_as_the_retry_policy_says(
    client_of: Any, anthropic_wire: AnthropicWire, sleeps: Sleeps
) -> None:
    overloaded = Guard(_policy(breaker=BreakerPolicy(kind="generic", minimum_calls=3)), sleep=sleeps)
    anthropic_wire.faults.always("messages", Fault(status=529))
    with pytest.raises(anthropic.APIStatusError) as caught:
        await client_of(anthropic_wire, overloaded).messages.create(
            model="c", max_tokens=64, messages=ASK, stream=True
        )
    assert caught.value.status_code == 529
    assert anthropic_wire.faults.seen["messages"] == 3  # no SDK retry under ragguard's
    # three of three turned away: the rejection rate (90% by default) says the provider is down
    breaker = deployment_breaker(client_of(anthropic_wire, overloaded).messages.create, "c")
    assert breaker.state is BreakerState.OPEN
    assert breaker.metrics().rejected_calls == 3
    breaker = BreakerPolicy(kind="generic", minimum_calls=2, failure_rate_threshold=50)
    g = Guard(_policy(breaker=breaker), sleep=sleeps)
    client = client_of(anthropic_wire, g)
    anthropic_wire.faults.clear()
    anthropic_wire.faults.always("messages", Fault(status=429, headers={"retry-after": "1"}))
    for _ in range(3):
        with pytest.raises(anthropic.RateLimitError):
            await client.messages.create(model="c", max_tokens=64, messages=ASK)
    deployment = deployment_breaker(client.messages.create, "c")
    assert deployment.state is BreakerState.CLOSED  # a rate limit never opens it
    anthropic_wire.faults.clear()
    anthropic_wire.faults.always("messages", Fault(status=500))
    with pytest.raises(ragguard.BreakerOpen):  # the second failed attempt opened it
        await client.messages.create(model="c", max_tokens=64, messages=ASK)
    assert deployment.state is BreakerState.OPEN  # the control: failures open it


async def test_retries_are_numbered_and_the_servers_x_should_retry_is_obeyed(
    client_of: Any, anthropic_wire: AnthropicWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(), sleep=sleeps)
    client = client_of(anthropic_wire, g)
    anthropic_wire.faults.always("messages", Fault(status=500))
    with pytest.raises(anthropic.InternalServerError):
        await client.messages.create(model="c", max_tokens=64, messages=ASK, stream=True)
    assert [r["headers"]["x-stainless-retry-count"] for r in anthropic_wire.requests] == ["0", "1", "2"]
    anthropic_wire.faults.clear()
    anthropic_wire.faults.always("messages", Fault(status=529, headers={"x-should-retry": "false"}))
    with pytest.raises(anthropic.APIStatusError):
        await client.messages.create(model="c", max_tokens=64, messages=ASK)
    assert anthropic_wire.faults.seen["messages"] == 3 + 1  # the server said no: one request


async def test_the_overloaded_event_inside_a_200_stream_is_retried_before_the_first_token(
    client_of: Any, anthropic_wire: AnthropicWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(), sleep=sleeps)
    client = client_of(anthropic_wire, g)
    anthropic_wire.faults.push("messages", Fault(event=OVERLOADED, event_after=2))
    stream = await client.messages.create(model="c", max_tokens=64, messages=ASK, stream=True)
    assert await _text(stream) == "Hello from the wire"
    assert anthropic_wire.faults.seen["messages"] == 2


async def test_the_overloaded_event_after_the_first_token_reaches_the_caller_committed(
    client_of: Any, anthropic_wire: AnthropicWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(), sleep=sleeps)
    client = client_of(anthropic_wire, g)
    anthropic_wire.faults.push("messages", Fault(event=OVERLOADED, event_after=5))  # after two tokens
    stream = await client.messages.create(model="c", max_tokens=64, messages=ASK, stream=True)
    texts = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        async for event in stream:
            if event.type == "content_block_delta":
                texts.append(event.delta.text)
    assert texts == ["Hello", " from"]
    assert ragguard.outcomes.classify(caught.value).kind is ragguard.outcomes.Kind.REJECTION
    assert any("committed" in note for note in caught.value.__notes__)
    assert anthropic_wire.faults.seen["messages"] == 1


async def test_a_429_waits_the_retry_after_it_states(
    client_of: Any, anthropic_wire: AnthropicWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(), sleep=sleeps)
    client = client_of(anthropic_wire, g)
    anthropic_wire.faults.push("messages", Fault(status=429, headers={"retry-after": "3"}))
    whole = await client.messages.create(model="c", max_tokens=64, messages=ASK)
    assert whole.content[0].text == "Hello from the wire"
    assert 3.0 in sleeps.waits and anthropic_wire.faults.seen["messages"] == 2


async def test_a_stall_after_message_start_is_cut_by_the_first_item_budget_and_retried(
    client_of: Any, anthropic_wire: AnthropicWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(first_item_s=0.3), sleep=sleeps)
    client = client_of(anthropic_wire, g)
    anthropic_wire.faults.push("messages", Fault(stall_after=3, stall_s=5.0))  # start, block, ping
    stream = await client.messages.create(model="c", max_tokens=64, messages=ASK, stream=True)
    assert await _text(stream) == "Hello from the wire"
    assert anthropic_wire.faults.seen["messages"] == 2
    await eventually(lambda: anthropic_wire.stream_ends[:1] == ["closed"])


async def test_a_stall_mid_stream_ends_it_with_the_idle_budget(
    client_of: Any, anthropic_wire: AnthropicWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(idle_s=0.3), sleep=sleeps)
    client = client_of(anthropic_wire, g)
    anthropic_wire.faults.push("messages", Fault(stall_after=5, stall_s=5.0))
    stream = await client.messages.create(model="c", max_tokens=64, messages=ASK, stream=True)
    with pytest.raises(ragguard.StreamTimeout) as caught:
        async for _ in stream:
            pass
    assert caught.value.budget == "idle" and caught.value.items == 4  # the SDK does not yield ping
    assert anthropic_wire.faults.seen["messages"] == 1


async def test_max_tokens_is_reserved_and_the_message_delta_usage_settles(
    client_of: Any, anthropic_wire: AnthropicWire
) -> None:
    anthropic_wire.input_tokens, anthropic_wire.cache_read_input_tokens = 12, 5
    g = Guard(_policy())
    client = client_of(anthropic_wire, g)
    accounts = token_accounts(g)
    async with g.tenant("acme"):
        stream = await client.messages.create(
            model="c", max_tokens=300, messages=ASK, system="s" * 40, stream=True
        )
        assert accounts.reserved("acme") == 300 + 1 + 10  # max_tokens, and the input's text / 4
        await _text(stream)
        assert accounts.settled("acme") == 4 + 12 + 5  # message_delta's output, message_start's input
        await client.messages.create(model="c", max_tokens=300, messages=ASK)
    assert accounts.reserved("acme") == 0 and accounts.settled("acme") == 2 * (4 + 12 + 5)


async def test_the_input_of_message_start_fills_the_input_quota_and_the_models_limits_apply(
    client_of: Any, anthropic_wire: AnthropicWire
) -> None:
    anthropic_wire.input_tokens = 20  # message_start's input_tokens
    quota = TenantQuota(models={"claude-big": TokenLimits(input_token_quota=40, token_window_s=3600)})
    g = Guard(Policy(tenants={"acme": quota}))
    client = client_of(anthropic_wire, g)
    async with g.tenant("acme"):
        for _ in range(2):
            big = await client.messages.create(model="claude-big", max_tokens=64, messages=ASK, stream=True)
            await _text(big)
        with pytest.raises(ragguard.QuotaExceeded):  # 40 of the model's 40 input tokens spent
            await client.messages.create(model="claude-big", max_tokens=64, messages=ASK, stream=True)
        await client.messages.create(model="claude-small", max_tokens=64, messages=ASK)  # not limited
    assert [r["json"]["model"] for r in anthropic_wire.requests] == ["claude-big"] * 2 + ["claude-small"]
    assert token_accounts(g).settled("acme") == 3 * (20 + 4)


async def test_a_client_leaving_the_front_door_cancels_the_upstream_stream(
    client_of: Any, anthropic_wire: AnthropicWire
) -> None:
    g = Guard(_policy())
    client = client_of(anthropic_wire, g, tenant_header="x-tenant-id")
    anthropic_wire.faults.push("messages", Fault(stall_after=5, stall_s=10.0))

    async def open_answer() -> Any:
        return await client.messages.create(model="c", max_tokens=64, messages=ASK, stream=True)

    def text(event: Any) -> str:
        return event.delta.text if event.type == "content_block_delta" else ""

    with serving(streaming_app(g, open_answer, text)) as (url, _):
        first = await leave_after_first_chunk(url)
        await eventually(lambda: anthropic_wire.stream_ends == ["closed"])
        await eventually(lambda: token_accounts(g).open_streams("acme") == 0)
    assert b"Hello" in first
    assert anthropic_wire.requests[0]["headers"]["x-tenant-id"] == "acme"


async def test_with_options_keeps_the_client_guarded(
    client_of: Any, anthropic_wire: AnthropicWire, sleeps: Sleeps, closing: list[Any]
) -> None:
    g = Guard(_policy(), sleep=sleeps)
    client = client_of(anthropic_wire, g).with_options(max_retries=4)
    closing.append(client.client)
    anthropic_wire.faults.always("messages", Fault(status=500))
    with pytest.raises(anthropic.InternalServerError):
        await client.messages.create(model="c", max_tokens=64, messages=ASK)
    assert anthropic_wire.faults.seen["messages"] == 3
