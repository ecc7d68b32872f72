"""What the LLM client wrappers share to continue a generation stream cut after its commit point:
a :class:`ClientContinuation` (``continue_chat()``, ``continue_message()``) names the client that
continues and how; bound to a wrapped client, it becomes the stage's ``continuation=`` function
(see :mod:`ragguard.rag._continuation` for when it runs and what it is given).

The function asks the client for the rest of the answer (the request it continues, with the
partial answer in it as the SDK's recipe says: an assistant message and an instruction to continue
for OpenAI-compatible servers, an assistant prefill for Anthropic) and hands over the events of
that stream as the caller's stream would have gone on: the events that open a message are left
out (the caller has had them), and the text the model repeats of the partial answer is trimmed
(:meth:`ragguard.rag.Partial.overlap`). A request that asks for tools or structured output is not
continued (``FallbackMiss``) unless the stage declares it safe (``continue_structured=True``), and
neither is a stream whose items are not all text: a tool call cannot be resumed from text.

A client that is itself wrapped (``guard_openai(...)``) continues under its own stage (its breaker,
budgets, tokens); a plain SDK client, or the wrapped client's own (``continue_chat()`` with no
client), under the stage's continuation budgets and token accounting.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from ragguard.rag import FallbackMiss, Partial

from ._common import Stages, sdk_options

__all__ = ["ClientContinuation", "continuation_options"]


class ClientContinuation:
    """How a wrapped client continues its generation streams: ``client`` (a wrapped client, an SDK
    client, or None for the wrapped client's own), ``model`` (None: the request's), ``name`` (what
    :attr:`ragguard.StreamEnding.continued_by` and :func:`ragguard.degraded` call it).

    A subclass says which resource creates the stream (``resource``), how the request is asked
    again with the partial answer (:meth:`request`), what makes a request one not to continue
    (:meth:`refuses`) and how the new stream's events follow the caller's (:meth:`rewrite`)."""

    resource: tuple[str, ...] = ()
    default_name = "continuation"

    def __init__(self, client: Any = None, *, model: str | None = None, name: str | None = None) -> None:
        if model is not None and (not isinstance(model, str) or not model):
            raise ValueError(f"model must be a non-empty str or None, got {model!r:.40}")
        self.client = client
        self.model = model
        self.name = name or model or self.default_name

    def request(self, kwargs: Mapping[str, Any], partial: Partial) -> dict[str, Any]:
        """The keyword arguments of ``create`` that ask for the rest of the answer."""
        raise NotImplementedError

    def refuses(self, kwargs: Mapping[str, Any], structured: bool) -> str | None:
        """Why the request ``kwargs`` is not one to continue (None: it is)."""
        return None

    def rewrite(self, events: Any, partial: Partial) -> AsyncIterator[Any]:
        """The continuation's events as the caller's stream goes on (trimmed, opening left out)."""
        raise NotImplementedError

    def bind(
        self, stages: Stages, stage: str, tenant_header: str | None, own: Any, *, structured: bool
    ) -> Callable[..., AsyncIterator[Any]]:
        """The stage's ``continuation=`` function for a wrapped client whose SDK client is ``own``."""
        target = self.client if self.client is not None else own
        resource = functools.reduce(getattr, self.resource, target)
        wrapped_stage = _stage_of(target)
        outer = self

        async def continuation(*args: Any, partial: Partial, **kwargs: Any) -> AsyncIterator[Any]:
            refused = outer.refuses(kwargs, structured)
            if refused is None and partial.text is None:
                refused = "the answer so far is not text"
            if refused is not None:
                raise FallbackMiss(refused)
            asked = outer.request(kwargs, partial)
            if wrapped_stage is None:
                asked = sdk_options(stages, stage, asked, tenant_header)
            events = await resource.create(**asked)
            try:
                async for event in outer.rewrite(events, partial):
                    yield event
            finally:
                close = getattr(events, "aclose", None) or getattr(events, "close", None)
                if close is not None:
                    await close()

        continuation.__name__ = continuation.__qualname__ = self.name
        if wrapped_stage is not None:  # runs under its own stage: ragguard reads this mark
            continuation.__ragguard_stage__ = wrapped_stage  # type: ignore[attr-defined]
        return continuation

    def options(
        self,
        stages: Stages,
        stage: str,
        tenant_header: str | None,
        own: Any,
        *,
        structured: bool,
        text: Callable[[Any], str | None],
    ) -> dict[str, Any]:
        """The generation preset's options of a wrapped client's stream: the bound continuation
        (:meth:`bind`), ``text=`` (how its events read as text) and ``continue_structured=``."""
        bound = self.bind(stages, stage, tenant_header, own, structured=structured)
        return {"continuation": bound, "text": text, "continue_structured": structured}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def continuation_options(
    continuation: ClientContinuation | None,
    stages: Stages,
    stage: str,
    tenant_header: str | None,
    own: Any,
    *,
    structured: bool,
    text: Callable[[Any], str | None],
) -> dict[str, Any]:
    """:meth:`ClientContinuation.options`, or none without a continuation."""
    if continuation is None:
        return {}
    return continuation.options(stages, stage, tenant_header, own, structured=structured, text=text)


def _stage_of(client: Any) -> str | None:
    """The generation stage of a wrapped client (None for an SDK client)."""
    options = getattr(client, "_options", None)
    if isinstance(options, Mapping) and "generation_stage" in options:
        return str(options["generation_stage"])
    return None
