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
  generation preset: each chunk's text / 4, replaced by the ``usage_metadata`` output tokens a
  chat model's chunks report), ``abatch`` as one guarded call per input (LangChain's own
  ``abatch`` over ``ainvoke``, so each input is retried or served by a fallback on its own).
  ``fallback`` is a Runnable (or a callable of the input), or a sequence tried in order; a
  fallback of a stream streams. Give the model ``max_retries=0``: ragguard's retry is the loop.
  Sync ``invoke``/``stream``/``batch`` raise TypeError: a guarded runnable runs async.
- :class:`TenantRateLimiter` is a ``BaseRateLimiter`` (a chat model's ``rate_limiter=``) that
  takes each model request from the current tenant's ``rate_per_s`` / ``burst`` of the Guard's
  policy, first come first served, waiting up to the tenant's ``max_wait_s`` (or the deadline
  left), else raising :class:`~ragguard.QuotaExceeded` with ``retry_after_s``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import ragguard
from ragguard import Guard, QuotaExceeded, TenantQuota
from ragguard.quotas import WAIT, LocalQuotas

from .._extras import install_hint
from ._common import Stages, count_text, held_back

try:
    from langchain_core.rate_limiters import BaseRateLimiter
    from langchain_core.runnables import Runnable
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise ImportError(
        f"ragguard's langchain integration needs langchain-core: {install_hint('langchain')}"
    ) from exc

__all__ = ["GuardedRunnable", "TenantRateLimiter"]


class _Counted:
    """A chunk on its way through the guarded stream, with the output tokens the chunks so far
    reported (``usage_metadata``), when this one reported some."""

    __slots__ = ("chunk", "reported")

    def __init__(self, chunk: Any, reported: int | None) -> None:
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


def _output_tokens(chunk: Any) -> int | None:
    usage = getattr(chunk, "usage_metadata", None)
    if not usage:
        return None
    n = usage.get("output_tokens")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


class GuardedRunnable(Runnable[Any, Any]):
    """``runnable`` run as stage ``stage`` of ``guard`` (None: the default registry at each
    call); see the module docstring. ``tokens`` (chunk -> int) and ``estimate`` (int tokens) are
    the generation preset's options for ``astream``. Raises ConfigError at construction for a bad
    option (as ``@guard`` does)."""

    def __init__(
        self,
        runnable: Any,
        stage: str,
        *,
        guard: Guard | None = None,
        fallback: Any = None,
        tokens: Callable[[Any], int] | None = None,
        estimate: int | None = None,
    ) -> None:
        self.runnable = runnable
        self.stage = stage
        self.name = runnable.get_name()  # the same step of the chain, guarded
        stages = Stages(guard)
        served = _as_tuple(fallback)
        count = tokens or _chunk_text

        async def call(input: Any, config: Any, kwargs: dict[str, Any]) -> Any:
            return await runnable.ainvoke(input, config, **kwargs)

        async def stream(input: Any, config: Any, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
            reported = 0
            seen = False
            async for chunk in held_back(runnable.astream(input, config, **kwargs), _preamble):
                n = _output_tokens(chunk)
                if n is not None:
                    reported += n  # LangChain's chunks add up: usage_metadata is this chunk's part
                    seen = True
                yield _Counted(chunk, reported if n is not None and seen else None)

        self._call = stages.decorate(stage, call, fallback=tuple(_invoking(f) for f in served) or None)
        self._stream = stages.decorate(
            stage,
            stream,
            fallback=tuple(_streaming(f) for f in served) or None,
            tokens=lambda item: count(item.chunk) if isinstance(item, _Counted) else 0,
            usage=lambda item: item.reported if isinstance(item, _Counted) else None,
            estimate=estimate,
        )

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


def _name_of(fallback: Any) -> str:
    get_name = getattr(fallback, "get_name", None)
    return str(get_name()) if callable(get_name) else getattr(fallback, "__name__", type(fallback).__name__)


def _invoking(fallback: Any) -> Callable[..., Any]:
    async def serve(input: Any, config: Any, kwargs: dict[str, Any]) -> Any:
        if isinstance(fallback, Runnable):
            return await fallback.ainvoke(input, config)
        produced = fallback(input)
        return await produced if hasattr(produced, "__await__") else produced

    serve.__name__ = _name_of(fallback)
    return serve


def _streaming(fallback: Any) -> Callable[..., Any]:
    async def serve(input: Any, config: Any, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        if isinstance(fallback, Runnable):
            async for chunk in fallback.astream(input, config):
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

    serve.__name__ = _name_of(fallback)
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
