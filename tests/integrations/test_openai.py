"""guard_openai through the real ``openai`` SDK against the OpenAI wire server (tests/wire):
attempts counted at the server, Retry-After, stalls before the first token and mid-stream,
fallbacks that keep streaming, the breaker, tokens reserved and settled from usage, the SDK's
timeout and the tenant header, and a client leaving the front door mid-stream."""

from __future__ import annotations

from typing import Any

import httpx2
import openai
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
from ragguard.integrations.openai import guard_openai
from ragguard.rag import token_accounts
from wire import Fault, OpenAIWire, serving

pytestmark = pytest.mark.anyio

ASK = [{"role": "user", "content": "hi"}]


def _policy(**generation: Any) -> Policy:
    stage = StagePolicy(
        retry=RetryPolicy(attempts=3, initial_backoff_s=0, jitter_s=0),
        generation=GenerationPolicy(**generation) if generation else GenerationPolicy(),
    )
    return Policy(stages={"generation": stage}, tenants={"acme": TenantQuota(token_quota=10_000)})


@pytest.fixture
def client_of(closing: list[Any]) -> Any:
    """``client_of(wire, guard, **options)``: a guarded AsyncOpenAI of ``wire``, closed after the test."""

    def make(wire: OpenAIWire, guard: Guard, **options: Any) -> Any:
        raw = openai.AsyncOpenAI(base_url=f"{wire.url}/v1", api_key="k", **options.pop("sdk", {}))
        guarded = guard_openai(raw, guard=guard, **options)
        closing.extend((raw, guarded.client))
        return guarded

    return make


async def _text(stream: Any) -> str:
    parts = []
    async for chunk in stream:
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
    return "".join(parts)


# -- attempts: the stage's retry policy is the only loop ----------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_a_failing_provider_is_attempted_exactly_as_often_as_the_retry_policy_says(
    client_of: Any, openai_wire: OpenAIWire, sleeps: Sleeps, stream: bool
) -> None:
    g = Guard(_policy(), sleep=sleeps)
    client = client_of(openai_wire, g)
    openai_wire.faults.always("chat", Fault(status=503))
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="m", messages=ASK, stream=stream)
    assert openai_wire.faults.seen["chat"] == 3  # the SDK's own 2 retries would make it 9
    assert client.client.max_retries == 0


async def test_each_retry_says_its_number_in_x_stainless_retry_count_as_the_sdks_own_would(
    client_of: Any, openai_wire: OpenAIWire, sleeps: Sleeps, closing: list[Any]
) -> None:
    g = Guard(_policy(), sleep=sleeps)
    client = client_of(openai_wire, g)
    down = Fault(status=500, headers={"retry-after-ms": "1"})  # (the SDK's own retries: no backoff)
    openai_wire.faults.always("chat", down)
    openai_wire.faults.always("embeddings", down)
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="m", messages=ASK, stream=True)
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="m", messages=ASK)
    with pytest.raises(openai.InternalServerError):
        await client.embeddings.create(model="e", input=["alpha"])  # the embedding stage: 2 attempts
    numbers = [(r["route"], r["headers"]["x-stainless-retry-count"]) for r in openai_wire.requests]
    assert numbers == [("chat", n) for n in "012012"] + [("embeddings", "0"), ("embeddings", "1")]
    raw = openai.AsyncOpenAI(base_url=f"{openai_wire.url}/v1", api_key="k", max_retries=2)
    closing.append(raw)
    with pytest.raises(openai.InternalServerError):  # the control: the SDK's own retries say the same
        await raw.chat.completions.create(model="m", messages=ASK)
    assert [r["headers"]["x-stainless-retry-count"] for r in openai_wire.requests[-3:]] == ["0", "1", "2"]


