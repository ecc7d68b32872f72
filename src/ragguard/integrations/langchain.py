"""LangChain (``langchain-core``), guarded: ``pip install '/path/to/ragguard[langchain]'``.

::

    from ragguard.integrations.langchain import GuardedRunnable, TenantRateLimiter

    chain = prompt | GuardedRunnable(ChatOpenAI(model=m, max_retries=0), "generation",
                                     fallback=ChatOpenAI(model=small, max_retries=0)) | parser
    async for text in chain.astream({"question": q}): ...
    model = ChatAnthropic(model=m, rate_limiter=TenantRateLimiter())   # the tenant's rate

- :class:`GuardedRunnable` runs any ``Runnable`` as a stage: ``ainvoke`` as a call, ``astream``
  as a stream (chunks before the first token, a chat model's empty role chunk, come with it; the
  stage's stream budgets, commit point and token accounting when it has the
  generation preset: the input's text / 4 and each chunk's text / 4, replaced by the
  ``usage_metadata`` input and output tokens a chat model's chunks report; the model's limits,
  ``TenantQuota.models``, for the runnable's ``model_name`` or ``model``), ``abatch`` as one
  guarded call per input (LangChain's own ``abatch`` over ``ainvoke``, so each input is retried
  or served by a fallback on its own). ``fallback`` is a Runnable (or a callable of the input), or
  a sequence tried in order; a fallback of a stream streams. The Guard's ``tenant_header`` goes
  to a chat model whose SDK takes headers per call (one with ``default_headers``: ChatOpenAI,
  ChatAnthropic), as its ``extra_headers``, fallbacks included. Give the model
  ``max_retries=0``: ragguard's retry is the loop. Sync ``invoke``/``stream``/``batch`` raise
  TypeError: a guarded runnable runs async.
- :class:`TenantRateLimiter` is a ``BaseRateLimiter`` (a chat model's ``rate_limiter=``) that
  takes each model request from the current tenant's ``rate_per_s`` / ``burst`` of the Guard's
  policy, first come first served, waiting up to the tenant's ``max_wait_s`` (or the deadline
  left), else raising :class:`~ragguard.QuotaExceeded` with ``retry_after_s``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import ragguard
from ragguard import Guard, QuotaExceeded, TenantQuota
from ragguard.quotas import LocalQuotas
from ragguard.quotas._local import WAIT
from ragguard.rag import Usage

from .._extras import install_hint
from ._common import (
    Stages,
    count_text,
    endpoint_of,
    fallback_name,
    header_option,
    held_back,
    prompt_tokens,
)

try:
    from langchain_core.rate_limiters import BaseRateLimiter
    from langchain_core.runnables import Runnable
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise ImportError(
        f"ragguard's langchain integration needs langchain-core: {install_hint('langchain')}"
    ) from exc

__all__ = ["GuardedRunnable", "TenantRateLimiter", "deployment_key"]


class _Counted:
    """A chunk on its way through the guarded stream, with the input and output tokens the chunks
    so far reported (``usage_metadata``), when this one reported some."""

    __slots__ = ("chunk", "reported")

    def __init__(self, chunk: Any, reported: Usage | None) -> None:
        self.chunk = chunk
        self.reported = reported


def _chunk_text(chunk: Any) -> int:
    if isinstance(chunk, str):
        return count_text(chunk)
    content = getattr(chunk, "content", None)
    if isinstance(content, str):
        return count_text(content)
    if isinstance(content, list):
        return sum(count_text(p if isinstance(p, str) else p.get("text")) for p in content)
    return 1


def _preamble(chunk: Any) -> bool:
    """A chunk before the first token: empty text, no tool call, no usage (a chat model's role
    chunk); held back until the first token (see :func:`~ragguard.integrations._common.held_back`)."""
    if isinstance(chunk, str):
        return not chunk
    content = getattr(chunk, "content", None)
    return (
        content in ("", [])
        and not getattr(chunk, "tool_call_chunks", None)
        and not getattr(chunk, "usage_metadata", None)
    )


def _reported(chunk: Any, name: str) -> int | None:
    usage = getattr(chunk, "usage_metadata", None)
    if not usage:
        return None
    n = usage.get(name)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def _input_text(input: Any) -> int:
    """The input's text / 4: a prompt value's messages, messages, a str, or a chain's variables."""
    to_messages = getattr(input, "to_messages", None)
    if callable(to_messages):
        input = to_messages()
    elif isinstance(input, Mapping):
        input = [v for v in input.values() if isinstance(v, str)]
    return prompt_tokens(input)


def _model_name(runnable: Any) -> str | None:
    """A chat model's name (ChatOpenAI's ``model_name``, ChatAnthropic's ``model``), else None."""
    for name in ("model_name", "model"):
        value = getattr(runnable, name, None)
        if isinstance(value, str) and value:
            return value
    return None


