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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ragguard import Guard
from ragguard.rag import Usage

from ._common import Stages, count_text, header_option, needs, prompt_tokens, usage_of
from ._llm import Fallback, Generation, GuardedClient, Resource

__all__ = ["GuardedAnthropic", "guard_anthropic"]


def guard_anthropic(
    client: Any,
    *,
    guard: Guard | None = None,
    generation_stage: str = "anthropic",
    tenant_header: str | None = None,
    fallback: Fallback = None,
    keyed: bool = True,
) -> GuardedAnthropic:
    """``client`` (an ``anthropic.AsyncAnthropic``) guarded by ``guard`` (None: the default
    registry at each call); ``fallback`` serves ``messages.create`` (called with its keyword
    arguments) when the stage fails before the first token; ``tenant_header`` the header the
    tenant travels in (None: the Guard's ``tenant_header``). Raises ConfigError for a bad
    ``guard`` or ``tenant_header``; ImportError with the install command when ``anthropic`` is
    missing. ``keyed=False`` runs every model on the stage's own instance (one breaker for all)."""
    needs("anthropic", "anthropic")
    return GuardedAnthropic(
        client,
        stages=Stages(guard),
        generation_stage=generation_stage,
        tenant_header=header_option(tenant_header),
        fallback=fallback,
        keyed=keyed,
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
    ) -> None:
        super().__init__(
            client,
            stages=stages,
            generation_stage=generation_stage,
            tenant_header=tenant_header,
            fallback=fallback,
            keyed=keyed,
        )
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