@pytest.mark.parametrize(
    ("status", "said", "requests"), [(500, "false", 1), (400, "true", 3), (400, "nope", 1), (500, "", 3)]
)
async def test_the_servers_x_should_retry_overrides_what_its_status_says_as_in_the_sdk(
    client_of: Any,
    openai_wire: OpenAIWire,
    sleeps: Sleeps,
    closing: list[Any],
    status: int,
    said: str,
    requests: int,
) -> None:
    g = Guard(_policy(), sleep=sleeps)
    client = client_of(openai_wire, g)
    headers = {"x-should-retry": said, "retry-after-ms": "1"}  # (the SDK's own retries: no backoff)
    openai_wire.faults.always("chat", Fault(status=status, headers=headers))
    with pytest.raises(openai.APIStatusError):
        await client.chat.completions.create(model="m", messages=ASK, stream=True)
    assert openai_wire.faults.seen["chat"] == requests  # the stage allows three
    raw = openai.AsyncOpenAI(base_url=f"{openai_wire.url}/v1", api_key="k", max_retries=2)
    closing.append(raw)
    with pytest.raises(openai.APIStatusError):  # the control: the SDK alone sends as many
        await raw.chat.completions.create(model="m", messages=ASK)
    assert openai_wire.faults.seen["chat"] == 2 * requests


async def test_the_unguarded_sdk_would_retry_on_its_own(openai_wire: OpenAIWire, closing: list[Any]) -> None:
    """The control: the same SDK client, not wrapped, retries by itself (what the wrapper stops)."""
    openai_wire.faults.always("chat", Fault(status=503, headers={"retry-after-ms": "1"}))
    raw = openai.AsyncOpenAI(base_url=f"{openai_wire.url}/v1", api_key="k")
    closing.append(raw)
    with pytest.raises(openai.InternalServerError):
        await raw.chat.completions.create(model="m", messages=ASK)
    assert openai_wire.faults.seen["chat"] == 3


# -- rate limiting: the wait the provider states ------------------------------------------


async def test_a_429_is_retried_after_the_wait_its_retry_after_states(
    client_of: Any, openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(), sleep=sleeps)
    client = client_of(openai_wire, g)
    openai_wire.faults.push("chat", Fault(status=429, headers={"retry-after": "2"}))
    stream = await client.chat.completions.create(model="m", messages=ASK, stream=True)
    assert await _text(stream) == "Hello from the wire"
    assert openai_wire.faults.seen["chat"] == 2
    assert sleeps.waits and max(sleeps.waits) >= 2.0  # waited what the server said, not the backoff


async def test_a_429_stating_more_than_max_retry_after_s_is_not_waited_for(
    client_of: Any, openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(), sleep=sleeps)
    client = client_of(openai_wire, g)
    openai_wire.faults.push("chat", Fault(status=429, headers={"retry-after": "60"}))
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model="m", messages=ASK)
    assert openai_wire.faults.seen["chat"] == 1
    assert ragguard.outcomes.classify(caught.value).retry_after_s == 60.0


# -- stalls: before the first token, and mid-stream ---------------------------------------