def deployment_key(runnable: Any, model: str | None) -> str:
    """A chat model's deployment: ``<provider>:<endpoint>/<model>`` (``openai-chat:api.openai.com/gpt-4o``),
    from its ``_llm_type``, the host of its ``base_url`` (or ``openai_api_base``,
    ``anthropic_api_url``) and its model; the parts it lacks are left out."""
    provider = getattr(runnable, "_llm_type", None)
    provider = provider if isinstance(provider, str) and provider else type(runnable).__name__
    urls = (getattr(runnable, name, None) for name in ("base_url", "openai_api_base", "anthropic_api_url"))
    endpoint = next((endpoint_of(url) for url in urls if isinstance(url, str) and url), None)
    where = provider if endpoint is None else f"{provider}:{endpoint}"
    return where if model is None else f"{where}/{model}"


class GuardedRunnable(Runnable[Any, Any]):
    """``runnable`` run as stage ``stage`` of ``guard`` (None: the default registry at each
    call); see the module docstring. ``tokens`` (chunk -> int) and ``estimate`` (int tokens) are
    the generation preset's options for ``astream``; ``model`` the model whose limits apply
    (default: the runnable's ``model_name`` or ``model``); ``tenant_header`` the header the tenant
    travels in (default: the Guard's). The stage is keyed by the runnable's deployment
    (:func:`deployment_key`: its provider, endpoint and model), so two models guarded as one stage
    each have their own breaker, budgets and limits; ``keyed=False`` gives them the stage's one.
    Raises ConfigError at construction for a bad option (as ``@guard`` does)."""

    def __init__(
        self,
        runnable: Any,
        stage: str,
        *,
        guard: Guard | None = None,
        fallback: Any = None,
        tokens: Callable[[Any], int] | None = None,
        estimate: int | None = None,
        model: str | None = None,
        tenant_header: str | None = None,
        keyed: bool = True,
    ) -> None:
        self.runnable = runnable
        self.stage = stage
        self.name = runnable.get_name()  # the same step of the chain, guarded
        stages = Stages(guard)
        served = _as_tuple(fallback)
        count = tokens or _chunk_text
        header = header_option(tenant_header)
        name = model if model is not None else _model_name(runnable)
        self.key = deployment_key(runnable, name) if keyed else None
        key = None if self.key is None else (lambda *args, **kwargs: self.key)

        def sent(target: Any, kwargs: Mapping[str, Any]) -> dict[str, Any]:
            """``kwargs`` with the tenant header for ``target``'s requests."""
            return _headers(target, stages.tenant_header(header), kwargs)

        async def call(input: Any, config: Any, kwargs: dict[str, Any]) -> Any:
            return await runnable.ainvoke(input, config, **sent(runnable, kwargs))

        async def stream(input: Any, config: Any, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
            inputs = outputs = 0
            seen = False
            chunks = runnable.astream(input, config, **sent(runnable, kwargs))
            async for chunk in held_back(chunks, _preamble):
                n_in, n_out = _reported(chunk, "input_tokens"), _reported(chunk, "output_tokens")
                if n_in is not None or n_out is not None:
                    # LangChain's chunks add up: usage_metadata is this chunk's part
                    inputs, outputs, seen = inputs + (n_in or 0), outputs + (n_out or 0), True
                yield _Counted(chunk, Usage(inputs, outputs) if seen else None)

        self._stages = stages
        self._call = stages.decorate(
            stage, call, fallback=tuple(_invoking(f, sent) for f in served) or None, key=key
        )
        self._stream = stages.decorate(
            stage,
            stream,
            fallback=tuple(_streaming(f, sent) for f in served) or None,
            key=key,
            tokens=lambda item: count(item.chunk) if isinstance(item, _Counted) else 0,
            usage=lambda item: item.reported if isinstance(item, _Counted) else None,
            estimate=estimate,
            input_tokens=lambda input, config, kwargs: _input_text(input),
            model=lambda input, config, kwargs: name,
        )

    def __ragguard_deployment__(self, model: str | None) -> tuple[Callable[[], Guard], str, str | None]:
        """Where this runnable's calls run: a function returning the Guard, the stage and the key
        (``model`` is ignored: the runnable has its own)."""
        return self._stages.current_guard, self.stage, self.key

    @property
    def InputType(self) -> Any:
        return self.runnable.InputType

    @property
    def OutputType(self) -> Any:
        return self.runnable.OutputType

    def get_input_schema(self, config: Any = None) -> Any:
        return self.runnable.get_input_schema(config)

    def get_output_schema(self, config: Any = None) -> Any:
        return self.runnable.get_output_schema(config)

    def invoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        raise TypeError(
            f"{self.name} runs async only (ainvoke, astream, abatch): ragguard guards the event loop's calls"
        )

    async def ainvoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        """``runnable.ainvoke(input, config, **kwargs)`` as the stage."""
        return await self._call(input, config, kwargs)

    async def astream(self, input: Any, config: Any = None, **kwargs: Any) -> AsyncIterator[Any]:
        """``runnable.astream(input, config, **kwargs)`` as the stage's stream."""
        items = self._stream(input, config, kwargs)
        try:
            async for item in items:
                yield item.chunk if isinstance(item, _Counted) else item
        finally:
            await items.aclose()


def _as_tuple(given: Any) -> tuple[Any, ...]:
    if given is None:
        return ()
    return tuple(given) if isinstance(given, (list, tuple)) else (given,)


def _headers(target: Any, header: str | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs``, with the current tenant in ``header`` among its ``extra_headers`` for a chat
    model whose SDK takes headers per call (it has ``default_headers``, as ChatOpenAI and
    ChatAnthropic do); as they are for any other runnable, or without a header."""
    if header is None or not hasattr(target, "default_headers"):
        return dict(kwargs)
    extra = {**(kwargs.get("extra_headers") or {}), header: ragguard.current_tenant()}
    return {**kwargs, "extra_headers": extra}


Sent = Callable[[Any, Mapping[str, Any]], dict[str, Any]]


def _invoking(fallback: Any, sent: Sent) -> Callable[..., Any]:
    async def serve(input: Any, config: Any, kwargs: dict[str, Any]) -> Any:
        if isinstance(fallback, Runnable):
            return await fallback.ainvoke(input, config, **sent(fallback, {}))
        produced = fallback(input)
        return await produced if hasattr(produced, "__await__") else produced

    serve.__name__ = fallback_name(fallback)
    return serve


def _streaming(fallback: Any, sent: Sent) -> Callable[..., Any]:
    async def serve(input: Any, config: Any, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        if isinstance(fallback, Runnable):
            async for chunk in fallback.astream(input, config, **sent(fallback, {})):
                yield chunk
            return
        produced = fallback(input)
        if hasattr(produced, "__await__"):
            produced = await produced
        if hasattr(produced, "__aiter__"):
            async for chunk in produced:
                yield chunk
        else:
            yield produced

    serve.__name__ = fallback_name(fallback)
    return serve


class TenantRateLimiter(BaseRateLimiter):
    """A LangChain ``BaseRateLimiter`` backed by each tenant's ``rate_per_s`` (see the module
    docstring), in this process: ``guard`` (None: the default registry when first used) gives the
    policy, the clock and the sleep; ``quota_for`` (tenant -> :class:`~ragguard.TenantQuota`)
    replaces the policy's quotas (e.g. a rate of model requests of its own per tenant). Only the
    rate applies: a model request holds no concurrency slot (the request's own ``tenant(...)``
    does).

    ``aacquire(blocking=True)`` waits its turn and returns True, or raises QuotaExceeded when the
    wait would pass ``max_wait_s`` or the deadline; ``blocking=False`` returns False instead of
    waiting. The sync ``acquire`` does the same, sleeping the thread (guarded by a lock)."""

    def __init__(
        self, *, guard: Guard | None = None, quota_for: Callable[[str], TenantQuota] | None = None
    ) -> None:
        self._guard = guard
        self._quota_for = quota_for
        self._quotas: LocalQuotas | None = None
        self._source: Callable[[str], TenantQuota] | None = None
        self._rate_only: dict[int, tuple[TenantQuota, TenantQuota]] = {}
        self._lock = threading.Lock()

    def _backend(self) -> LocalQuotas:
        if self._quotas is None:
            g = self._guard if self._guard is not None else ragguard.default_guard()
            self._source = self._quota_for or g.policy.quota
            self._quotas = LocalQuotas(self._rates, clock=g.clock, sleep=g.sleep)
        return self._quotas

    def _rates(self, tenant: str) -> TenantQuota:
        assert self._source is not None
        quota = self._source(tenant)
        kept = self._rate_only.get(id(quota))
        if kept is not None and kept[0] is quota:
            return kept[1]
        rate_only = quota.model_copy(update={"max_concurrency": None})
        if len(self._rate_only) >= 1024:
            self._rate_only.clear()
        self._rate_only[id(quota)] = (quota, rate_only)
        return rate_only

    async def aacquire(self, *, blocking: bool = True) -> bool:
        quotas = self._backend()
        tenant = ragguard.current_tenant()
        lease = quotas.admit_now(tenant)
        if lease is WAIT:
            if not blocking:
                return False
            lease = await quotas.acquire(tenant)
        quotas.release(lease)
        return True

    def acquire(self, *, blocking: bool = True) -> bool:
        quotas = self._backend()
        tenant = ragguard.current_tenant()
        quota = self._rates(tenant)
        give_up = time.monotonic() + quota.max_wait_s
        while True:
            with self._lock:
                lease = quotas.admit_now(tenant)
            if lease is not WAIT:
                quotas.release(lease)
                return True
            if not blocking:
                return False
            rate = quota.rate_per_s or 1.0
            if time.monotonic() + 1.0 / rate > give_up:
                raise QuotaExceeded(tenant, 1.0 / rate, "rate")
            time.sleep(min(1.0 / rate, 0.05))
