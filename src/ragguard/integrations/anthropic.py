"""The Anthropic SDK's ``AsyncAnthropic`` client, guarded: ``pip install '/path/to/ragguard[anthropic]'``.

::

    from anthropic import AsyncAnthropic
    from ragguard.integrations.anthropic import guard_anthropic

    client = guard_anthropic(AsyncAnthropic(), tenant_header="x-tenant-id")
    stream = await client.messages.create(model=m, max_tokens=512, messages=msgs, stream=True)
    async for event in stream: ...

:func:`guard_anthropic` returns a client whose ``messages.create`` runs as the generation stage
(``generation_stage``, default ``anthropic``: a stage of its own starting from the policy's
``generation``, keyed by ``<endpoint>/<model>`` unless ``keyed=False``), as
:mod:`ragguard.integrations.openai` runs chat completions: a stream is opened up to its first token
(``message_start``, ``content_block_start`` and ``ping`` come with the first
``content_block_delta``) and runs under the stage's budgets and commit point; ``max_tokens`` is
reserved from the tenant's token quota, with the input estimated from the text of ``messages`` and
``system`` (characters / 4), and the stream settles with the usage it reports: the input of its
``message_start`` (``input_tokens`` plus the cache's ``cache_creation_input_tokens`` and
``cache_read_input_tokens``: the whole prompt, as OpenAI's ``prompt_tokens`` counts it) and the
``output_tokens`` of its ``message_delta`` (a whole message: its ``usage``); the call's ``model``
names the model whose limits apply. An ``overloaded_error`` event inside a stream that began with
HTTP 200 is a rejection, retried or replaced before the first token like a 529. The SDK's retries
are off and each attempt says its number in ``x-stainless-retry-count``, its timeout is the
attempt's bound, ``tenant_header`` (default: the Guard's) carries the tenant; the rest of the client
is its own.

A stream that fails after its first token (a stall cut by ``idle_s``, a reset, an in-stream
``overloaded_error``) goes on with ``continuation=`` when given (:func:`continue_message`: the same
client, another one or another model, asked for the rest of the answer with the partial answer as
the assistant's prefill; :func:`prefill_messages` is that recipe for a function of your own).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import ragguard
from ragguard import Guard
from ragguard.rag import Partial, Usage

from ._common import Stages, count_text, header_option, needs, prompt_tokens, usage_of
from ._continue import ClientContinuation, continuation_options
from ._llm import Fallback, Generation, GuardedClient, Resource

__all__ = ["continue_message", "guard_anthropic", "prefill_messages"]


def guard_anthropic(
    client: Any,
    *,
    guard: Guard | None = None,
    generation_stage: str = "anthropic",
    tenant_header: str | None = None,
    fallback: Fallback = None,
    keyed: bool = True,
    continuation: MessageContinuation | None = None,
    continue_structured: bool = False,
) -> GuardedAnthropic:
    """``client`` (an ``anthropic.AsyncAnthropic``) guarded by ``guard`` (None: the default
    registry at each call); ``fallback`` serves ``messages.create`` (called with its keyword
    arguments) when the stage fails before the first token; ``tenant_header`` the header the
    tenant travels in (None: the Guard's ``tenant_header``); ``continuation`` carries a stream cut
    after its first token on (:func:`continue_message`), ``continue_structured=True`` for a
    request that offers tools too (a stream that has begun a tool call never is). Raises
    ConfigError for a bad ``guard``, ``tenant_header`` or ``continuation``; ImportError with the
    install command when ``anthropic`` is missing. ``keyed=False`` runs every model on the
    stage's own instance (one breaker for all)."""
    needs("anthropic", "anthropic")
    if continuation is not None and not isinstance(continuation, MessageContinuation):
        raise ragguard.ConfigError(
            f"continuation must be what continue_message() returns, got {type(continuation).__name__}",
            field="continuation",
        )
    return GuardedAnthropic(
        client,
        stages=Stages(guard),
        generation_stage=generation_stage,
        tenant_header=header_option(tenant_header),
        fallback=fallback,
        keyed=keyed,
        continuation=continuation,
        continue_structured=continue_structured,
    )


class GuardedAnthropic(GuardedClient):
    """What :func:`guard_anthropic` returns: ``messages.create`` guarded; ``client`` is the SDK
    client it calls (retries off); other attributes are that client's."""

    def __init__(
        self,
        client: Any,
        *,
        stages: Stages,
        generation_stage: str,
        tenant_header: str | None,
        fallback: Fallback,
        keyed: bool = True,
        continuation: MessageContinuation | None = None,
        continue_structured: bool = False,
    ) -> None:
        super().__init__(
            client,
            stages=stages,
            generation_stage=generation_stage,
            tenant_header=tenant_header,
            fallback=fallback,
            keyed=keyed,
            continuation=continuation,
            continue_structured=continue_structured,
        )
        continues = continuation_options(
            continuation, stages, generation_stage, tenant_header, self.client,
            structured=continue_structured, text=_message_text,
        )  # fmt: skip
        self.messages = Resource(
            self.client.messages,
            create=Generation(
                self.client.messages,
                stages,
                generation_stage,
                tenant_header,
                fallback,
                is_preamble=_preamble,
                tokens=_tokens,
                usage=_usage,
                whole_usage=_whole_usage,
                budget=("max_tokens",),
                include_usage=False,
                prompt=_prompt,
                client=self.client,
                keyed=keyed,
                provider="anthropic",
                **continues,
            ).create,
        )


_PREAMBLE = frozenset({"message_start", "content_block_start", "ping"})


def _preamble(event: Any) -> bool:
    return getattr(event, "type", None) in _PREAMBLE


def _tokens(event: Any) -> int:
    if getattr(event, "type", None) != "content_block_delta":
        return 0
    delta = event.delta
    return count_text(getattr(delta, "text", None), getattr(delta, "partial_json", None))


def _prompt(kwargs: Mapping[str, Any]) -> int:
    return prompt_tokens(kwargs.get("messages"), kwargs.get("system"))


def _usage(event: Any) -> Usage | None:
    kind = getattr(event, "type", None)
    if kind == "message_start":  # the input, counted once the prompt was read
        return _whole_usage(event.message, output=False)
    if kind == "message_delta":  # the output so far (and the input, if it says it again)
        return _whole_usage(event, output=True)
    return None


def _whole_usage(message: Any, *, output: bool = True) -> Usage | None:
    usage = getattr(message, "usage", None)
    if usage is None:
        return None
    parts = [getattr(usage, name, None) for name in _INPUT_FIELDS]
    given = [n for n in parts if isinstance(n, int) and not isinstance(n, bool)]
    input_tokens = sum(given) if isinstance(parts[0], int) else None
    return usage_of(input_tokens, getattr(usage, "output_tokens", None) if output else None)


_INPUT_FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


# -- continuation ---------------------------------------------------------------------------


def prefill_messages(messages: Any, partial_text: str) -> list[Any]:
    """The messages that ask Anthropic for the rest of an answer cut at ``partial_text``: the
    partial answer as the assistant's prefill (the last message, which the model continues; one
    the request ended with already is extended), its trailing whitespace left out as the API
    requires. The model continues from the prefill's last character; ragguard trims a whitespace
    it repeats (:class:`ragguard.rag.Overlap`)."""
    given = list(messages or ())
    prefill = partial_text
    if given and isinstance(given[-1], dict) and given[-1].get("role") == "assistant":
        before = given.pop()["content"]
        prefill = (before if isinstance(before, str) else "") + partial_text
    prefill = prefill.rstrip()
    return [*given, {"role": "assistant", "content": prefill}] if prefill else given


class MessageContinuation(ClientContinuation):
    """How a wrapped Anthropic client continues its message streams (see :func:`continue_message`)."""

    resource = ("messages",)
    default_name = "continue_message"

    def request(self, kwargs: Any, partial: Partial) -> dict[str, Any]:
        asked = dict(kwargs)
        asked["messages"] = prefill_messages(kwargs.get("messages"), partial.text or "")
        if self.model is not None:
            asked["model"] = self.model
        return asked

    def refuses(self, kwargs: Any, structured: bool) -> str | None:
        if kwargs.get("thinking"):
            return "extended thinking: Anthropic takes no assistant prefill with it"
        if not structured and kwargs.get("tools"):
            return "the request offers tools (continue_structured=True to continue it anyway)"
        return None

    async def rewrite(self, events: Any, partial: Partial) -> AsyncIterator[Any]:
        trim = partial.overlap()
        shift = _last_block(partial.items)  # the continuation's blocks follow the caller's last one
        opened = False
        template = None
        async for event in events:
            kind = getattr(event, "type", None)
            if kind in ("message_start", "ping"):
                continue  # the caller has had the message's opening
            if kind == "content_block_start" and not opened:
                opened = True  # continues the block the caller's stream was in
                continue
            if kind == "content_block_delta" and getattr(event.delta, "type", None) == "text_delta":
                template = event
                kept = trim.feed(event.delta.text)
                if kept:
                    yield _delta(event, kept, shift)
                continue
            if not trim.done and kind in ("content_block_stop", "message_delta", "message_stop"):
                held = trim.flush()
                if held and template is not None:
                    yield _delta(template, held, shift)
            if shift and isinstance(getattr(event, "index", None), int):
                event = event.model_copy(update={"index": event.index + shift})
            yield event
        held = trim.flush()
        if held and template is not None:
            yield _delta(template, held, shift)


def continue_message(
    client: Any = None, *, model: str | None = None, name: str | None = None
) -> MessageContinuation:
    """A continuation for ``guard_anthropic(..., continuation=continue_message(...))``: a message
    stream cut after its first token asks ``client`` for the rest of the answer with the partial
    answer as the assistant's prefill (:func:`prefill_messages`), the request's other arguments
    unchanged (``model`` in place of its model when given).

    ``client``: None for the wrapped client itself (under the stage's continuation budgets and
    tokens); another ``guard_anthropic`` client (under its own stage, breaker and budgets); or a
    plain ``AsyncAnthropic``. ``name``: what ``StreamEnding.continued_by`` and
    :func:`ragguard.degraded` call it (default ``model``, else ``"continue_message"``). The new
    stream's ``message_start``, first ``content_block_start`` and ``ping`` are left out (the
    caller has had them), its blocks numbered on from the caller's, and the text it repeats of the
    partial answer trimmed. A request with extended thinking is not continued, nor one that
    offers tools (unless ``continue_structured=True``)."""
    return MessageContinuation(client, model=model, name=name)


def _last_block(items: Any) -> int:
    index = 0
    for item in items:
        at = getattr(item, "index", None)
        if isinstance(at, int):
            index = at
    return index


def _delta(event: Any, text: str, shift: int) -> Any:
    delta = event.delta.model_copy(update={"text": text})
    return event.model_copy(update={"delta": delta, "index": event.index + shift})


def _message_text(event: Any) -> str | None:
    """An event's text (the stage's ``text=``): a text delta's text, "" for an event without
    text, None for one that is not text (a tool use, its JSON, thinking)."""
    kind = getattr(event, "type", None)
    if kind == "content_block_start":
        return "" if getattr(event.content_block, "type", None) == "text" else None
    if kind == "content_block_delta":
        delta = event.delta
        return delta.text if getattr(delta, "type", None) == "text_delta" else None
    return ""