async def test_a_stall_before_the_first_token_is_cut_by_the_first_item_budget_and_retried(
    client_of: Any, openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    """The server sends its role-only chunk at once, then stalls: that chunk is held back with
    the first token, so the first-item budget cuts the stall and the retry is still allowed."""
    g = Guard(_policy(first_item_s=0.3), sleep=sleeps)
    client = client_of(openai_wire, g)
    openai_wire.faults.push("chat", Fault(stall_after=1, stall_s=5.0))
    stream = await client.chat.completions.create(model="m", messages=ASK, stream=True)
    assert await _text(stream) == "Hello from the wire"
    assert openai_wire.faults.seen["chat"] == 2
    await eventually(lambda: openai_wire.stream_ends[:1] == ["closed"])  # the stalled call was closed


async def test_a_stall_mid_stream_ends_it_with_the_idle_budget_and_no_retry(
    client_of: Any, openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(idle_s=0.3), sleep=sleeps)
    client = client_of(openai_wire, g)
    openai_wire.faults.push("chat", Fault(stall_after=3, stall_s=5.0))  # role chunk, two tokens
    stream = await client.chat.completions.create(model="m", messages=ASK, stream=True)
    got = []
    with pytest.raises(ragguard.StreamTimeout) as caught:
        async for chunk in stream:
            got.append(chunk.choices[0].delta.content)
    assert caught.value.budget == "idle" and caught.value.items == 3
    assert got == ["", "Hello", " from"]
    assert openai_wire.faults.seen["chat"] == 1  # committed: never sent twice
    await eventually(lambda: openai_wire.stream_ends == ["closed"])


async def test_an_error_event_inside_a_200_stream_before_the_first_token_is_retried(
    client_of: Any, openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(), sleep=sleeps)
    client = client_of(openai_wire, g)
    overloaded = {"type": "server_error", "code": "overloaded", "message": "busy"}
    openai_wire.faults.push("chat", Fault(event=overloaded, event_after=1))
    stream = await client.chat.completions.create(model="m", messages=ASK, stream=True)
    assert await _text(stream) == "Hello from the wire"
    assert openai_wire.faults.seen["chat"] == 2


# -- fallbacks that keep streaming, and the breaker ---------------------------------------


async def test_a_fallback_client_keeps_the_stream_going(
    client_of: Any, openai_wire: OpenAIWire, backup_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    policy = Policy(stages={"backup": StagePolicy(preset="generation")})
    g = Guard(policy, sleep=sleeps)
    backup = client_of(backup_wire, g, generation_stage="backup")
    client = client_of(openai_wire, g, fallback=backup.chat.completions.create)
    openai_wire.faults.always("chat", Fault(status=503))
    stream = await client.chat.completions.create(model="m", messages=ASK, stream=True)
    assert await _text(stream) == "Backup answer"
    assert "backup" in ragguard.degraded()  # the fallback client, by its stage (not "create")
    assert backup_wire.faults.seen["chat"] == 1
    whole = await client.chat.completions.create(model="m", messages=ASK)  # not streamed: the same
    assert whole.choices[0].message.content == "Backup answer"


async def test_a_fallback_clients_stage_declared_with_the_generation_preset_retries_as_generation_does(
    client_of: Any, openai_wire: OpenAIWire, backup_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    """The docs' fallback client: its stage says only ``preset: generation``, and gets the standard
    generation stage's two attempts, so a reset on the backup model is retried, not a 502."""
    g = Guard(Policy(stages={"backup": StagePolicy(preset="generation")}), sleep=sleeps)
    assert g.policy.stage("backup").retry.attempts == 2
    backup = client_of(backup_wire, g, generation_stage="backup")
    client = client_of(openai_wire, g, fallback=backup.chat.completions.create)
    openai_wire.faults.always("chat", Fault(status=500))
    backup_wire.faults.push("chat", Fault(reset=True))
    stream = await client.chat.completions.create(model="m", messages=ASK, stream=True)
    assert await _text(stream) == "Backup answer"
    assert backup_wire.faults.seen["chat"] == 2  # the reset, then the retry that answered


async def test_the_breaker_in_front_of_the_provider_opens_and_stops_the_calls(
    client_of: Any,
    openai_wire: OpenAIWire,
) -> None:
    breaker = BreakerPolicy(kind="generic", minimum_calls=4, failure_rate_threshold=50, open_for_s=60)
    g = Guard(Policy(stages={"generation": StagePolicy(breaker=breaker, retry=RetryPolicy(attempts=1))}))
    client = client_of(openai_wire, g)
    openai_wire.faults.always("chat", Fault(status=500))
    for _ in range(4):
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="m", messages=ASK, stream=True)
    assert deployment_breaker(client.chat.completions.create, "m").state is BreakerState.OPEN
    assert g.breaker("openai").state is BreakerState.CLOSED  # the stage's own: other models'
    with pytest.raises(ragguard.BreakerOpen):
        await client.chat.completions.create(model="m", messages=ASK, stream=True)
    assert openai_wire.faults.seen["chat"] == 4  # the open breaker sent nothing


async def test_with_the_default_policy_a_dead_provider_opens_the_breaker_after_ten_attempts(
    client_of: Any, openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    """A low-traffic LLM service with nothing configured: the generation stage (and the provider
    stages that start from it) judges its breaker once 10 calls are in its window, not after the
    generic breaker's 100, so a dead provider stops being called after a handful of requests."""
    g = Guard(sleep=sleeps)
    client = client_of(openai_wire, g)
    openai_wire.faults.always("chat", Fault(status=500))
    for _ in range(5):  # two attempts each (the standard generation stage's retry)
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="m", messages=ASK, stream=True)
    assert deployment_breaker(client.chat.completions.create, "m").state is BreakerState.OPEN
    with pytest.raises(ragguard.BreakerOpen):
        await client.chat.completions.create(model="m", messages=ASK, stream=True)
    assert openai_wire.faults.seen["chat"] == 10  # then nothing more reached the provider


def _small_breaker() -> Policy:
    breaker = BreakerPolicy(kind="generic", minimum_calls=4, window_size=4, open_for_s=60)
    retry = RetryPolicy(attempts=2, initial_backoff_s=0, jitter_s=0)
    return Policy(stages={"generation": StagePolicy(breaker=breaker, retry=retry)})


async def test_a_provider_whose_503s_always_state_a_wait_is_an_outage_and_opens_the_breaker(
    client_of: Any, openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    """A provider down behind a load balancer that adds Retry-After to every 503: each answer is a
    rejection (retried after its wait), and rejections that make the window's rejection rate
    (90% by default) open the breaker, as failures would."""
    g = Guard(_small_breaker(), sleep=sleeps)
    client = client_of(openai_wire, g)
    openai_wire.faults.always("chat", Fault(status=503, headers={"retry-after": "1"}))
    for _ in range(2):  # two calls, two attempts each: four rejections in a window of four
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="m", messages=ASK, stream=True)
    breaker = deployment_breaker(client.chat.completions.create, "m")
    assert breaker.state is BreakerState.OPEN
    assert breaker.metrics().rejected_calls == 4
    for _ in range(6):
        with pytest.raises(ragguard.BreakerOpen):
            await client.chat.completions.create(model="m", messages=ASK, stream=True)
    assert openai_wire.faults.seen["chat"] == 4  # not 16: the open breaker sent nothing more
    assert sleeps.waits == [1.0, 1.0]  # each retry waited what the provider said


async def test_a_429_only_throttles_and_never_opens_the_breaker(
    client_of: Any, openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    g = Guard(_small_breaker(), sleep=sleeps)
    client = client_of(openai_wire, g)
    openai_wire.faults.always("chat", Fault(status=429, headers={"retry-after": "1"}))
    for _ in range(8):
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="m", messages=ASK, stream=True)
    assert openai_wire.faults.seen["chat"] == 16
    breaker = deployment_breaker(client.chat.completions.create, "m")
    assert breaker.state is BreakerState.CLOSED and breaker.metrics().calls == 0


# -- tokens: reserved from the request, settled from the usage reported -------------------


async def test_a_stream_reserves_max_tokens_and_settles_the_usage_it_reports(
    client_of: Any, openai_wire: OpenAIWire
) -> None:
    openai_wire.completion_tokens = 40  # four short chunks, but the provider counts 40 tokens
    g = Guard(_policy())
    client = client_of(openai_wire, g)
    accounts = token_accounts(g)
    async with g.tenant("acme"):
        stream = await client.chat.completions.create(
            model="m", messages=ASK, stream=True, max_tokens=100, n=2
        )
        assert accounts.reserved("acme") == 200 + 1  # and "hi", one input token (characters / 4)
        chunks = [chunk async for chunk in stream]
    assert accounts.reserved("acme") == 0 and accounts.settled("acme") == 40 + 3  # the usage: output, input
    assert openai_wire.requests[-1]["json"]["stream_options"] == {"include_usage": True}
    assert all(chunk.choices for chunk in chunks)  # the usage chunk it asked for is not shown
    async with g.tenant("acme"):
        await client.chat.completions.create(model="m", messages=ASK)  # a whole completion
        given = await client.chat.completions.create(
            model="m", messages=ASK, stream=True, stream_options={"include_usage": True}
        )
        assert [c.usage.completion_tokens async for c in given if c.usage] == [40]  # asked for: shown
    assert accounts.settled("acme") == 3 * (40 + 3)


async def test_input_tokens_are_reserved_from_the_messages_and_settled_from_the_prompt_tokens(
    client_of: Any, openai_wire: OpenAIWire
) -> None:
    """The prompt is most of a RAG call's spend: its text is reserved from the input quota before
    the request (characters / 4), settled with the provider's ``prompt_tokens`` after, so a spent
    input quota refuses the next call before it is sent."""
    openai_wire.usage_prompt_tokens = 15  # what the provider counts (its own framing included)
    quota = TenantQuota(input_token_quota=30, token_window_s=3600)
    g = Guard(Policy(tenants={"acme": quota}))
    client = client_of(openai_wire, g)
    accounts = token_accounts(g)
    passages = [{"role": "system", "content": "p" * 20}, {"role": "user", "content": "q" * 20}]
    async with g.tenant("acme"):
        stream = await client.chat.completions.create(
            model="m", messages=passages, stream=True, max_tokens=8
        )
        assert accounts.reserved("acme") == 10 + 8  # the messages' 40 characters, and max_tokens
        assert await _text(stream) == "Hello from the wire"
        assert accounts.settled("acme") == 15 + 4
        await client.chat.completions.create(model="m", messages=passages, max_tokens=8)  # whole
        assert accounts.settled("acme") == 2 * (15 + 4)
        with pytest.raises(ragguard.QuotaExceeded) as refused:  # 30 of 30 input tokens spent
            await client.chat.completions.create(model="m", messages=passages, stream=True, max_tokens=8)
    assert refused.value.reason == "tokens"
    assert openai_wire.faults.seen["chat"] == 2  # refused before the request was sent
    assert accounts.reserved("acme") == 0


async def test_a_models_limits_apply_to_the_calls_of_that_model(
    client_of: Any, openai_wire: OpenAIWire
) -> None:
    """``TenantQuota.models`` (docs/generation.md's shape): the call's ``model`` names the model, so
    gpt-4o's own quota refuses a second gpt-4o call while another model's calls go on."""
    openai_wire.completion_tokens = 40
    gpt_4o = TokenLimits(token_quota=50, token_window_s=3600)
    quota = TenantQuota(token_quota=10_000, models={"gpt-4o": gpt_4o})
    g = Guard(Policy(tenants={"acme": quota}))
    client = client_of(openai_wire, g)
    accounts = token_accounts(g)
    async with g.tenant("acme"):
        await client.chat.completions.create(model="gpt-4o", messages=ASK, max_tokens=20)
        assert accounts.bucket_tat("acme", "m:gpt-4o:q:total") is not None
        with pytest.raises(ragguard.QuotaExceeded):  # 43 of gpt-4o's 50 spent: 20 + 1 do not fit
            await client.chat.completions.create(model="gpt-4o", messages=ASK, max_tokens=20, stream=True)
        for _ in range(3):  # another model: the tenant's own quota only
            await client.responses.create(model="gpt-4o-mini", input="hi", max_output_tokens=20)
    assert [r["json"]["model"] for r in openai_wire.requests] == ["gpt-4o"] + ["gpt-4o-mini"] * 3


async def test_the_responses_api_streams_under_the_budgets_and_settles_its_usage(
    client_of: Any, openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    openai_wire.completion_tokens = 25
    g = Guard(_policy(first_item_s=0.3), sleep=sleeps)
    client = client_of(openai_wire, g)
    openai_wire.faults.push("responses", Fault(stall_after=4, stall_s=5.0))  # the preamble, then silence
    async with g.tenant("acme"):
        stream = await client.responses.create(model="m", input="hi", stream=True, max_output_tokens=64)
        kinds = [event.type async for event in stream]
        whole = await client.responses.create(model="m", input="hi")
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert openai_wire.faults.seen["responses"] == 3  # the stalled one, then two that answered
    assert whole.output_text == "Hello from the wire"
    assert token_accounts(g).settled("acme") == 2 * (25 + 3)  # output and input tokens


async def test_an_error_event_of_the_responses_api_is_raised_and_retried(
    client_of: Any, openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(), sleep=sleeps)
    client = client_of(openai_wire, g)
    failed = {"type": "error", "code": "server_error", "message": "boom"}
    openai_wire.faults.push("responses", Fault(event=failed, event_after=2), times=3)
    with pytest.raises(openai.APIError) as caught:
        await client.responses.create(model="m", input="hi", stream=True)
    assert ragguard.outcomes.classify(caught.value).kind is ragguard.outcomes.Kind.FAILURE
    assert openai_wire.faults.seen["responses"] == 3


# -- the SDK's timeout, the tenant header, embeddings -------------------------------------


async def test_the_deadline_left_is_the_sdks_timeout_and_the_tenant_travels_as_a_header(
    client_of: Any,
    openai_wire: OpenAIWire,
) -> None:
    timeouts: list[Any] = []

    async def record(request: httpx2.Request) -> None:
        timeouts.append(request.extensions["timeout"]["read"])

    http = httpx2.AsyncClient(event_hooks={"request": [record]})
    g = Guard(_policy())
    client = client_of(openai_wire, g, tenant_header="x-tenant-id", sdk={"http_client": http})
    async with g.tenant("acme"), g.deadline(2.0):
        await client.chat.completions.create(model="m", messages=ASK)
    await client.chat.completions.create(model="m", messages=ASK)
    assert 1.5 < timeouts[0] <= 2.0 + 0.1  # the deadline's seconds left, plus the grace
    assert timeouts[1] == 600  # no deadline: the SDK's own default
    assert [r["headers"]["x-tenant-id"] for r in openai_wire.requests] == ["acme", "default"]


async def test_the_guards_tenant_header_reaches_every_wrapped_client_the_docs_fallback_included(
    client_of: Any, openai_wire: OpenAIWire, backup_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    """One Guard-wide setting: the docs' fallback client (``guard_openai`` with a stage of its own
    and no ``tenant_header``) sends it too, as do embeddings and the Responses API."""
    policy = Policy(stages={"generation_backup": StagePolicy(preset="generation")})
    g = Guard(policy, sleep=sleeps, tenant_header="x-tenant-id")
    backup = client_of(backup_wire, g, generation_stage="generation_backup")
    client = client_of(openai_wire, g, fallback=backup.chat.completions.create)
    async with g.tenant("acme"):
        await client.embeddings.create(model="e", input=["alpha"])
        await client.responses.create(model="m", input="hi")
        openai_wire.faults.always("chat", Fault(status=503))
        stream = await client.chat.completions.create(model="m", messages=ASK, stream=True)
        assert await _text(stream) == "Backup answer"
        assert ragguard.degraded() == ("generation_backup",)  # the fallback client, by its stage
    sent = [r["headers"].get("x-tenant-id") for r in openai_wire.requests + backup_wire.requests]
    assert sent == ["acme"] * 5  # embeddings, responses, two chat attempts, the backup


async def test_a_short_deadline_ends_the_call_as_the_deadline_and_is_not_counted(
    client_of: Any,
    openai_wire: OpenAIWire,
) -> None:
    g = Guard(_policy())
    client = client_of(openai_wire, g)
    openai_wire.faults.push("chat", Fault(delay_s=2.0))
    with pytest.raises(ragguard.DeadlineExceeded):
        async with g.deadline(0.2):
            await client.chat.completions.create(model="m", messages=ASK)
    breaker = deployment_breaker(client.chat.completions.create, "m")
    assert breaker.state is BreakerState.CLOSED and breaker.metrics().calls == 0


async def test_a_stream_cut_mid_stream_by_the_deadline_reports_the_requests_budget(
    client_of: Any, openai_wire: OpenAIWire
) -> None:
    """Not what was left at the last item (0.09 s of a 0.7 s request, as the issue saw it)."""
    g = Guard(_policy())
    client = client_of(openai_wire, g)
    openai_wire.faults.push("chat", Fault(stall_after=3, stall_s=5.0))  # role chunk, two tokens
    got = []
    with pytest.raises(ragguard.DeadlineExceeded) as cut:
        async with g.deadline(0.4):
            stream = await client.chat.completions.create(model="m", messages=ASK, stream=True)
            async for chunk in stream:
                got.append(chunk.choices[0].delta.content)
    assert got == ["", "Hello", " from"] and cut.value.items == 3
    assert cut.value.budget_s == cut.value.deadline_s == 0.4
    said = "after a budget of 0.400s (the request's deadline, set by the handler): stream cut after 3 items"
    assert said in str(cut.value)
    assert g.breaker("generation").state is BreakerState.CLOSED  # the caller's budget: not counted


async def test_embeddings_fall_back_to_the_stage_cache_when_the_provider_fails(
    client_of: Any, openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    g = Guard(sleep=sleeps)  # the standard embedding stage: two attempts, its cache
    client = client_of(openai_wire, g)
    first = await client.embeddings.create(model="m", input=["alpha", "beta"])
    openai_wire.faults.always("embeddings", Fault(status=503))
    again = await client.embeddings.create(model="m", input=["beta", "alpha"])
    assert [d.embedding for d in again.data] == [first.data[1].embedding, first.data[0].embedding]
    assert "embedding_cache" in ragguard.degraded()
    with pytest.raises(openai.InternalServerError):  # another model's vectors are not these
        await client.embeddings.create(model="other", input=["alpha"])
    assert openai_wire.faults.seen["embeddings"] == 1 + 2 + 2


async def test_an_embedding_429_waits_its_retry_after_ms(
    client_of: Any, openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    g = Guard(sleep=sleeps)
    client = client_of(openai_wire, g)
    openai_wire.faults.push("embeddings", Fault(status=429, headers={"retry-after-ms": "750"}))
    got = await client.embeddings.create(model="m", input="gamma")
    assert got.data[0].embedding == [5.0, 0.5, 0.25]
    assert 0.75 in sleeps.waits


# -- the client goes away from the front door ---------------------------------------------


async def test_a_client_leaving_the_front_door_cancels_the_upstream_stream(
    client_of: Any, openai_wire: OpenAIWire
) -> None:
    g = Guard(_policy())
    client = client_of(openai_wire, g)
    openai_wire.faults.push("chat", Fault(stall_after=3, stall_s=10.0))

    async def open_answer() -> Any:
        return await client.chat.completions.create(model="m", messages=ASK, stream=True, max_tokens=50)

    app = streaming_app(g, open_answer, lambda chunk: chunk.choices[0].delta.content or "")
    with serving(app) as (url, _):
        first = await leave_after_first_chunk(url)
        await eventually(lambda: openai_wire.stream_ends == ["closed"])  # long before the 10 s stall ends
        await eventually(lambda: token_accounts(g).open_streams("acme") == 0)
    assert first.startswith(b"Hello")
    assert token_accounts(g).reserved("acme") == 0


# -- the generation preset's usage= option, which the wrappers use --------------------------


def test_usage_must_be_a_function_of_a_stream() -> None:
    g = Guard()
    with pytest.raises(ragguard.ConfigError, match="usage"):

        @g.guard("generation", usage=5)
        async def stream() -> Any:
            yield "a"

    with pytest.raises(ragguard.ConfigError, match="usage"):

        @g.guard("generation", usage=lambda item: None)
        async def whole() -> str:
            return "a"


async def test_a_usage_report_below_the_count_gives_the_pacing_back() -> None:
    clock = ragguard.FakeClock()  # auto-advance: a pacing wait moves the clock by itself
    policy = Policy(tenants={"acme": TenantQuota(tokens_per_s=10, token_burst=1, token_quota=1000)})
    g = Guard(policy, clock=clock)

    @g.guard("generation", tokens=lambda item: 5, usage=lambda item: 1 if item == "usage" else None)
    async def answer() -> Any:
        yield "a"
        yield "b"
        yield "usage"

    async with g.tenant("acme"):
        start = clock()
        assert [item async for item in answer()] == ["a", "b", "usage"]
        paced = clock() - start
        assert token_accounts(g).settled("acme") == 1  # the report replaced the 10 counted
        again = clock()
        assert [item async for item in answer()] == ["a", "b", "usage"]
        repaced = clock() - again
    # 5 + 5 tokens paced at 10/s past a burst of 1: waits of 0.4 s and 0.5 s; the report of 1 gives
    # 9 tokens of pacing back, so the next stream starts as unpaced as the first (kept: 1.0 s)
    assert paced == pytest.approx(0.9, abs=1e-6)
    assert repaced == pytest.approx(0.9, abs=1e-6)


async def test_with_options_keeps_the_client_guarded_and_without_sdk_retries(
    client_of: Any, openai_wire: OpenAIWire, sleeps: Sleeps, closing: list[Any]
) -> None:
    g = Guard(_policy(), sleep=sleeps)
    client = client_of(openai_wire, g).with_options(max_retries=5, default_headers={"x-team": "blue"})
    closing.append(client.client)
    openai_wire.faults.always("chat", Fault(status=503))
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="m", messages=ASK, stream=True)
    assert openai_wire.faults.seen["chat"] == 3  # the stage's three attempts: max_retries=5 is not the SDK's
    assert openai_wire.requests[-1]["headers"]["x-team"] == "blue"
