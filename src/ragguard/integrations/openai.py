"""The OpenAI SDK's ``AsyncOpenAI`` client (and any OpenAI-compatible server: vLLM, TGI, a
gateway, by ``base_url``), guarded: ``pip install '/path/to/ragguard[openai]'``.

::

    from openai import AsyncOpenAI
    from ragguard.integrations.openai import guard_openai

    client = guard_openai(AsyncOpenAI(base_url=url), tenant_header="x-tenant-id")
    vectors = await client.embeddings.create(model="text-embedding-3-small", input=texts)
    stream = await client.chat.completions.create(model="gpt-4o-mini", messages=m, stream=True)
    async for chunk in stream: ...

:func:`guard_openai` returns a client whose

- ``embeddings.create`` runs as the embedding stage (``embedding_stage``, default ``embedding``):
  its timeout, breaker, retries and the embedding cache, keyed by the model, ``dimensions``,
  ``encoding_format`` and the text, which answers (a response of the cached vectors, usage 0)
  when the provider fails;
- ``chat.completions.create`` and ``responses.create`` run as the generation stage
  (``generation_stage``, default ``openai``: a stage of its own, starting from the policy's
  ``generation``, so another provider's faults never refuse these calls), keyed by deployment:
  ``<endpoint>/<model>`` (``api.openai.com/gpt-4o``), each with its own breaker, budgets and
  limits (docs/layers.md, "Keyed stages"; ``keyed=False``: one for all). The embeddings are keyed
  the same way. A stream is opened up to its first token
  before ``create`` returns (what fails before it raises there, as the SDK's HTTP errors do), then
  runs under the stage's first-item, idle and total budgets and its commit point; the events a
  server sends before the first token (a role-only chunk, ``response.created``...) come with it.
  Its tokens are reserved from the tenant's token quota (``max_completion_tokens`` /
  ``max_tokens`` / ``max_output_tokens`` times ``n``, else the stage's ``estimate_tokens``),
  counted per chunk and replaced by the usage the stream reports (chat streams ask for it with
  ``stream_options={"include_usage": True}`` unless the call says otherwise; that extra usage
  chunk is counted and not shown). A call without ``stream=True`` is a stream of one item, the
  whole response: its first-item budget bounds it, and its usage settles its tokens.
  Input tokens are reserved too, estimated from the text of ``messages`` (chat) or of ``input``
  and ``instructions`` (responses) at characters / 4, and settled with the ``prompt_tokens`` /
  ``input_tokens`` the provider reports; the call's ``model`` names the model whose limits
  (``TenantQuota.models``) apply.

A chat stream that fails after its first token (a stall cut by ``idle_s``, a reset, an error
event) goes on with ``continuation=`` when given (:func:`continue_chat`: the same client, another
one or another model, asked for the rest of the answer with the partial answer as an assistant
message and an instruction to continue; :func:`continuation_messages` is that recipe for a
function of your own), its repeat of the answer so far trimmed.

Every attempt is one HTTP request: the SDK's own retries are off (``max_retries=0``), so the
stage's retry policy is the only loop, and each attempt says its number in
``x-stainless-retry-count`` as the SDK's own retries do (a server's ``x-should-retry`` is read by
the outcome classifier, as the SDK reads it); the SDK's timeout is the attempt's bound (the
smallest of the caller's ``timeout=``, the stage's ``timeout_s`` and the deadline left) plus
:data:`~ragguard.integrations._common.SDK_TIMEOUT_GRACE_S`; ``tenant_header`` (default: the
Guard's ``tenant_header``) names a header that carries :func:`ragguard.current_tenant` on every
request. Anything else of the client (``models.list()``, ``files``...) is the client's own, with
retries off and unguarded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import ragguard
from ragguard import Guard
from ragguard.rag import Partial, Usage

from ._common import (
    Attempts,
    Stages,
    count_text,
    endpoint_of,
    header_option,
    model_key,
    needs,
    prompt_tokens,
    sdk_options,
    usage_of,
)
from ._continue import ClientContinuation, continuation_options
from ._llm import Fallback, Generation, GuardedClient, Resource

__all__ = ["CONTINUE_INSTRUCTION", "continuation_messages", "continue_chat", "guard_openai"]


def guard_openai(
    client: Any,
    *,
    guard: Guard | None = None,
    embedding_stage: str = "embedding",
    generation_stage: str = "openai",
    tenant_header: str | None = None,
    fallback: Fallback = None,
    responses_fallback: Fallback = None,
    include_usage: bool = True,
    keyed: bool = True,
    continuation: ChatContinuation | None = None,
    continue_structured: bool = False,
) -> GuardedOpenAI:
    """``client`` (an ``openai.AsyncOpenAI``, or ``AsyncAzureOpenAI``) guarded by ``guard`` (None:
    the default registry at each call); see the module docstring.

    ``fallback``: a callable or a sequence of them for ``chat.completions.create``, called with
    the same keyword arguments when the stage fails before the first token (another client's
    ``chat.completions.create``, or an ``async def`` of your own returning a stream for
    ``stream=True``, a completion otherwise); ``responses_fallback`` the same for
    ``responses.create``. ``include_usage=False`` never adds ``stream_options`` (for a server that
    refuses it; tokens are then the chunks' text / 4). ``tenant_header``: the header the tenant
    travels in, for this client (None: the Guard's ``tenant_header``). ``keyed=False`` runs every
    model of the client on the stages' own instances (one breaker for all).

    ``continuation``: how a chat stream cut after its first token goes on (:func:`continue_chat`);
    ``continue_structured=True`` continues a request that asks for structured output
    (``response_format``) or offers tools as well (a stream that has begun a tool call never is).

    Raises ConfigError for a bad ``guard``, ``tenant_header`` or ``continuation``; ImportError
    with the install command when ``openai`` is missing."""
    needs("openai", "openai")
    if continuation is not None and not isinstance(continuation, ChatContinuation):
        raise ragguard.ConfigError(
            f"continuation must be what continue_chat() returns, got {type(continuation).__name__}",
            field="continuation",
        )
    return GuardedOpenAI(
        client,
        stages=Stages(guard),
        embedding_stage=embedding_stage,
        generation_stage=generation_stage,
        tenant_header=header_option(tenant_header),
        fallback=fallback,
        responses_fallback=responses_fallback,
        include_usage=include_usage,
        keyed=keyed,
        continuation=continuation,
        continue_structured=continue_structured,
    )


class GuardedOpenAI(GuardedClient):
    """What :func:`guard_openai` returns: ``embeddings``, ``chat.completions`` and ``responses``
    guarded; ``client`` is the SDK client it calls (retries off); other attributes are that
    client's."""

    def __init__(
        self,
        client: Any,
        *,
        stages: Stages,
        embedding_stage: str,
        generation_stage: str,
        tenant_header: str | None,
        fallback: Fallback,
        responses_fallback: Fallback,
        include_usage: bool,
        keyed: bool = True,
        continuation: ChatContinuation | None = None,
        continue_structured: bool = False,
    ) -> None:
        super().__init__(
            client,
            stages=stages,
            embedding_stage=embedding_stage,
            generation_stage=generation_stage,
            tenant_header=tenant_header,
            fallback=fallback,
            responses_fallback=responses_fallback,
            include_usage=include_usage,
            keyed=keyed,
            continuation=continuation,
            continue_structured=continue_structured,
        )
        continues = continuation_options(
            continuation, stages, generation_stage, tenant_header, self.client,
            structured=continue_structured, text=_chat_text,
        )  # fmt: skip
        self._stages = stages
        self.embeddings = _Embeddings(self.client, stages, embedding_stage, tenant_header, keyed)
        completions = Generation(
            self.client.chat.completions,
            stages,
            generation_stage,
            tenant_header,
            fallback,
            is_preamble=_chat_preamble,
            tokens=_chat_tokens,
            usage=_chat_usage,
            whole_usage=_whole_chat_usage,
            budget=("max_completion_tokens", "max_tokens"),
            include_usage=include_usage,
            prompt=_chat_prompt,
            client=self.client,
            keyed=keyed,
            provider="openai",
            **continues,
        ).create
        chat = self.client.chat
        self.chat = Resource(chat, completions=Resource(chat.completions, create=completions))
        self.responses = Resource(
            self.client.responses,
            create=Generation(
                self.client.responses,
                stages,
                generation_stage,
                tenant_header,
                responses_fallback,
                is_preamble=_responses_preamble,
                tokens=_responses_tokens,
                usage=_responses_usage,
                whole_usage=_whole_responses_usage,
                budget=("max_output_tokens",),
                include_usage=False,
                prompt=_responses_prompt,
                wrap_events=_raising,
                client=self.client,
                keyed=keyed,
                provider="openai",
            ).create,
        )


# -- embeddings -----------------------------------------------------------------------------


class _Rows(list[Any]):
    """The vectors of an embedding response, in order, carrying the response (what the cache
    stores row by row, and what the caller gets back whole)."""

    response: Any = None


class _Embeddings:
    def __init__(
        self, client: Any, stages: Stages, stage: str, tenant_header: str | None, keyed: bool
    ) -> None:
        self._client = client
        self._stages = stages
        self._stage = stage
        self._tenant_header = tenant_header

        async def embed(keys: list[str] | None, kwargs: dict[str, Any], attempts: Attempts) -> _Rows:
            options = sdk_options(stages, stage, kwargs, tenant_header, retries=attempts.next())
            response = await client.embeddings.create(**options)
            rows = _Rows(d.embedding for d in sorted(response.data, key=lambda d: d.index))
            rows.response = response
            return rows

        embed.__ragguard_provider__ = "openai"  # type: ignore[attr-defined]
        by_model = model_key(endpoint_of(client.base_url))
        key = (lambda keys, kwargs, attempts: by_model(**kwargs)) if keyed else None
        self._embed = stages.decorate(stage, embed, texts="keys", key=key)

    async def create(self, **kwargs: Any) -> Any:
        """``client.embeddings.create(**kwargs)`` as the embedding stage: the SDK's
        ``CreateEmbeddingResponse``, or one built from the stage's cache when the provider failed
        and every text was cached (``ragguard.degraded()`` names ``embedding_cache``)."""
        given = kwargs.get("input")
        texts = [given] if isinstance(given, str) else given
        keys = None
        if isinstance(texts, list) and texts and all(isinstance(t, str) for t in texts):
            model, dimensions, form = (kwargs.get(k) for k in ("model", "dimensions", "encoding_format"))
            keys = [f"{model!r}|{dimensions!r}|{form!r}|{t}" for t in texts]
        rows = await self._embed(keys, kwargs, Attempts())
        if isinstance(rows, _Rows):
            return rows.response
        return _cached_response(rows, kwargs.get("model"))


def _cached_response(rows: list[Any], model: Any) -> Any:
    types = needs("openai.types", "openai")
    usage = needs("openai.types.create_embedding_response", "openai").Usage(prompt_tokens=0, total_tokens=0)
    data = [types.Embedding(embedding=row, index=i, object="embedding") for i, row in enumerate(rows)]
    return types.CreateEmbeddingResponse(data=data, model=str(model), object="list", usage=usage)


# -- generation -----------------------------------------------------------------------------


async def _raising(events: Any) -> AsyncIterator[Any]:
    """The Responses API's events, an ``error`` or ``response.failed`` event raised as the SDK's
    ``APIError`` (the SDK yields them as events), so the stage counts the failure and retries or
    falls back before the first token, as it does for a chat stream's error."""
    async for event in events:
        kind = getattr(event, "type", None)
        if kind == "error" or kind == "response.failed":
            openai = needs("openai", "openai")
            error = getattr(getattr(event, "response", None), "error", None) or event
            code, message = getattr(error, "code", None), getattr(error, "message", None)
            body = {"type": kind, "code": code, "message": message}
            raise openai.APIError(str(message or kind), request=events.response.request, body=body)
        yield event


def _chat_preamble(chunk: Any) -> bool:
    if getattr(chunk, "usage", None) is not None:
        return False
    for choice in getattr(chunk, "choices", None) or ():
        delta = choice.delta
        if choice.finish_reason or delta.content or delta.tool_calls or getattr(delta, "refusal", None):
            return False
    return True


def _chat_tokens(chunk: Any) -> int:
    n = 0
    for choice in getattr(chunk, "choices", None) or ():
        delta = choice.delta
        n += count_text(delta.content, getattr(delta, "refusal", None))
        for call in delta.tool_calls or ():
            n += count_text(getattr(call.function, "arguments", None) if call.function else None)
    return n


def _chat_prompt(kwargs: Mapping[str, Any]) -> int:
    return prompt_tokens(kwargs.get("messages"))


def _responses_prompt(kwargs: Mapping[str, Any]) -> int:
    return prompt_tokens(kwargs.get("input"), kwargs.get("instructions"))


def _chat_usage(chunk: Any) -> Usage | None:
    usage = getattr(chunk, "usage", None)
    if usage is None:
        return None
    return usage_of(getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None))


_whole_chat_usage = _chat_usage


_RESPONSES_PREAMBLE = frozenset(
    {"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
)


def _responses_preamble(event: Any) -> bool:
    return getattr(event, "type", None) in _RESPONSES_PREAMBLE


def _responses_tokens(event: Any) -> int:
    kind = getattr(event, "type", "")
    return count_text(getattr(event, "delta", None)) if kind.endswith(".delta") else 0


def _responses_usage(event: Any) -> Usage | None:
    if getattr(event, "type", None) != "response.completed":
        return None
    return _whole_responses_usage(event.response)


def _whole_responses_usage(response: Any) -> Usage | None:
    usage = getattr(response, "usage", None)
    if usage is None:
        return None
    return usage_of(getattr(usage, "input_tokens", None), getattr(usage, "output_tokens", None))


# -- continuation ---------------------------------------------------------------------------

CONTINUE_INSTRUCTION = (
    "Your answer above was cut off. Continue it exactly where it stops, without repeating any of "
    "it and without any preamble."
)
"""The instruction :func:`continuation_messages` sends after the partial answer."""


def continuation_messages(
    messages: Any, partial_text: str, *, instruction: str = CONTINUE_INSTRUCTION
) -> list[Any]:
    """The chat messages that ask an OpenAI-compatible server for the rest of an answer cut at
    ``partial_text``: ``messages``, then the partial answer as an assistant message, then
    ``instruction`` as a user message. The model may still repeat the end of the partial answer:
    ragguard trims that repeat (:class:`ragguard.rag.Overlap`)."""
    return [
        *(messages or ()),
        {"role": "assistant", "content": partial_text},
        {"role": "user", "content": instruction},
    ]


class ChatContinuation(ClientContinuation):
    """How a wrapped OpenAI client continues its chat streams (see :func:`continue_chat`)."""

    resource = ("chat", "completions")
    default_name = "continue_chat"

    def __init__(
        self,
        client: Any = None,
        *,
        model: str | None = None,
        name: str | None = None,
        instruction: str = CONTINUE_INSTRUCTION,
    ) -> None:
        super().__init__(client, model=model, name=name)
        self.instruction = instruction

    def request(self, kwargs: Any, partial: Partial) -> dict[str, Any]:
        asked = dict(kwargs)
        asked["messages"] = continuation_messages(
            kwargs.get("messages"), partial.text or "", instruction=self.instruction
        )
        if self.model is not None:
            asked["model"] = self.model
        return asked

    def refuses(self, kwargs: Any, structured: bool) -> str | None:
        n = kwargs.get("n")
        if isinstance(n, int) and n > 1:
            return "n > 1: several answers cannot be continued as one"
        if structured:
            return None
        if kwargs.get("tools") or kwargs.get("functions"):
            return "the request offers tools (continue_structured=True to continue it anyway)"
        form = kwargs.get("response_format")
        if form is not None and not (isinstance(form, dict) and form.get("type") == "text"):
            return "the request asks for structured output (continue_structured=True to continue it anyway)"
        return None

    async def rewrite(self, events: Any, partial: Partial) -> AsyncIterator[Any]:
        trim = partial.overlap()
        template = None
        async for chunk in events:
            choices = getattr(chunk, "choices", None)
            if not choices:
                yield chunk  # the usage chunk
                continue
            if _chat_preamble(chunk):
                continue  # the continuation's role-only chunk: the caller has had its own
            choice = choices[0]
            text = choice.delta.content
            finish = choice.finish_reason
            kept = trim.feed(text) if text else text
            if finish is not None and not trim.done:
                kept = (kept or "") + trim.flush()
            if kept == text:
                yield chunk
            elif kept or finish is not None or choice.delta.tool_calls:
                yield _with_content(chunk, kept or None)
            if text:
                template = chunk
        held = trim.flush()
        if held and template is not None:  # a stream that ended without its finish chunk
            yield _with_content(template, held)


def continue_chat(
    client: Any = None,
    *,
    model: str | None = None,
    name: str | None = None,
    instruction: str = CONTINUE_INSTRUCTION,
) -> ChatContinuation:
    """A continuation for ``guard_openai(..., continuation=continue_chat(...))``: a chat stream
    cut after its first token asks ``client`` for the rest of the answer, the partial answer as an
    assistant message followed by ``instruction`` (:func:`continuation_messages`), the request's
    other arguments unchanged (``model`` in place of its model when given).

    ``client``: None for the wrapped client itself (under the stage's continuation budgets and
    tokens); another ``guard_openai`` client (another deployment: under its own stage, breaker
    and budgets); or a plain ``AsyncOpenAI``. ``name``: what ``StreamEnding.continued_by`` and
    :func:`ragguard.degraded` call it (default ``model``, else ``"continue_chat"``). The events
    that open the new stream (its role-only chunk) are left out, and the text it repeats of the
    partial answer is trimmed. A request with ``n`` > 1, tools or a ``response_format`` other than
    text is not continued (unless ``continue_structured=True``: tools and structured output)."""
    return ChatContinuation(client, model=model, name=name, instruction=instruction)


def _with_content(chunk: Any, content: str | None) -> Any:
    copy = chunk.model_copy(deep=True)
    copy.choices[0].delta.content = content
    return copy


def _chat_text(chunk: Any) -> str | None:
    """A chat chunk's text (the stage's ``text=``): "" for one without (a role-only or usage
    chunk), None for one that is not text (a tool call, a refusal, a second choice)."""
    parts = []
    for choice in getattr(chunk, "choices", None) or ():
        delta = choice.delta
        if choice.index != 0 or delta.tool_calls or getattr(delta, "function_call", None):
            return None
        if getattr(delta, "refusal", None):
            return None
        parts.append(delta.content or "")
    return "".join(parts)
