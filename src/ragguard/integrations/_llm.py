"""The generation stage of an LLM SDK's ``create`` (OpenAI's chat completions and responses,
Anthropic's messages): a stream opened up to its first token, or a whole response as a stream of
one item, its tokens reserved from estimates (the output bound the request sets, the input its
messages' text) and settled from the usage it reports, its model's limits applied, its attempts
numbered as the SDK numbers its own."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Self

import ragguard

from ._common import (
    Attempts,
    Stages,
    endpoint_of,
    fallbacks,
    held_back,
    model_key,
    one_item,
    open_stream,
    sdk_options,
    streamed,
)

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
    """``create`` of a generation resource (chat completions, responses), as the generation stage,
    keyed by ``<endpoint>/<model>`` unless ``keyed`` is False (see :func:`model_key`); ``provider``
    is the GenAI semantic conventions' ``gen_ai.provider.name`` its spans and metrics carry.

    ``create`` carries ``__ragguard_deployment__(model)``: where its calls of ``model`` run, as
    ``(guard, stage, key)``: a function returning the Guard, the stage's name and the key (what a
    model group reads a deployment's health from; :mod:`ragguard.groups`)."""

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
        usage: Callable[[Any], Any],
        whole_usage: Callable[[Any], Any],
        budget: tuple[str, ...],
        include_usage: bool,
        prompt: Callable[[Mapping[str, Any]], int],
        wrap_events: Callable[[Any], AsyncIterator[Any]] | None = None,
        continuation: Callable[..., Any] | None = None,
        text: Callable[[Any], str | None] | None = None,
        continue_structured: bool | None = None,
        client: Any = None,
        keyed: bool = True,
        provider: str = "",
    ) -> None:
        self._include_usage = include_usage
        self.stages = stages
        self.stage = stage
        self.key = model_key(endpoint_of(getattr(client, "base_url", None))) if keyed else None

        # The generation preset's options read the call's arguments: the attempt counter first
        # (positional only), then the SDK's keyword arguments.
        def estimate(attempts: Attempts, /, **kwargs: Any) -> int:
            for name in budget:
                given = kwargs.get(name)
                if isinstance(given, int) and not isinstance(given, bool) and given > 0:
                    n = kwargs.get("n")
                    return given * (n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1)
            return stages.estimate_default(stage)

        def input_tokens(attempts: Attempts, /, **kwargs: Any) -> int:
            return prompt(kwargs)

        def model(attempts: Attempts, /, **kwargs: Any) -> str | None:
            name = kwargs.get("model")
            return name if isinstance(name, str) else None

        async def stream(attempts: Attempts, /, **kwargs: Any) -> AsyncIterator[Any]:
            options = sdk_options(stages, stage, kwargs, tenant_header, retries=attempts.next())
            events = await resource.create(**options)
            async with events:
                source = wrap_events(events) if wrap_events is not None else events
                async for event in held_back(source, is_preamble):
                    yield event

        async def whole(attempts: Attempts, /, **kwargs: Any) -> AsyncIterator[Any]:
            options = sdk_options(stages, stage, kwargs, tenant_header, retries=attempts.next())
            yield await resource.create(**options)

        for fn in (stream, whole):  # what spans and metrics name as gen_ai.provider.name
            fn.__ragguard_provider__ = provider  # type: ignore[attr-defined]
        preset = {"estimate": estimate, "input_tokens": input_tokens, "model": model}
        continues = {"continuation": continuation, "text": text, "continue_structured": continue_structured}
        self._stream = stages.decorate(
            stage, stream, fallback=fallbacks(fallback, _given_kwargs), key=self.key, tokens=tokens,
            usage=usage, **preset, **continues,
        )  # fmt: skip
        self._whole = stages.decorate(
            stage,
            whole,
            fallback=fallbacks(fallback, lambda fn: _given_kwargs(streamed(fn))),
            key=self.key,
            tokens=_no_tokens,
            usage=whole_usage,
            **preset,
        )
        # as another call's fallback, ragguard.degraded() names it by its stage (a client of its own)
        self.create: Callable[..., Awaitable[Any]] = ragguard.named(stage, self._create)
        self.create.__ragguard_deployment__ = self.deployment  # type: ignore[attr-defined]

    def deployment(self, model: str | None) -> tuple[Callable[[], ragguard.Guard], str, str | None]:
        """Where this create's calls of ``model`` run: a function returning the Guard, the stage
        and the key (None: the stage's own instance)."""
        key = None if self.key is None else self.key(model=model)
        return self.stages.current_guard, self.stage, key

    async def _create(self, **kwargs: Any) -> Any:
        """The SDK's ``create(**kwargs)`` as the generation stage: with ``stream=True`` a stream
        opened up to its first token (``async for``, ``close()``), else the whole response.
        Raises what the SDK raised when no retry or fallback served, or ragguard's refusals."""
        if not kwargs.get("stream"):
            return await one_item(self._whole(Attempts(), **kwargs))
        drop = None
        if self._include_usage and kwargs.get("stream_options") is None:
            kwargs = {**kwargs, "stream_options": {"include_usage": True}}
            drop = _usage_only
        return await open_stream(self._stream(Attempts(), **kwargs), drop)


def _given_kwargs(fallback: Callable[..., Any]) -> Callable[..., Any]:
    """``fallback`` called with the keyword arguments of ``create`` only (the attempt counter
    before them is the wrapper's), under its own name for :func:`ragguard.degraded`."""

    @functools.wraps(fallback)
    def serve(attempts: Attempts, /, **kwargs: Any) -> Any:
        return fallback(**kwargs)

    return serve


def _no_tokens(item: Any) -> int:
    return 0


def _usage_only(chunk: Any) -> bool:
    return not getattr(chunk, "choices", None) and getattr(chunk, "usage", None) is not None
