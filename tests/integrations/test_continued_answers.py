"""Answers that finish: a stream the model cuts after N tokens (a stall, a reset, an overload
error inside the stream) goes on with its continuation, through the real ``openai`` and
``anthropic`` SDKs against the wire servers, called directly and through both front doors (an
SSE app behind RagguardMiddleware served by uvicorn; a grpc.aio server with the interceptor and a
grpcio client): the joined text is the whole answer, no word twice and none missing, and the
client is told the stream's typed ending. Without a continuation the same cut ends
``incomplete``; a whole answer ends ``completed``. A client that leaves during the continuation
leaves nothing held (tenant slot, token reservations, upstream streams)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import grpc
import httpx
import openai
import pytest
from _door import eventually
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from grpc import aio

import ragguard
from ragguard import GenerationPolicy, Guard, Policy, RetryPolicy, StagePolicy, TenantQuota
from ragguard.asgi import SSE_ENDING_EVENT, SSE_ERROR_EVENT, RagguardMiddleware
from ragguard.events import StreamSettled
from ragguard.grpc import (
    STREAM_AFTER_KEY,
    STREAM_BY_KEY,
    STREAM_ENDING_KEY,
    STREAM_ERROR_KEY,
    STREAM_ITEMS_KEY,
    GuardServerInterceptor,
)
from ragguard.integrations.anthropic import continue_message, guard_anthropic, prefill_messages
from ragguard.integrations.openai import (
    CONTINUE_INSTRUCTION,
    continuation_messages,
    continue_chat,
    guard_openai,
)
from ragguard.rag import Partial, token_accounts
from ragguard.testing import EventRecorder
from wire import OVERLOADED, AnthropicWire, Fault, HttpWire, OpenAIWire, serving

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

WORDS = ("w00", *(f" w{i:02d}" for i in range(1, 12)))
ANSWER = "".join(WORDS)
CUT = 4  # tokens the model sends before it fails
ASK = [{"role": "user", "content": "why?"}]
SERVICE = "ragguard.test.Answers"


def _policy(idle_s: float = 0.3) -> Policy:
    generation = GenerationPolicy(first_item_s=2.0, idle_s=idle_s, total_s=60.0, estimate_tokens=50)
    stage = StagePolicy(retry=RetryPolicy(attempts=2, initial_backoff_s=0, jitter_s=0), generation=generation)
    return Policy(
        stages={"generation": stage, "backup": StagePolicy(preset="generation", generation=generation)},
        tenants={"acme": TenantQuota(token_quota=10_000, max_concurrency=4)},
    )


class Sdk:
    """One SDK under test: its wire server, how to wrap a client of it, open an answer and read
    an event's text, and what its in-stream overload error is."""

    def __init__(self, name: str, wire: HttpWire) -> None:
        self.name = name
        self.wire = wire
        self.opened: list[Any] = []  # raw clients and wrappers, closed after the test
        self.continuation = "continue_chat" if name == "openai" else "continue_message"
        # the events the caller gets before the first token: OpenAI's role chunk; Anthropic's
        # message_start and content_block_start (the SDK keeps its ping to itself)
        self.preamble = 1 if name == "openai" else 2
        # an overload error event inside a stream that began with HTTP 200
        self.overloaded = (
            OVERLOADED
            if name == "anthropic"
            else {"type": "server_error", "code": "overloaded", "message": "busy"}
        )
        self.error = "APIStatusError" if name == "anthropic" else "APIError"  # what the SDK raises for it

    def client(self, g: Guard, *, wire: HttpWire | None = None, own: bool = False, **options: Any) -> Any:
        """A wrapped client of ``wire`` (default the SDK's), closed after the test unless ``own``
        (the caller closes it: a client made on another event loop)."""
        wire = wire or self.wire
        if self.name == "openai":
            raw: Any = openai.AsyncOpenAI(base_url=f"{wire.url}/v1", api_key="k")
            guarded = guard_openai(raw, guard=g, **options)
        else:
            raw = anthropic.AsyncAnthropic(base_url=wire.url, api_key="k")
            guarded = guard_anthropic(raw, guard=g, **options)
        if not own:
            self.opened.extend((raw, guarded.client))
        return guarded

    def continuing(self, g: Guard, *, own: bool = False) -> Any:
        """A client that continues a cut answer on itself (the same deployment)."""
        follow = continue_chat() if self.name == "openai" else continue_message()
        return self.client(g, own=own, continuation=follow)

    async def answer(self, client: Any) -> Any:
        if self.name == "openai":
            return await client.chat.completions.create(model="m", messages=ASK, stream=True, max_tokens=40)
        return await client.messages.create(model="c", messages=ASK, stream=True, max_tokens=40)

    def text(self, event: Any) -> str:
        if self.name == "openai":
            return "".join(c.delta.content or "" for c in event.choices)
        delta = getattr(event, "delta", None)
        return getattr(delta, "text", None) or "" if event.type == "content_block_delta" else ""

    def fault(self, kind: str, after: int = CUT) -> Fault:
        if kind == "stall":
            return Fault(stall_s=10.0, after_tokens=after)
        if kind == "reset":
            return Fault(reset=True, after_tokens=after)
        return Fault(event=self.overloaded, after_tokens=after)

    def partial_sent(self, request: dict[str, Any]) -> str:
        """The partial answer a continuation request carried."""
        messages = request["json"]["messages"]
        return str(messages[-2 if self.name == "openai" else -1]["content"])

    async def close(self) -> None:
        for client in self.opened:
            await client.close()


