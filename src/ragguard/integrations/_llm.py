"""The generation stage of an LLM SDK's ``create`` (OpenAI's chat completions and responses,
Anthropic's messages): a stream opened up to its first token, or a whole response as a stream of
one item, its tokens reserved from an estimate and settled from the usage it reports."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Self

from ._common import Stages, fallbacks, held_back, one_item, open_stream, sdk_options, streamed

__all__ = ["Fallback", "Generation", "Resource"]

Fallback = Callable[..., Any] | Sequence[Callable[..., Any]] | None
"""A user's fallback of a generation call: a callable, or a sequence tried in order."""


class Resource:
    """An SDK resource with some methods guarded (``members``); the others are the resource's."""

    def __init__(self, resource: Any, **members: Any) -> None:
        self._resource = resource
        self.__dict__.update(members)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._resource, name)


class GuardedClient:
    """An SDK client with its retries off and some resources guarded: ``with_options`` (and its
    alias ``copy``) gives another client guarded the same way; other attributes are the client's."""

    def __init__(self, client: Any, **options: Any) -> None:
        self.client = client.with_options(max_retries=0)
        self._options = options

    def with_options(self, **options: Any) -> Self:
        """The SDK's ``with_options`` (a timeout, headers, another base URL...), still guarded the
        same way (and still without the SDK's retries)."""
        return type(self)(self.client.with_options(**options), **self._options)

    copy = with_options

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


class Generation:
    """``create`` of a generation resource (chat completions, responses), as the generation stage."""

    def __init__(
        self,
        resource: Any,
        stages: Stages,
        stage: str,
        tenant_header: str | None,
        fallback: Fallback,
        *,
        is_preamble: Callable[[Any], bool],
        tokens: Callable[[Any], int],
        usage: Callable[[Any], int | None],
        whole_usage: Callable[[Any], int | None],
        budget: tuple[str, ...],
        include_usage: bool,
        wrap_events: Callable[[Any], AsyncIterator[Any]] | None = None,
        continuation: Callable[..., Any] | None = None,
        text: Callable[[Any], str | None] | None = None,
        continue_structured: bool | None = None,
    ) -> None:
        self._include_usage = include_usage

        def estimate(**kwargs: Any) -> int:
            for name in budget:
                given = kwargs.get(name)
                if isinstance(given, int) and not isinstance(given, bool) and given > 0:
                    n = kwargs.get("n")
                    return given * (n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1)
            return stages.estimate_default(stage)

        async def stream(**kwargs: Any) -> AsyncIterator[Any]:
            options = sdk_options(stages, stage, kwargs, tenant_header)
            events = await resource.create(**options)
            async with events:
                source = wrap_events(events) if wrap_events is not None else events
                async for event in held_back(source, is_preamble):
                    yield event

        async def whole(**kwargs: Any) -> AsyncIterator[Any]:
            yield await resource.create(**sdk_options(stages, stage, kwargs, tenant_header))

        continues = {"continuation": continuation, "text": text, "continue_structured": continue_structured}
        self._stream = stages.decorate(
            stage, stream, fallback=fallbacks(fallback), tokens=tokens, usage=usage, estimate=estimate,
            **continues,
        )  # fmt: skip
        self._whole = stages.decorate(
            stage,
            whole,
            fallback=fallbacks(fallback, streamed),
            tokens=_no_tokens,
            usage=whole_usage,
            estimate=estimate,
        )

    async def create(self, **kwargs: Any) -> Any:
        """The SDK's ``create(**kwargs)`` as the generation stage: with ``stream=True`` a stream
        opened up to its first token (``async for``, ``close()``), else the whole response.
        Raises what the SDK raised when no retry or fallback served, or ragguard's refusals."""
        if not kwargs.get("stream"):
            return await one_item(self._whole(**kwargs))
        drop = None
        if self._include_usage and kwargs.get("stream_options") is None:
            kwargs = {**kwargs, "stream_options": {"include_usage": True}}
            drop = _usage_only
        return await open_stream(self._stream(**kwargs), drop)


def _no_tokens(item: Any) -> int:
    return 0


def _usage_only(chunk: Any) -> bool:
    return not getattr(chunk, "choices", None) and getattr(chunk, "usage", None) is not None
