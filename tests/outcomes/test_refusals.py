"""The refusals a stage may route, as each provider says them: the real openai and anthropic SDKs
and httpx against the wire servers of tests/wire, which answer as OpenAI, vLLM, TGI and Anthropic
do (their bodies and statuses read from their sources: see tests/wire/openai_api.py). Each is a
caller's error (never counted, never retried) with the reason ``context_length`` or
``content_policy``, and :func:`context_overflow` reads the figures a context-length refusal
states."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest

from ragguard import BreakerPolicy, Guard, Policy, RetryPolicy, StagePolicy
from ragguard.breakers import BreakerState
from ragguard.outcomes import CONTENT_POLICY, CONTEXT_LENGTH, Kind, classify, context_overflow
from ragguard.outcomes._doors import door_answer
from wire import (
    CONTENT_BLOCKED,
    AnthropicWire,
    Fault,
    OpenAIWire,
    anthropic_error,
    openai_error,
    prompt_tokens,
)

pytestmark = pytest.mark.anyio

LONG = [{"role": "user", "content": "x" * 400}]  # 104 tokens as the wire counts them
SHORT = [{"role": "user", "content": "hi"}]


async def _raised(awaitable: Any) -> BaseException:
    """The exception ``awaitable`` raised (the test fails when it raised none)."""
    with pytest.raises(Exception) as info:
        await awaitable
    return info.value


async def _streamed(client: openai.AsyncOpenAI, model: str, **extra: Any) -> BaseException:
    """The error a chat stream raises, at ``create`` or while it is read."""
    try:
        stream = await client.chat.completions.create(model=model, messages=LONG, stream=True, **extra)  # type: ignore[arg-type]
        async for _ in stream:
            pass
    except Exception as exc:
        return exc
    raise AssertionError("the stream raised nothing")


def _refusal(exc: BaseException, reason: str) -> None:
    outcome = classify(exc)
    assert outcome.kind is Kind.CALLER_ERROR and outcome.reason == reason, (outcome, exc)
    assert not outcome.counts_as_outage and not outcome.from_dependency


# -- context length -------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["openai", "vllm", "tgi"])
async def test_a_context_length_refusal_of_openai_vllm_and_tgi_through_the_openai_sdk(dialect: str) -> None:
    wire = OpenAIWire(context_limits={"small": 50}, dialect=dialect)  # type: ignore[arg-type]
    prompt = prompt_tokens({"messages": LONG})
    with wire.running() as url:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as client:
            whole = await _raised(client.chat.completions.create(model="small", messages=LONG, max_tokens=20))  # type: ignore[arg-type]
            streamed = await _streamed(client, "small", max_tokens=20)
            fits = await client.chat.completions.create(model="small", messages=SHORT, max_tokens=20)  # type: ignore[arg-type]
    assert fits.choices[0].message.content
    status = {"openai": 400, "vllm": 400, "tgi": 422}[dialect]
    assert isinstance(whole, openai.APIStatusError) and whole.status_code == status
    asked = prompt if dialect == "vllm" else prompt + 20  # vLLM states the input alone
    for err in (whole, streamed):
        _refusal(err, CONTEXT_LENGTH)
        assert context_overflow(err) == (50, asked), err
    if dialect == "tgi":  # a 200 stream whose error event is a string: the SDK's bare APIError
        assert type(streamed) is openai.APIError and isinstance(streamed.body, str)
    else:
        assert isinstance(streamed, openai.BadRequestError)


@pytest.mark.parametrize("dialect", ["vllm", "tgi"])
async def test_a_context_length_refusal_of_vllm_and_tgi_through_httpx(dialect: str) -> None:
    wire = OpenAIWire(context_limits={"small": 50}, dialect=dialect)  # type: ignore[arg-type]
    body = {"model": "small", "messages": LONG, "max_tokens": 20}
    with wire.running() as url:
        async with httpx.AsyncClient(base_url=url) as http:
            reply = await http.post("/v1/chat/completions", json=body)
            err = await _raised(_raise_for_status(reply))
            async with http.stream("POST", "/v1/chat/completions", json=body) as unread:
                not_read = await _raised(_raise_for_status(unread))
    assert isinstance(err, httpx.HTTPStatusError)
    _refusal(err, CONTEXT_LENGTH)
    assert context_overflow(err) is not None
    # a body nobody read is not read by the classifier: a caller's error, its reason unknown
    outcome = classify(not_read)
    assert outcome.kind is Kind.CALLER_ERROR and outcome.reason == "request"
    assert not unread.is_stream_consumed


async def _raise_for_status(reply: httpx.Response) -> None:
    reply.raise_for_status()


async def test_anthropic_prompt_too_long_through_the_sdk() -> None:
    wire = AnthropicWire(context_limits={"claude-small": 50})
    prompt = prompt_tokens({"messages": LONG})
    with wire.running() as url:
        async with anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as client:
            whole = await _raised(client.messages.create(model="claude-small", max_tokens=8, messages=LONG))  # type: ignore[arg-type]
            streamed = await _raised(
                client.messages.create(model="claude-small", max_tokens=8, messages=LONG, stream=True)
            )  # type: ignore[arg-type]
            fits = await client.messages.create(model="claude-small", max_tokens=8, messages=SHORT)  # type: ignore[arg-type]
    assert fits.content
    for err in (whole, streamed):
        assert isinstance(err, anthropic.BadRequestError)
        _refusal(err, CONTEXT_LENGTH)
        assert context_overflow(err) == (50, prompt)


# -- content policy ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, message",
    [
        ("content_filter", "The response was filtered due to the prompt triggering Azure OpenAI's content "
                           "management policy. Please modify your prompt and retry."),
        ("content_policy_violation", "Your request was rejected as a result of our safety system."),
        ("invalid_prompt", "Invalid prompt: your prompt was flagged as potentially violating our usage "
                           "policy."),
    ],
)  # fmt: skip
async def test_openai_content_policy_refusals(code: str, message: str) -> None:
    wire = OpenAIWire()
    with wire.running() as url:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as client:
            wire.faults.push("chat", Fault(status=400, body=openai_error(400, code=code, message=message)))
            whole = await _raised(client.chat.completions.create(model="m", messages=SHORT))  # type: ignore[arg-type]
            wire.faults.push("chat", Fault(status=400, body=openai_error(400, code=code, message=message)))
            streamed = await _raised(client.chat.completions.create(model="m", messages=SHORT, stream=True))  # type: ignore[arg-type]
    for err in (whole, streamed):
        assert isinstance(err, openai.BadRequestError)
        _refusal(err, CONTENT_POLICY)
        assert context_overflow(err) is None


async def test_a_completion_the_content_filter_stopped_is_a_content_policy_refusal_of_parse() -> None:
    wire = OpenAIWire()
    wire.finish_reason = "content_filter"
    with wire.running() as url:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as client:
            err = await _raised(client.chat.completions.parse(model="m", messages=SHORT))  # type: ignore[arg-type]
            wire.finish_reason = "length"  # the answer hit max_tokens: not the context window
            length = await _raised(client.chat.completions.parse(model="m", messages=SHORT))  # type: ignore[arg-type]
    assert isinstance(err, openai.ContentFilterFinishReasonError)
    _refusal(err, CONTENT_POLICY)
    assert isinstance(length, openai.LengthFinishReasonError)
    assert classify(length).reason == "request"


async def test_anthropic_output_blocked_by_its_content_filtering_policy() -> None:
    wire = AnthropicWire()
    with wire.running() as url:
        async with anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as client:
            wire.faults.push(
                "messages", Fault(status=400, body=anthropic_error(400, message=CONTENT_BLOCKED["message"]))
            )
            whole = await _raised(client.messages.create(model="x", max_tokens=8, messages=SHORT))  # type: ignore[arg-type]
            # inside a stream that began with HTTP 200, before the first text (message_start,
            # content_block_start and ping went first)
            wire.faults.push("messages", Fault(event=CONTENT_BLOCKED, event_after=3))
            stream = await client.messages.create(model="x", max_tokens=8, messages=SHORT, stream=True)  # type: ignore[arg-type]
            streamed = await _raised(_drain(stream))
    assert isinstance(whole, anthropic.BadRequestError)
    assert isinstance(streamed, anthropic.APIStatusError)
    for err in (whole, streamed):
        _refusal(err, CONTENT_POLICY)


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass


# -- what is not a refusal ----------------------------------------------------------------------


async def test_other_caller_errors_keep_their_reasons() -> None:
    wire = OpenAIWire()
    with wire.running() as url:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as client:
            invalid = openai_error(400, code="invalid_value", message="Invalid value for temperature")
            wire.faults.push("chat", Fault(status=400, body=invalid))
            bad = await _raised(client.chat.completions.create(model="m", messages=SHORT))  # type: ignore[arg-type]
            # a 403 worded like a policy is the account's, not a refusal of this request
            wire.faults.push(
                "chat", Fault(status=403, body=openai_error(403, message="violates our usage policy"))
            )
            denied = await _raised(client.chat.completions.create(model="m", messages=SHORT))  # type: ignore[arg-type]
            wire.faults.push(
                "chat", Fault(status=500, body=openai_error(500, message="maximum context length"))
            )
            failed = await _raised(client.chat.completions.create(model="m", messages=SHORT))  # type: ignore[arg-type]
    assert classify(bad).reason == "request"
    assert classify(denied).reason == "auth"
    assert classify(failed).kind is Kind.FAILURE


def test_a_local_models_value_error_and_litellm_names() -> None:
    local = ValueError("Requested tokens (5000) exceed context window of 4096")  # llama-cpp-python
    _refusal(local, CONTEXT_LENGTH)
    assert context_overflow(local) == (4096, 5000)
    assert classify(ValueError("bad temperature")).reason == "input"
    for name, reason in (
        ("ContextWindowExceededError", CONTEXT_LENGTH),
        ("ContentPolicyViolationError", CONTENT_POLICY),
    ):
        litellm_error = type(name, (Exception,), {"__module__": "litellm.exceptions"})("refused")
        _refusal(litellm_error, reason)


@pytest.mark.parametrize(
    "said, figures",
    [
        ("This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 "
         "tokens.",
         (8192, 9000)),
        ("'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is "
         "4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778).", (4096, 10778)),
        ("input length and `max_tokens` exceed context limit: 198000 + 21333 > 200000, decrease input length",
         (200000, 219333)),
        ("Input validation error: `inputs` must have less than 4096 tokens. Given: 5000", (4096, 5000)),
        ("the request exceeds the available context size, {'n_prompt_tokens': 5000, 'n_ctx': 4096}",
         (4096, 5000)),
        ("The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
         (1048576, 1200000)),
        ("This model's maximum context length is 8192 tokens.", None),       # no size stated
        ("prompt is too long: 100 tokens > 200 maximum", None),               # figures that do not overflow
    ],
)  # fmt: skip
def test_the_figures_a_refusal_states(said: str, figures: tuple[int, int] | None) -> None:
    assert context_overflow(ValueError(said)) == figures


async def test_refusals_never_open_a_breaker_nor_are_retried() -> None:
    breaker = BreakerPolicy(kind="generic", minimum_calls=3, window_size=3)
    g = Guard(Policy(stages={"llm": StagePolicy(breaker=breaker, retry=RetryPolicy(attempts=3))}))
    wire = OpenAIWire(context_limits={"small": 50})
    policy_refusal = openai_error(400, code="content_filter", message="content management policy")
    with wire.running() as url:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as client:

            @g.guard("llm")
            async def answer(messages: list[dict[str, str]]) -> Any:
                return await client.chat.completions.create(model="small", messages=messages)  # type: ignore[arg-type]

            for _ in range(4):
                assert classify(await _raised(answer(LONG))).reason == CONTEXT_LENGTH
                wire.faults.push("chat", Fault(status=400, body=policy_refusal))
                assert classify(await _raised(answer(SHORT))).reason == CONTENT_POLICY
            assert wire.faults.seen["chat"] == 8  # one request per call: none retried
            assert g.breaker("llm").state is BreakerState.CLOSED
            assert (await answer(SHORT)).choices[0].message.content


def test_both_doors_answer_an_unrouted_refusal_400_naming_it() -> None:
    for said, words in (
        (ValueError("Requested tokens (5000) exceed context window of 4096"), "context window"),
        (ValueError("the model declined under its content policy"), "content policy"),
    ):
        answer, wait, detail = door_answer(said, classify(said)) or (None, None, "")
        assert answer is not None and (answer.http_status, answer.grpc_code) == (400, "INVALID_ARGUMENT")
        assert wait is None and words in detail and "dependency" in detail