@pytest.fixture(scope="module")
def _openai_words() -> Iterator[OpenAIWire]:
    wire = OpenAIWire(tokens=WORDS)
    with wire.running():
        yield wire


@pytest.fixture(scope="module")
def _anthropic_words() -> Iterator[AnthropicWire]:
    wire = AnthropicWire(tokens=WORDS)
    with wire.running():
        yield wire


@pytest.fixture(params=["openai", "anthropic"])
async def sdk(request: Any, _openai_words: OpenAIWire, _anthropic_words: AnthropicWire) -> AsyncIterator[Sdk]:
    wire: Any = _openai_words if request.param == "openai" else _anthropic_words
    wire.faults.clear()
    wire.faults.seen.clear()
    wire.requests.clear()
    wire.stream_ends.clear()
    wire.repeat_tokens = 2  # a model told to continue starts two words back: ragguard trims that
    got = Sdk(request.param, wire)
    yield got
    await got.close()


@pytest.fixture
def recorder() -> Iterator[EventRecorder]:
    with EventRecorder() as recording:
        yield recording


def _words(text: str) -> list[str]:
    return text.split()


# -- the doors ------------------------------------------------------------------------------


def sse_app(g: Guard, sdk: Sdk, continuing: bool = True) -> Any:
    """A RAG answer endpoint: the model's text as SSE events (``data: "<json text>"``), then
    ``[DONE]``, behind RagguardMiddleware (uvicorn serves it on a loop of its own: each request
    makes its SDK client there, and closes it)."""
    app = FastAPI()

    @app.get("/answer")
    async def answer() -> StreamingResponse:
        client = sdk.continuing(g, own=True) if continuing else sdk.client(g, own=True)
        try:
            stream = await sdk.answer(client)  # opened up to its first token
        except BaseException:
            await client.client.close()
            raise

        async def events() -> AsyncIterator[str]:
            try:
                async with stream:
                    async for event in stream:
                        text = sdk.text(event)
                        if text:
                            yield f"data: {json.dumps(text)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                await client.client.close()

        return StreamingResponse(events(), media_type="text/event-stream")

    return RagguardMiddleware(app, guard=g)


async def read_sse(url: str) -> tuple[str, list[tuple[str, Any]]]:
    """The text of an SSE answer and its other events ((event, data) in order, ``[DONE]`` too)."""
    text, others, kind = [], [], "message"
    async with httpx.AsyncClient(base_url=url, timeout=20) as client:
        async with client.stream("GET", "/answer", headers={"x-tenant-id": "acme"}) as reply:
            assert reply.status_code == 200
            async for line in reply.aiter_lines():
                if line.startswith("event: "):
                    kind = line[len("event: ") :]
                elif line.startswith("data: "):
                    data = line[len("data: ") :]
                    if kind == "message" and data != "[DONE]":
                        text.append(json.loads(data))
                    else:
                        others.append((kind, data if data == "[DONE]" else json.loads(data)))
                    kind = "message"
    return "".join(text), others


