"""GuardedRunnable and TenantRateLimiter with langchain-core's own machinery (a ``BaseChatModel``
whose requests go through the real ``openai`` SDK, retries off, to the OpenAI wire server): a
provider failing, a fallback Runnable that keeps streaming, Retry-After, stalls before the first
token and mid-stream, usage-settled tokens, ``abatch``, the rate limiter, and a client leaving the
front door."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from _door import Sleeps, eventually, leave_after_first_chunk, streaming_app
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableLambda

import ragguard
from ragguard import (
    FakeClock,
    GenerationPolicy,
    Guard,
    Policy,
    RetryPolicy,
    StagePolicy,
    TenantQuota,
    TokenLimits,
)
from ragguard.integrations.langchain import GuardedRunnable, TenantRateLimiter
from ragguard.rag import token_accounts
from wire import Fault, OpenAIWire, serving

pytestmark = pytest.mark.anyio


class WireChat(BaseChatModel):
    """A chat model of langchain-core calling the OpenAI wire server with the real SDK (what
    langchain-openai's ChatOpenAI does, without that package): content chunks, then the usage;
    its ``model_name``, and the ``extra_headers`` a call passes, go to the SDK as ChatOpenAI's
    do (it has ``default_headers`` as ChatOpenAI has)."""

    base_url: str
    model_name: str = "m"
    default_headers: dict[str, str] | None = None

    @property
    def _llm_type(self) -> str:
        return "wire"

    def _sdk(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key="k", max_retries=0)

    def _generate(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        raise NotImplementedError

    async def _agenerate(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        async with self._sdk() as sdk:
            done = await sdk.chat.completions.create(
                model=self.model_name,
                messages=[{"role": "user", "content": "hi"}],
                extra_headers=kwargs.get("extra_headers"),
            )
        message = AIMessage(content=done.choices[0].message.content or "")
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _astream(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        async with self._sdk() as sdk:
            stream = await sdk.chat.completions.create(
                model=self.model_name,
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
                extra_headers=kwargs.get("extra_headers"),
            )
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = {
                        "input_tokens": chunk.usage.prompt_tokens,
                        "output_tokens": chunk.usage.completion_tokens,
                        "total_tokens": chunk.usage.total_tokens,
                    }
                    yield ChatGenerationChunk(message=AIMessageChunk(content="", usage_metadata=usage))
                elif chunk.choices:
                    yield ChatGenerationChunk(
                        message=AIMessageChunk(content=chunk.choices[0].delta.content or "")
                    )


def _policy(**generation: Any) -> Policy:
    stage = StagePolicy(
        retry=RetryPolicy(attempts=3, initial_backoff_s=0, jitter_s=0),
        generation=GenerationPolicy(**generation) if generation else GenerationPolicy(),
    )
    return Policy(stages={"generation": stage}, tenants={"acme": TenantQuota(token_quota=10_000)})


async def _text(runnable: Any) -> str:
    return "".join([chunk.content async for chunk in runnable.astream("hi")])


async def test_a_failing_model_is_retried_by_the_stage_and_raises_the_sdks_error(
    openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(), sleep=sleeps)
    model = GuardedRunnable(WireChat(base_url=openai_wire.url), "generation", guard=g)
    openai_wire.faults.always("chat", Fault(status=503))
    with pytest.raises(openai.InternalServerError):
        await _text(model)
    assert openai_wire.faults.seen["chat"] == 3
    with pytest.raises(openai.InternalServerError):
        await model.ainvoke("hi")
    assert openai_wire.faults.seen["chat"] == 6


async def test_a_fallback_runnable_keeps_the_stream_going(
    openai_wire: OpenAIWire, backup_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(), sleep=sleeps)
    backup = WireChat(base_url=backup_wire.url, model_name="gpt-4o-mini")
    primary = WireChat(base_url=openai_wire.url, model_name="gpt-4o")
    chain = GuardedRunnable(primary, "generation", guard=g, fallback=backup)
    openai_wire.faults.always("chat", Fault(status=503))
    assert await _text(chain) == "Backup answer"
    assert (await chain.ainvoke("hi")).content == "Backup answer"
    # a fallback of the same class as the model it stands in for: named by its model
    assert ragguard.degraded() == ("WireChat(gpt-4o-mini)",)
    piped = chain | RunnableLambda(lambda message: message.content.upper())  # composes as a Runnable
    assert await piped.ainvoke("hi") == "BACKUP ANSWER"


async def test_a_429_is_retried_after_its_retry_after(openai_wire: OpenAIWire, sleeps: Sleeps) -> None:
    g = Guard(_policy(), sleep=sleeps)
    model = GuardedRunnable(WireChat(base_url=openai_wire.url), "generation", guard=g)
    openai_wire.faults.push("chat", Fault(status=429, headers={"retry-after": "4"}))
    assert await _text(model) == "Hello from the wire"
    assert 4.0 in sleeps.waits and openai_wire.faults.seen["chat"] == 2


async def test_a_stall_after_the_role_chunk_is_cut_by_the_first_item_budget_and_retried(
    openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(first_item_s=0.3), sleep=sleeps)
    model = GuardedRunnable(WireChat(base_url=openai_wire.url), "generation", guard=g)
    openai_wire.faults.push("chat", Fault(stall_after=1, stall_s=5.0))
    assert await _text(model) == "Hello from the wire"
    assert openai_wire.faults.seen["chat"] == 2


async def test_a_stall_mid_stream_ends_it_with_the_idle_budget(
    openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(idle_s=0.3), sleep=sleeps)
    model = GuardedRunnable(WireChat(base_url=openai_wire.url), "generation", guard=g)
    openai_wire.faults.push("chat", Fault(stall_after=3, stall_s=5.0))
    got = []
    with pytest.raises(ragguard.StreamTimeout) as caught:
        async for chunk in model.astream("hi"):
            got.append(chunk.content)
    assert caught.value.budget == "idle" and got == ["", "Hello", " from"]
    assert openai_wire.faults.seen["chat"] == 1


async def test_the_usage_metadata_settles_the_streams_tokens(openai_wire: OpenAIWire) -> None:
    openai_wire.completion_tokens, openai_wire.usage_prompt_tokens = 33, 12
    g = Guard(_policy())
    model = GuardedRunnable(WireChat(base_url=openai_wire.url), "generation", guard=g, estimate=100)
    async with g.tenant("acme"):
        stream = model.astream([HumanMessage("q" * 40)])
        first = await anext(stream)
        assert token_accounts(g).reserved("acme") == 100 + 10  # the estimate, the input's text / 4
        assert first.content + "".join([c.content async for c in stream]) == "Hello from the wire"
    assert token_accounts(g).settled("acme") == 33 + 12  # usage_metadata: output and input
    assert token_accounts(g).reserved("acme") == 0


async def test_the_chat_models_limits_apply_and_a_spent_input_quota_refuses_before_the_request(
    openai_wire: OpenAIWire,
) -> None:
    openai_wire.usage_prompt_tokens = 20
    limits = TokenLimits(input_token_quota=40, token_window_s=3600)
    g = Guard(Policy(tenants={"acme": TenantQuota(models={"gpt-4o": limits})}))
    big = GuardedRunnable(WireChat(base_url=openai_wire.url, model_name="gpt-4o"), "generation", guard=g)
    mini = WireChat(base_url=openai_wire.url, model_name="gpt-4o-mini")
    small = GuardedRunnable(mini, "generation", guard=g)
    async with g.tenant("acme"):
        assert await _text(big) == await _text(big) == "Hello from the wire"
        with pytest.raises(ragguard.QuotaExceeded):  # gpt-4o's 40 input tokens are spent
            await _text(big)
        assert await _text(small) == "Hello from the wire"  # its own model: the tenant's limits only
    assert [r["json"]["model"] for r in openai_wire.requests] == ["gpt-4o"] * 2 + ["gpt-4o-mini"]


async def test_the_guards_tenant_header_reaches_the_chat_model_and_its_fallback(
    openai_wire: OpenAIWire, backup_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(), sleep=sleeps, tenant_header="X-Tenant-Id")
    backup = WireChat(base_url=backup_wire.url)
    model = GuardedRunnable(WireChat(base_url=openai_wire.url), "generation", guard=g, fallback=backup)
    async with g.tenant("acme"):
        assert await _text(model) == "Hello from the wire"
        openai_wire.faults.always("chat", Fault(status=503))
        assert await _text(model) == "Backup answer"
        assert (await model.ainvoke("hi")).content == "Backup answer"
    sent = [r["headers"].get("x-tenant-id") for r in openai_wire.requests + backup_wire.requests]
    assert sent == ["acme"] * len(sent) and len(sent) == 1 + (3 + 1) * 2  # three attempts, the backup


async def test_abatch_guards_each_input_on_its_own(openai_wire: OpenAIWire, sleeps: Sleeps) -> None:
    g = Guard(_policy(), sleep=sleeps)
    model = GuardedRunnable(WireChat(base_url=openai_wire.url), "generation", guard=g)
    openai_wire.faults.push("chat", Fault(status=503))  # one input's first attempt fails
    answers = await model.abatch(["a", "b", "c"])
    assert [a.content for a in answers] == ["Hello from the wire"] * 3
    assert openai_wire.faults.seen["chat"] == 4
    openai_wire.faults.always("chat", Fault(status=400))  # a caller's error: not retried
    failed = await model.abatch(["a", "b"], return_exceptions=True)
    assert all(isinstance(f, openai.BadRequestError) for f in failed)
    assert openai_wire.faults.seen["chat"] == 6
    with pytest.raises(TypeError, match="async only"):
        model.invoke("hi")


async def test_the_rate_limiter_takes_each_model_request_from_the_tenants_rate(
    openai_wire: OpenAIWire,
) -> None:
    clock = FakeClock()
    policy = Policy(tenants={"acme": TenantQuota(rate_per_s=1, burst=1, max_wait_s=0.0)})
    g = Guard(policy, clock=clock)
    limiter = TenantRateLimiter(guard=g)
    model = WireChat(base_url=openai_wire.url, rate_limiter=limiter)
    async with g.tenant("acme"):
        assert (await model.ainvoke("hi")).content == "Hello from the wire"
        with pytest.raises(ragguard.QuotaExceeded) as caught:
            await model.ainvoke("hi")  # refused by LangChain's own call of the limiter
        assert caught.value.reason == "rate" and caught.value.retry_after_s == pytest.approx(1.0)
        assert await limiter.aacquire(blocking=False) is False
        assert limiter.acquire(blocking=False) is False
    assert openai_wire.faults.seen["chat"] == 1  # the refused request never left
    assert await limiter.aacquire(blocking=False) is True  # another tenant ("default"): unlimited


async def test_the_rate_limiter_waits_its_turn_up_to_max_wait_s(openai_wire: OpenAIWire) -> None:
    clock = FakeClock()  # auto-advance: a wait moves the clock by itself
    g = Guard(Policy(tenants={"acme": TenantQuota(rate_per_s=2, burst=1, max_wait_s=1.0)}), clock=clock)
    limiter = TenantRateLimiter(guard=g)
    async with g.tenant("acme"):
        start = clock()
        for _ in range(3):
            assert await limiter.aacquire() is True
        assert clock() - start == pytest.approx(1.0)  # two waits of 0.5 s, first come first served


async def test_a_client_leaving_the_front_door_cancels_the_runnables_stream(openai_wire: OpenAIWire) -> None:
    g = Guard(_policy())
    model = GuardedRunnable(WireChat(base_url=openai_wire.url), "generation", guard=g)
    openai_wire.faults.push("chat", Fault(stall_after=3, stall_s=10.0))

    async def open_answer() -> Any:
        return model.astream("hi")

    with serving(streaming_app(g, open_answer, lambda chunk: chunk.content)) as (url, _):
        first = await leave_after_first_chunk(url)
        await eventually(lambda: openai_wire.stream_ends == ["closed"])
        await eventually(lambda: token_accounts(g).open_streams("acme") == 0)
    assert b"Hello" in first


async def test_a_fallback_may_be_a_callable_of_the_input(openai_wire: OpenAIWire, sleeps: Sleeps) -> None:
    g = Guard(_policy(), sleep=sleeps)

    def canned(question: str) -> AIMessageChunk:
        return AIMessageChunk(content=f"no model for {question!r}")

    model = GuardedRunnable(WireChat(base_url=openai_wire.url), "generation", guard=g, fallback=canned)
    openai_wire.faults.always("chat", Fault(status=503))
    assert await _text(model) == "no model for 'hi'"
    assert (await model.ainvoke("hi")).content == "no model for 'hi'"
    assert "canned" in ragguard.degraded()


async def test_a_lambda_fallback_goes_by_the_name_it_is_given(
    openai_wire: OpenAIWire, sleeps: Sleeps
) -> None:
    g = Guard(_policy(), sleep=sleeps)
    canned = ragguard.named("canned answer", lambda question: AIMessageChunk(content="sorry"))
    model = GuardedRunnable(WireChat(base_url=openai_wire.url), "generation", guard=g, fallback=canned)
    openai_wire.faults.always("chat", Fault(status=503))
    async with g.tenant("acme"):
        assert await _text(model) == "sorry"
        assert ragguard.degraded() == ("canned answer",)  # not "<lambda>"
    with pytest.raises(ragguard.ConfigError, match="name"):
        ragguard.named("", canned)
    with pytest.raises(ragguard.ConfigError, match="callable"):
        ragguard.named("x", "not a function")  # type: ignore[type-var]


def test_the_sync_rate_limiter_sleeps_its_turn_then_refuses_past_max_wait_s() -> None:
    import time

    g = Guard(Policy(tenants={"default": TenantQuota(rate_per_s=20, burst=1, max_wait_s=0.2)}))
    limiter = TenantRateLimiter(guard=g)
    start = time.monotonic()
    assert limiter.acquire() is True
    assert limiter.acquire() is True  # waited for the next token: 1/20 s
    assert time.monotonic() - start >= 0.04
    slow = TenantRateLimiter(
        guard=Guard(Policy(tenants={"default": TenantQuota(rate_per_s=1, max_wait_s=0.2)}))
    )
    assert slow.acquire() is True
    with pytest.raises(ragguard.QuotaExceeded):
        slow.acquire()  # the next token is a second away: more than max_wait_s