class GrpcDoor:
    """A grpc.aio server whose server-streaming ``Answer`` sends the model's text, one message per
    text event, behind GuardServerInterceptor; a grpcio client on loopback."""

    def __init__(self, g: Guard, sdk: Sdk, client: Any) -> None:
        async def answer(request: bytes, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
            stream = await sdk.answer(client)
            async with stream:
                async for event in stream:
                    text = sdk.text(event)
                    if text:
                        yield text.encode()

        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"Answer": grpc.unary_stream_rpc_method_handler(answer)}
        )
        self.server = aio.server(interceptors=[GuardServerInterceptor(guard=g)])
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    async def __aenter__(self) -> GrpcDoor:
        await self.server.start()
        self.channel = aio.insecure_channel(f"127.0.0.1:{self.port}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        await self.server.stop(None)

    def call(self) -> Any:
        stub = self.channel.unary_stream(f"/{SERVICE}/Answer")
        return stub(b"why?", metadata=(("x-tenant-id", "acme"),), timeout=20)

    async def read(self) -> tuple[str, dict[str, str], grpc.StatusCode]:
        call = self.call()
        text = []
        try:
            async for message in call:
                text.append(message.decode())
        except aio.AioRpcError:
            pass
        trailers = {k: v for k, v in (await call.trailing_metadata() or ())}
        return "".join(text), trailers, await call.code()


async def settled(g: Guard) -> None:
    """Nothing the stream held is held: its tokens settled, the tenant's slot released."""
    accounts = token_accounts(g)
    await eventually(lambda: accounts.open_streams("acme") == 0 and g.quotas.in_flight("acme") == 0)
    assert accounts.reserved("acme") == 0


# -- continued: the SDKs called directly ---------------------------------------------------


@pytest.mark.parametrize("fault", ["stall", "reset", "overload"])
async def test_a_cut_answer_is_continued_with_no_word_twice_or_missing(
    sdk: Sdk, fault: str, recorder: EventRecorder
) -> None:
    g = Guard(_policy())
    client = sdk.continuing(g)
    sdk.wire.faults.push("*", sdk.fault(fault))
    async with g.tenant("acme"):
        stream = await sdk.answer(client)
        text = "".join([sdk.text(event) async for event in stream])
        degraded = ragguard.degraded()
    assert text == ANSWER and _words(text) == [w.strip() for w in WORDS]
    ending = stream.ending
    assert (ending.kind, ending.continued_by) == ("continued", sdk.continuation)
    assert ending.continued_after == sdk.preamble + CUT  # the events handed over before the cut
    assert ending.error == {"stall": "StreamTimeout", "reset": ending.error, "overload": sdk.error}[fault]
    assert ending.error  # a reset is the SDK's or httpx's own error class, named
    assert degraded == (f"continued: {sdk.continuation} after {sdk.preamble + CUT} items",)
    # the continuation asked for the rest, with the answer so far (the model repeated two words)
    assert len(sdk.wire.requests) == 2
    assert sdk.partial_sent(sdk.wire.requests[1]) == "".join(WORDS[:CUT])
    await settled(g)
    await recorder.settle()
    # the cut stream settled the output it had counted, the continuation the output it reported
    # (the rest of the answer and the two words it repeated): each its own reservation
    outputs = [(e.tokens, e.reserved > 0) for e in recorder.of(StreamSettled)]
    assert outputs == [(CUT, True), (len(WORDS) - CUT + 2, True)]


async def test_a_continuation_on_another_deployment_runs_under_its_own_stage(sdk: Sdk) -> None:
    g = Guard(_policy())
    # the backup deployment: another server of the same answer, wrapped as a stage of its own
    backup_server = OpenAIWire(tokens=WORDS) if sdk.name == "openai" else AnthropicWire(tokens=WORDS)
    with backup_server.running():
        backup = sdk.client(g, wire=backup_server, generation_stage="backup")
        follow = (
            continue_chat(backup, name="backup")
            if sdk.name == "openai"
            else continue_message(backup, name="backup")
        )
        client = sdk.client(g, continuation=follow)
        sdk.wire.faults.push("*", sdk.fault("reset"))
        async with g.tenant("acme"):
            stream = await sdk.answer(client)
            text = "".join([sdk.text(event) async for event in stream])
            endings = ragguard.stream_endings()
    assert text == ANSWER
    assert (stream.ending.kind, stream.ending.continued_by) == ("continued", "backup")
    assert len(sdk.wire.requests) == 1 and len(backup_server.requests) == 1
    # the backup's own guarded stream ended too, before the one it continued
    # (a wrapped client's stage is its provider's: openai, anthropic)
    assert [(e.stage, e.kind) for e in endings] == [("backup", "completed"), (sdk.name, "continued")]
    await settled(g)


# -- continued, at both front doors ---------------------------------------------------------


@pytest.mark.parametrize("fault", ["stall", "reset", "overload"])
async def test_the_sse_client_gets_the_whole_answer_and_a_continued_ending(sdk: Sdk, fault: str) -> None:
    g = Guard(_policy())
    sdk.wire.faults.push("*", sdk.fault(fault))
    with serving(sse_app(g, sdk)) as (url, _):
        text, others = await read_sse(url)
    assert text == ANSWER and _words(text) == [w.strip() for w in WORDS]
    (kind, ending), done = others
    assert kind == SSE_ENDING_EVENT and done == ("message", "[DONE]")  # told before the app's [DONE]
    assert ending["ending"] == "continued" and ending["continued_by"] == sdk.continuation
    assert ending["continued_after"] == sdk.preamble + CUT and ending["stage"] == sdk.name
    assert ending["items"] > ending["continued_after"] and ending["error"]
    await settled(g)


@pytest.mark.parametrize("fault", ["stall", "reset", "overload"])
async def test_the_grpc_client_gets_the_whole_answer_and_a_continued_ending(sdk: Sdk, fault: str) -> None:
    g = Guard(_policy())
    client = sdk.continuing(g)
    sdk.wire.faults.push("*", sdk.fault(fault))
    async with GrpcDoor(g, sdk, client) as door:
        text, trailers, code = await door.read()
    assert code is grpc.StatusCode.OK
    assert text == ANSWER and _words(text) == [w.strip() for w in WORDS]
    assert (trailers[STREAM_ENDING_KEY], trailers[STREAM_BY_KEY]) == ("continued", sdk.continuation)
    assert trailers[STREAM_AFTER_KEY] == str(sdk.preamble + CUT)
    assert int(trailers[STREAM_ITEMS_KEY]) > sdk.preamble + CUT and trailers[STREAM_ERROR_KEY]
    await settled(g)


# -- incomplete and completed, at both front doors ---------------------------------------------


@pytest.mark.parametrize(
    ("fault", "error", "status", "code"),
    [
        ("stall", "StreamTimeout", 504, grpc.StatusCode.DEADLINE_EXCEEDED),
        ("reset", None, 502, grpc.StatusCode.UNAVAILABLE),
    ],
)
async def test_without_a_continuation_a_cut_answer_ends_incomplete_with_its_count(
    sdk: Sdk, fault: str, error: str | None, status: int, code: grpc.StatusCode
) -> None:
    g = Guard(_policy())
    sdk.wire.faults.push("*", sdk.fault(fault), times=2)
    with serving(sse_app(g, sdk, continuing=False)) as (url, _):
        text, others = await read_sse(url)
    assert text == "".join(WORDS[:CUT])
    (kind, ending), (error_kind, answer) = others
    assert kind == SSE_ENDING_EVENT and error_kind == SSE_ERROR_EVENT  # the ending, then the error
    assert (ending["ending"], ending["stage"], ending["items"]) == (
        "incomplete",
        sdk.name,
        sdk.preamble + CUT,
    )
    assert ending["error"] == (error or ending["error"]) and "continued_by" not in ending
    assert answer["status"] == status

    async with GrpcDoor(g, sdk, sdk.client(g)) as door:
        text, trailers, got = await door.read()
    assert got is code and text == "".join(WORDS[:CUT])
    assert (trailers[STREAM_ENDING_KEY], trailers[STREAM_ITEMS_KEY]) == (
        "incomplete",
        str(sdk.preamble + CUT),
    )
    assert STREAM_BY_KEY not in trailers
    await settled(g)


async def test_a_whole_answer_ends_completed_at_both_doors(sdk: Sdk) -> None:
    g = Guard(_policy())
    with serving(sse_app(g, sdk)) as (url, _):
        text, others = await read_sse(url)
    assert text == ANSWER
    (kind, ending), _ = others
    assert kind == SSE_ENDING_EVENT and (ending["ending"], ending["stage"]) == ("completed", sdk.name)
    async with GrpcDoor(g, sdk, sdk.continuing(g)) as door:
        text, trailers, code = await door.read()
    assert (code, text, trailers[STREAM_ENDING_KEY]) == (grpc.StatusCode.OK, ANSWER, "completed")
    assert len(sdk.wire.requests) == 2  # one request per answer: nothing continued
    await settled(g)


# -- the client goes away during the continuation ---------------------------------------------


async def test_a_client_leaving_the_sse_door_mid_continuation_leaves_nothing_held(sdk: Sdk) -> None:
    g = Guard(_policy(idle_s=30.0))  # only the client's leaving can end the continuation's stall
    sdk.wire.faults.push("*", sdk.fault("reset"))
    sdk.wire.faults.push("*", Fault(stall_s=10.0, after_tokens=3))  # the continuation stalls in turn
    with serving(sse_app(g, sdk)) as (url, _):
        async with httpx.AsyncClient(base_url=url, timeout=20) as http:
            async with http.stream("GET", "/answer", headers={"x-tenant-id": "acme"}) as reply:
                seen = ""
                async for line in reply.aiter_lines():
                    if line.startswith("data: "):
                        seen += json.loads(line[len("data: ") :])
                    if len(_words(seen)) > CUT:  # a word of the continuation: leave now
                        break
        # both upstream streams have ended within 5 s: the continuation's, stalled for 10 s, was
        # closed; its token reservation is settled, the tenant's slot released
        await eventually(lambda: len(sdk.wire.stream_ends) == 2 and "closed" in sdk.wire.stream_ends)
        await settled(g)
    assert len(sdk.wire.requests) == 2


async def test_a_client_cancelling_the_grpc_call_mid_continuation_leaves_nothing_held(sdk: Sdk) -> None:
    g = Guard(_policy(idle_s=30.0))  # only the client's leaving can end the continuation's stall
    client = sdk.continuing(g)
    sdk.wire.faults.push("*", sdk.fault("reset"))
    sdk.wire.faults.push("*", Fault(stall_s=10.0, after_tokens=3))  # the continuation stalls in turn
    async with GrpcDoor(g, sdk, client) as door:
        call = door.call()
        seen = ""
        while len(_words(seen)) <= CUT:
            seen += (await call.read()).decode()
        call.cancel()
        await eventually(lambda: len(sdk.wire.stream_ends) == 2 and "closed" in sdk.wire.stream_ends)
        await settled(g)
    assert len(sdk.wire.requests) == 2


# -- what is never continued ---------------------------------------------------------------


async def test_a_request_with_tools_is_not_continued_unless_declared_safe(sdk: Sdk) -> None:
    g = Guard(_policy())
    tool = (
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        if sdk.name == "openai"
        else {"name": "f", "input_schema": {"type": "object"}}
    )
    client = sdk.continuing(g)
    sdk.wire.faults.push("*", sdk.fault("reset"))
    async with g.tenant("acme"):
        if sdk.name == "openai":
            stream = await client.chat.completions.create(model="m", messages=ASK, stream=True, tools=[tool])
        else:
            stream = await client.messages.create(
                model="c", messages=ASK, stream=True, max_tokens=40, tools=[tool]
            )
        got = []
        with pytest.raises(Exception) as caught:
            async for event in stream:
                got.append(sdk.text(event))
    assert "".join(got) == "".join(WORDS[:CUT])
    assert any("offers tools" in note for note in getattr(caught.value, "__notes__", ()))
    assert stream.ending.kind == "incomplete" and len(sdk.wire.requests) == 1


# -- the recipes, one by one ----------------------------------------------------------------

DOC = Path(__file__).parents[2] / "docs" / "integrations.md"


def _doc_block() -> str:
    text = DOC.read_text(encoding="utf-8")
    marker = "<!-- the block below is executed by tests/integrations/test_continued_answers.py -->"
    found = re.search(r"```python\n(.*?)```", text[text.index(marker) :], re.S)
    assert found is not None
    return found.group(1)


async def test_the_block_of_the_docs_runs_as_written(
    _openai_words: OpenAIWire, _anthropic_words: AnthropicWire
) -> None:
    ragguard.configure(_policy())
    backup_server = OpenAIWire(tokens=WORDS)
    for wire in (_openai_words, _anthropic_words):
        wire.faults.clear()
        wire.requests.clear()
        wire.repeat_tokens = 0
    with backup_server.running():
        namespace: dict[str, Any] = {
            "BACKUP_URL": f"{backup_server.url}/v1",
            "OPENAI_URL": f"{_openai_words.url}/v1",
            "ANTHROPIC_URL": _anthropic_words.url,
            "API_KEY": "k",
        }
        exec(compile(_doc_block(), str(DOC), "exec"), namespace)
        _openai_words.faults.push("chat", Fault(reset=True, after_tokens=CUT))
        _anthropic_words.faults.push("messages", Fault(event=OVERLOADED, after_tokens=CUT))
        try:
            gpt = await namespace["gpt"].chat.completions.create(model="m", messages=ASK, stream=True)
            said = "".join([c.choices[0].delta.content or "" async for c in gpt if c.choices])
            claude = await namespace["claude"].messages.create(
                model="c", messages=ASK, max_tokens=40, stream=True
            )
            told = "".join(
                [
                    e.delta.text
                    async for e in claude
                    if e.type == "content_block_delta" and e.delta.type == "text_delta"
                ]
            )
        finally:
            for name in ("gpt", "claude", "backup"):
                await namespace[name].client.close()
    assert said == ANSWER and told == ANSWER
    assert (gpt.ending.continued_by, claude.ending.continued_by) == ("backup-model", "continue_message")
    assert backup_server.requests[0]["json"]["model"] == "backup-model"  # the model it was given
    assert _anthropic_words.requests[1]["json"]["messages"][-1]["role"] == "assistant"


def test_prefill_messages_strip_the_prefill_and_keep_the_requests_own() -> None:
    ask = [{"role": "user", "content": "why?"}]
    assert prefill_messages(ask, "It is ") == [*ask, {"role": "assistant", "content": "It is"}]
    own = [*ask, {"role": "assistant", "content": "Answer: "}]
    assert prefill_messages(own, "it is") == [*ask, {"role": "assistant", "content": "Answer: it is"}]
    assert prefill_messages(ask, "  ") == ask  # nothing to prefill
    assert continuation_messages(ask, "It is")[-2:] == [
        {"role": "assistant", "content": "It is"},
        {"role": "user", "content": CONTINUE_INSTRUCTION},
    ]


def test_what_each_recipe_refuses_to_continue() -> None:
    chat, message = continue_chat(), continue_message()
    assert chat.refuses({"n": 2}, structured=True) is not None  # several answers: never
    assert chat.refuses({"tools": [{}]}, structured=False) is not None
    assert chat.refuses({"functions": [{}]}, structured=False) is not None
    assert chat.refuses({"response_format": {"type": "json_object"}}, structured=False) is not None
    assert chat.refuses({"response_format": {"type": "text"}}, structured=False) is None
    assert chat.refuses({"tools": [{}], "response_format": {"type": "json_object"}}, structured=True) is None
    assert (
        message.refuses({"thinking": {"type": "enabled"}}, structured=True) is not None
    )  # no prefill with it
    assert message.refuses({"tools": [{}]}, structured=False) is not None
    assert message.refuses({"tools": [{}]}, structured=True) is None


async def test_a_request_with_tools_is_continued_when_the_stage_declares_it_safe(sdk: Sdk) -> None:
    g = Guard(_policy())
    follow = continue_chat() if sdk.name == "openai" else continue_message()
    client = sdk.client(g, continuation=follow, continue_structured=True)
    sdk.wire.faults.push("*", sdk.fault("reset"))
    if sdk.name == "openai":
        tool: dict[str, Any] = {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object"}},
        }
        stream = await client.chat.completions.create(model="m", messages=ASK, stream=True, tools=[tool])
    else:
        tool = {"name": "f", "input_schema": {"type": "object"}}
        stream = await client.messages.create(
            model="c", messages=ASK, stream=True, max_tokens=40, tools=[tool]
        )
    assert "".join([sdk.text(event) async for event in stream]) == ANSWER
    assert stream.ending.kind == "continued"


async def test_anthropic_blocks_are_numbered_on_from_the_callers() -> None:
    from anthropic.types import RawContentBlockDeltaEvent, RawContentBlockStartEvent, RawContentBlockStopEvent

    def delta(index: int, text: str) -> Any:
        return RawContentBlockDeltaEvent.model_validate(
            {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}
        )

    start = RawContentBlockStartEvent.model_validate(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    )
    stop = RawContentBlockStopEvent.model_validate({"type": "content_block_stop", "index": 0})
    had = (delta(0, "First block. "), delta(1, "Second block is"))  # the caller was in block 1

    async def events() -> AsyncIterator[Any]:
        for event in (start, delta(0, " block is"), delta(0, " done."), stop):
            yield event

    partial = Partial("generation", had, "First block. Second block is", ConnectionResetError())
    got = [e async for e in continue_message().rewrite(events(), partial)]
    assert [(e.type, e.index) for e in got] == [("content_block_delta", 1), ("content_block_stop", 1)]
    assert got[0].delta.text == " done."  # " block is" was a repeat


async def test_the_responses_api_is_not_continued(_openai_words: OpenAIWire) -> None:
    sdk = Sdk("openai", _openai_words)
    _openai_words.faults.clear()
    _openai_words.requests.clear()
    g = Guard(_policy())
    client = sdk.continuing(g)
    _openai_words.faults.push("responses", Fault(reset=True, after_tokens=6))
    try:
        stream = await client.responses.create(model="m", input="why?", stream=True)
        with pytest.raises(Exception):  # noqa: B017 - whatever the SDK raises for a reset
            async for _ in stream:
                pass
    finally:
        await sdk.close()
    assert stream.ending.kind == "incomplete" and len(_openai_words.requests) == 1


def test_a_stream_that_has_begun_a_tool_call_reads_as_not_text() -> None:
    from anthropic.types import RawContentBlockDeltaEvent, RawContentBlockStartEvent
    from openai.types.chat import ChatCompletionChunk

    from ragguard.integrations.anthropic import _message_text
    from ragguard.integrations.openai import _chat_text

    def chunk(delta: dict[str, Any], index: int = 0) -> Any:
        return ChatCompletionChunk.model_validate(
            {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": index, "delta": delta, "finish_reason": None}]}
        )  # fmt: skip

    call = {
        "tool_calls": [
            {"index": 0, "id": "t", "type": "function", "function": {"name": "f", "arguments": "{"}}
        ]
    }
    assert [_chat_text(chunk({"content": "Hi"})), _chat_text(chunk({"role": "assistant"}))] == ["Hi", ""]
    assert _chat_text(chunk(call)) is None and _chat_text(chunk({"content": "x"}, index=1)) is None
    assert _chat_text(chunk({"refusal": "no"})) is None
    tool = RawContentBlockStartEvent.model_validate(
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}},
        }
    )
    json_delta = RawContentBlockDeltaEvent.model_validate(
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "{"},
        }
    )
    assert _message_text(tool) is None and _message_text(json_delta) is None
