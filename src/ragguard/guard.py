"""``@guard("stage")``: one guarded call, composed outside in.

::

    fallback           typed: cached embedding / the user's keyword search / smaller batch, skip rerank
     tenant quota      per call only outside a ``tenant(...)`` block (inside, the request was admitted)
      deadline         min(caller's deadline, tenant timeout); no attempt starts with < min_attempt_s
       retry           tenacity, retryable kinds only, backoff cut to the deadline, retry budget
        breaker        the stage's typed breaker: BreakerOpen while open
         timeout       min(stage timeout, remaining deadline) per attempt
          the call     (chaos faults are injected here)

The happy path allocates nothing it does not need: no retry state until an attempt fails, no event
unless someone listens, no timer per call (see ``_timeouts``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import random
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar, cast, overload

import anyio

from . import _inject
from . import metrics as _metrics
from ._clock import Clock, monotonic
from ._context import DEFAULT_TENANT, _scope, current_tenant, degraded, mark_degraded
from ._errors import BreakerOpen, ConfigError, DeadlineExceeded, QuotaExceeded, RagguardError
from ._timeouts import _TICKS_PER_S, AttemptTimeout, call_with_timeout, next_number, wheel_for
from .breakers import (
    CircuitBreaker,
    EmbeddingTimeoutBreaker,
    RerankOOMBreaker,
    VectorStoreUnavailableBreaker,
    counts_by_default,
    is_connection_error,
    is_out_of_memory,
    is_timeout,
)
from .deadline import _deadline, _monotonic, remaining
from .events import FallbackServed, RetryBudgetExhausted, RetryScheduled, bus
from .fallbacks import BatchShrinker, EmbeddingCache
from .policy import Policy, StagePolicy
from .quotas import WAIT, LocalQuotas, QuotaBackend, TenantContext
from .retry import RetryBudget, deadline_aware_retrying

__all__ = ["Guard", "Stage", "configure", "default_guard", "guard", "tenant"]

_get_running_loop = asyncio._get_running_loop
if sys.version_info >= (3, 12):
    _task_of: Callable[[Any], Any] = asyncio.current_task  # C-accelerated from 3.12
else:  # pragma: no cover - 3.11's current_task is Python code around this dict
    _task_of = asyncio.tasks._current_tasks.get  # type: ignore[attr-defined]

P = ParamSpec("P")
R = TypeVar("R")
Y = TypeVar("Y")

_BREAKER_KINDS: dict[str, type[CircuitBreaker]] = {
    "embedding_timeout": EmbeddingTimeoutBreaker,
    "vector_store_unavailable": VectorStoreUnavailableBreaker,
    "rerank_oom": RerankOOMBreaker,
    "generic": CircuitBreaker,
}
_RETRY_CLASSIFIERS: dict[str, Callable[[BaseException], bool]] = {
    "connection": is_connection_error,
    "timeout": is_timeout,
    "out_of_memory": is_out_of_memory,
}


class _Bound:
    """One decorated function: its stage name and the options given to ``@guard``."""

    __slots__ = (
        "batch_arg",
        "breaker",
        "fallback",
        "fallback_name",
        "fn",
        "stage",
        "texts_arg",
        "texts_name",
    )

    def __init__(
        self,
        stage: str,
        fn: Callable[..., Any],
        fallback: Callable[..., Any] | None,
        breaker: Any,
        texts_arg: int | str | None,
        batch_arg: int | str | None,
    ) -> None:
        self.stage = stage
        self.fn = fn
        self.fallback = fallback
        self.fallback_name = None if fallback is None else getattr(fallback, "__name__", "fallback")
        self.breaker = breaker
        self.texts_arg = texts_arg
        self.batch_arg = batch_arg
        # the name of the first parameter, so texts passed by keyword are found too
        self.texts_name = _first_param(fn) if texts_arg is None else None


def _first_param(fn: Callable[..., Any]) -> str | None:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if params and params[0].kind in (params[0].POSITIONAL_OR_KEYWORD, params[0].KEYWORD_ONLY):
        return params[0].name
    return None


def _arg(args: tuple[Any, ...], kwargs: Mapping[str, Any], which: int | str) -> Any:
    if isinstance(which, int):
        return args[which] if -len(args) <= which < len(args) else None
    return kwargs.get(which)


def _counting_stage_timeouts(base: Callable[[BaseException], bool]) -> Callable[[BaseException], bool]:
    """``base`` plus the stage's own attempt timeout: a dependency that did not answer within the
    stage's ``timeout_s`` is unwell whatever the breaker's kind (a hung vector store must trip the
    vector-store breaker, not only one that refuses connections)."""

    def counts(exc: BaseException) -> bool:
        return isinstance(exc, AttemptTimeout) or base(exc)

    counts.__name__ = f"{getattr(base, '__name__', 'classifier')}_or_stage_timeout"
    return counts


class Stage:
    """The shared runtime of one named stage in one :class:`Guard`: its breaker, retry budget and
    typed fallback state. Every function decorated with the same stage name shares it."""

    def __init__(self, guard: Guard, name: str, policy: StagePolicy, breaker: Any = None) -> None:
        self.name = name
        self.policy = policy
        self._guard = guard
        self._clock = guard.clock
        kind = policy.breaker.kind
        if breaker is not None:
            self.breaker = _adapt_breaker(breaker)
        elif kind == "none":
            self.breaker = None
        else:
            cls = _BREAKER_KINDS[kind]
            options = policy.breaker.options()
            base = getattr(cls, "defaults", {}).get("classifier")
            if base is not None:
                options["classifier"] = _counting_stage_timeouts(base)
            self.breaker = cls(name, clock=guard.clock, rng=guard.rng, **options)
            if guard.redis is not None:
                from .distributed import SharedCircuitBreaker

                self.breaker = SharedCircuitBreaker(self.breaker, guard.redis, key_prefix=guard.redis_prefix)
                guard._closers.append(self.breaker.aclose)
        self.timeout_s = policy.timeout_s
        self.min_attempt_s = policy.min_attempt_s
        self._min_left = max(policy.min_attempt_s, 0.0)
        retry = policy.retry
        self.retry_policy = retry
        self.budget = (
            RetryBudget(
                ratio=retry.budget_ratio,
                min_per_s=retry.budget_min_per_s,
                window_s=retry.budget_window_s,
                clock=guard.clock,
            )
            if retry.attempts > 1
            else None
        )
        kinds = retry.retry_on
        if "any" in kinds:
            self._retry_classifiers: tuple[Callable[[BaseException], bool], ...] = (self._counts,)
        else:
            self._retry_classifiers = tuple(_RETRY_CLASSIFIERS[k] for k in kinds)
        self.cache = (
            EmbeddingCache(max_entries=policy.cache_size, ttl_s=policy.cache_ttl_s, clock=guard.clock)
            if kind == "embedding_timeout" and policy.cache_size > 0
            else None
        )
        self.shrinker = BatchShrinker(floor=policy.rerank_min_batch) if kind == "rerank_oom" else None
        self._acquire_async: Callable[[], Awaitable[Any]] | None = getattr(
            self.breaker, "acquire_async", None
        )

    # -- classification ---------------------------------------------------------------------

    def _counts(self, exc: BaseException) -> bool:
        breaker = self.breaker
        classifier = (
            getattr(breaker, "classifier", None) or getattr(breaker, "_classifier", None) or counts_by_default
        )
        return bool(classifier(exc))

    def retryable(self, exc: BaseException) -> bool:
        """True when ``exc`` may be retried: classified retryable and not a ragguard rejection."""
        if isinstance(exc, RagguardError) or not isinstance(exc, Exception):
            return False  # tenacity hands cancellations to the predicate too: never retry them
        return any(c(exc) for c in self._retry_classifiers)

    def fallback_applies(self, exc: BaseException) -> bool:
        """True when the stage's fallback should serve after ``exc``."""
        if isinstance(exc, QuotaExceeded):
            return False
        if isinstance(exc, (BreakerOpen, DeadlineExceeded)):
            return True
        if self.policy.fallback_on == "any":
            return True
        if self.breaker is None:
            return not isinstance(exc, (ValueError, TypeError))
        # the dependency failed: what its breaker counts, and any unreachable or timed-out call
        # (an embedding service that refuses connections is served from the cache too)
        return self._counts(exc) or is_connection_error(exc) or is_timeout(exc)

    # -- one attempt --------------------------------------------------------------------------

    async def attempt(
        self,
        fn: Callable[..., Awaitable[R]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        oom_recoverable: bool = False,
    ) -> R:
        """One attempt through the breaker and the attempt timeout; raises what the call raised,
        BreakerOpen, or DeadlineExceeded (when the deadline, not the stage timeout, cut it).

        ``oom_recoverable``: an out-of-memory error is not counted by the breaker (the rerank stage
        will retry on a smaller batch; only an OOM at the floor says the reranker is unwell)."""
        timeout = self.timeout_s
        by_deadline = False
        at = _deadline.get()
        now = _monotonic()
        if at is not None:
            left = at - now
            if left <= 0.0 or left < self._min_left:  # exactly min_attempt_s left may still start
                raise DeadlineExceeded(
                    self.name, None if left <= 0 else left, "no budget left for an attempt"
                )
            if timeout is None or left < timeout:
                timeout = left
                by_deadline = True
        breaker = self.breaker
        token = None
        if breaker is not None:
            try:
                token = breaker.acquire()
            except BreakerOpen as exc:
                # a shared breaker (ragguard.distributed) hands out half-open trial permits through
                # Redis: ask it for one rather than rejecting the first caller of the half-open state
                if self._acquire_async is None or exc.state != "half_open":
                    raise
                token = await self._acquire_async()
        clock = self._clock
        started = now if clock is _monotonic else clock()
        try:
            inj = _inject.active
            if inj is None:
                aw = fn(*args, **kwargs)
            else:
                aw = inj(self.name, current_tenant(), functools.partial(fn, *args, **kwargs))
            if timeout is None:
                result = await aw
            else:
                # the timer wheel of _timeouts, inlined: one coroutine frame less per call
                loop = _get_running_loop()
                task = _task_of(loop) if loop is not None else None
                if task is None:  # trio, or outside a task
                    result = await call_with_timeout(aw, timeout)
                else:
                    wheel = wheel_for(loop)  # type: ignore[arg-type]
                    tick = (
                        int(((now if wheel.now is _monotonic else wheel.now()) + timeout) * _TICKS_PER_S) + 1
                    )
                    bucket = wheel.buckets.get(tick)
                    if bucket is None:
                        bucket = wheel.add_bucket(tick)
                    number = next_number()
                    bucket[number] = task
                    try:
                        result = await aw
                    except asyncio.CancelledError:
                        if number in wheel.expired:
                            wheel.expired.discard(number)
                            if task.uncancel() == 0:
                                raise AttemptTimeout(f"attempt timed out after {timeout:.3f}s") from None
                        raise
                    finally:
                        bucket.pop(number, None)
        except AttemptTimeout as exc:
            if by_deadline:
                if breaker is not None:
                    breaker.release(token)  # the caller's short budget says nothing of the dependency
                raise DeadlineExceeded(self.name, timeout) from exc
            if breaker is not None:
                breaker.on_result(token, clock() - started, exc)
            raise
        except Exception as exc:
            if breaker is not None:
                if oom_recoverable and is_out_of_memory(exc):
                    breaker.release(token)
                else:
                    now = clock()
                    breaker.on_result(token, now - started, exc, now)
            raise
        except BaseException:
            if breaker is not None:
                breaker.release(token)
            raise
        if breaker is not None:
            now = clock()
            breaker.on_result(token, now - started, None, now)
        return result

    async def protected(
        self,
        fn: Callable[..., Awaitable[R]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        oom_recoverable: bool = False,
    ) -> R:
        """Attempts with retries (deadline, retry, breaker and timeout layers)."""
        budget = self.budget
        if budget is None:
            return await self.attempt(fn, args, kwargs, oom_recoverable)
        budget.on_call(self._clock())
        try:
            return await self.attempt(fn, args, kwargs, oom_recoverable)
        except Exception as exc:
            if not self.retryable(exc):
                raise
            return await self._retry(exc, fn, args, kwargs)

    async def _retry(
        self, first: Exception, fn: Callable[..., Awaitable[R]], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> R:
        guard = self._guard
        pending: list[BaseException] = [first]

        def before_sleep(state: Any) -> None:
            if bus.active:
                exc = state.outcome.exception() if state.outcome is not None else None
                bus.emit(
                    RetryScheduled(
                        self.name, state.attempt_number + 1, state.upcoming_sleep, type(exc).__name__
                    )
                )

        retrying = deadline_aware_retrying(
            self.retry_policy,
            retryable=self.retryable,
            budget=self._spend_retry,
            min_attempt_s=self.min_attempt_s,
            rng=guard.rng,
            sleep=guard.sleep,
            before_sleep=before_sleep,
        )
        async for attempt in retrying:
            with attempt:
                if pending:
                    raise pending.pop()  # replay the first failure so tenacity's backoff starts at it
                return await self.attempt(fn, args, kwargs)
        raise AssertionError("unreachable")  # pragma: no cover - reraise=True always raises

    def _spend_retry(self) -> bool:
        # Consulted by tenacity only after the attempt and deadline checks allowed a retry, so
        # the budget is charged for retries that really happen, never for a call's last attempt.
        assert self.budget is not None
        if self.budget.try_spend():
            return True
        if bus.active:
            bus.emit(RetryBudgetExhausted(self.name, current_tenant()))
        return False

    # -- the whole call -----------------------------------------------------------------------

    async def run(self, bound: _Bound, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        guard = self._guard
        lease = None
        if guard.per_call_quota and _scope.get() is None:
            lease = await self._admit_default()
        try:
            if self.shrinker is not None:
                return await self._run_rerank(bound, args, kwargs)
            fn = bound.fn
            try:
                # protected(), inlined: one coroutine frame less on every guarded call
                budget = self.budget
                if budget is None:
                    result = await self.attempt(fn, args, kwargs)
                else:
                    budget.on_call(self._clock())
                    try:
                        result = await self.attempt(fn, args, kwargs)
                    except Exception as exc:
                        if not self.retryable(exc):
                            raise
                        result = await self._retry(exc, fn, args, kwargs)
            except Exception as exc:
                if (bound.fallback is None and self.cache is None) or not self.fallback_applies(exc):
                    raise
                return await self._serve_fallback(bound, exc, args, kwargs)
            if self.cache is not None:
                texts = self._texts(bound, args, kwargs)
                if texts is not None:
                    self.cache.store(texts, result)
            return result
        finally:
            if lease is not None:
                guard.quotas.release(lease)

    async def _admit_default(self) -> Any:
        """Admit a call made outside any ``tenant(...)`` block as its own request of the default
        tenant (only when the default quota limits anything)."""
        quotas = self._guard.quotas
        lease = quotas.admit_now(DEFAULT_TENANT)
        if lease is WAIT:
            lease = await quotas.acquire(DEFAULT_TENANT)
        return lease

    async def run_observed(self, bound: _Bound, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """:meth:`run` inside an OpenTelemetry span and a StageCompleted event (when observed)."""
        breaker = self.breaker
        state = "" if breaker is None else str(getattr(breaker, "state", ""))
        with _metrics.otel_span(self.name, current_tenant(), breaker_state=state) as span:
            before = len(degraded())
            result = await self.run(bound, args, kwargs)
            served = degraded()
            if len(served) > before:
                span.set_fallback(served[-1])
            return result

    def _texts(self, bound: _Bound, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Sequence[str] | None:
        value = _arg(args, kwargs, bound.texts_arg if bound.texts_arg is not None else 0)
        if value is None and bound.texts_name is not None:
            value = kwargs.get(bound.texts_name)
        if isinstance(value, str):
            return (value,)
        if isinstance(value, (list, tuple)) and all(isinstance(t, str) for t in value):
            return value
        return None

    async def _serve_fallback(
        self, bound: _Bound, exc: Exception, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if self.cache is not None:
            texts = self._texts(bound, args, kwargs)
            if texts is not None:
                hit = self.cache.lookup(texts)
                if hit is not None:
                    self._degraded("embedding_cache", exc)
                    return hit
        if bound.fallback is None:
            raise exc
        result = bound.fallback(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        self._degraded(cast(str, bound.fallback_name), exc)
        return result

    def _degraded(self, fallback: str, cause: BaseException) -> None:
        mark_degraded(fallback)
        if bus.active:
            bus.emit(FallbackServed(self.name, fallback, current_tenant(), type(cause).__name__))

    # -- rerank: smaller batch, then skip -------------------------------------------------------

    def _batch_position(
        self, bound: _Bound, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> int | str | None:
        if bound.batch_arg is not None:
            return bound.batch_arg if _arg(args, kwargs, bound.batch_arg) is not None else None
        for i in range(len(args) - 1, -1, -1):
            if isinstance(args[i], (list, tuple)):
                return i
        for key in ("hits", "batch", "documents", "passages", "candidates"):
            if isinstance(kwargs.get(key), (list, tuple)):
                return key
        return None

    async def _run_rerank(self, bound: _Bound, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        shrinker = self.shrinker
        assert shrinker is not None
        where = self._batch_position(bound, args, kwargs)
        if where is None:
            return await self.protected(bound.fn, args, kwargs)
        hits = _arg(args, kwargs, where)
        n = len(hits)
        size = shrinker.allowed(n)
        while True:
            if isinstance(where, int):
                call_args, call_kwargs = (*args[:where], hits[:size], *args[where + 1 :]), kwargs
            else:
                call_args, call_kwargs = args, {**kwargs, where: hits[:size]}
            try:
                result = await self.protected(
                    bound.fn, call_args, call_kwargs, oom_recoverable=size > shrinker.floor
                )
            except Exception as exc:
                if not isinstance(exc, BreakerOpen) and is_out_of_memory(exc) and size > 1:
                    nxt = shrinker.shrink(size)
                    if nxt is not None:
                        size = nxt
                        continue
                if not self.fallback_applies(exc):
                    raise
                if bound.fallback is not None:
                    return await self._serve_fallback(bound, exc, args, kwargs)
                self._degraded("skip_rerank", exc)
                return list(hits)
            shrinker.succeeded(size)
            if size < n:
                self._degraded("smaller_batch", MemoryError())
                return [*result, *hits[size:]]
            return result

    # -- streams ----------------------------------------------------------------------------------

    async def run_stream(
        self, bound: _Bound, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> AsyncIterator[Any]:
        guard = self._guard
        lease = None
        if guard.per_call_quota and _scope.get() is None:
            lease = await self._admit_default()
        try:
            breaker = self.breaker
            try:
                left = remaining()
                if left is not None and (left <= 0.0 or left < self._min_left):
                    raise DeadlineExceeded(self.name, None, "no budget left to open the stream")
                token = breaker.acquire() if breaker is not None else None
            except Exception as exc:
                if bound.fallback is None or not self.fallback_applies(exc):
                    raise
                async for item in self._fallback_stream(bound, exc, args, kwargs):
                    yield item
                return
            started = self._clock()
            agen = bound.fn(*args, **kwargs)
            yielded = 0
            verdict: BaseException | bool | None = False
            try:
                while True:
                    timeout = self.timeout_s
                    at = _deadline.get()
                    by_deadline = False
                    if at is not None:
                        left = at - _monotonic()
                        if left <= 0:
                            raise DeadlineExceeded(self.name, None, f"stream cut after {yielded} items")
                        if timeout is None or left < timeout:
                            timeout, by_deadline = left, True
                    try:
                        item = await call_with_timeout(agen.__anext__(), timeout)
                    except StopAsyncIteration:
                        break
                    except AttemptTimeout as exc:
                        if by_deadline:
                            raise DeadlineExceeded(
                                self.name, timeout, f"stream cut after {yielded} items"
                            ) from exc
                        raise
                    yield item
                    yielded += 1
                verdict = None
            except DeadlineExceeded:
                verdict = False
                raise
            except Exception as exc:
                verdict = exc
                if yielded or bound.fallback is None or not self.fallback_applies(exc):
                    raise
                if breaker is not None:
                    breaker.on_result(token, self._clock() - started, exc)
                    breaker = None
                async for item in self._fallback_stream(bound, exc, args, kwargs):
                    yield item
            finally:
                if breaker is not None:
                    if verdict is False:
                        breaker.release(token)
                    else:
                        breaker.on_result(token, self._clock() - started, verdict)
                await agen.aclose()
        finally:
            if lease is not None:
                guard.quotas.release(lease)

    async def _fallback_stream(
        self, bound: _Bound, exc: Exception, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> AsyncIterator[Any]:
        assert bound.fallback is not None
        self._degraded(cast(str, bound.fallback_name), exc)
        produced = bound.fallback(*args, **kwargs)
        if hasattr(produced, "__aiter__"):
            async for item in produced:
                yield item
        else:
            if inspect.isawaitable(produced):
                produced = await produced
            for item in produced:
                yield item


def _adapt_breaker(breaker: Any) -> Any:
    if hasattr(breaker, "acquire") and hasattr(breaker, "on_result") and hasattr(breaker, "release"):
        return breaker
    try:
        import aiobreaker
    except ImportError:  # pragma: no cover - aiobreaker is a dependency
        aiobreaker = None
    if aiobreaker is not None and isinstance(breaker, aiobreaker.CircuitBreaker):
        from .breakers import from_aiobreaker

        return from_aiobreaker(breaker)
    raise ConfigError(
        "breaker must be a ragguard CircuitBreaker or an aiobreaker.CircuitBreaker, "
        f"got {type(breaker).__name__}"
    )


class Guard:
    """An independent registry of guarded stages, breakers and tenant quotas built from a policy.

    ``clock`` (monotonic seconds) drives breakers, quotas and retry budgets; ``rng`` seeds breaker
    and retry jitter; ``sleep`` (an async function of seconds) performs retry backoff; ``quotas``
    replaces the in-memory quota backend.

    ``redis`` (a ``redis.asyncio.Redis`` client) shares state across replicas: tenant quotas become
    :class:`ragguard.distributed.RedisQuotas` and every breaker the policy builds is wrapped in a
    :class:`ragguard.distributed.SharedCircuitBreaker`, under keys starting with ``redis_prefix``.
    Give the client short timeouts and no retries of its own (see docs/distributed.md); call
    ``await guard.aclose()`` at shutdown.
    """

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        clock: Clock = monotonic,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
        quotas: QuotaBackend | None = None,
        redis: Any = None,
        redis_prefix: str = "ragguard",
    ) -> None:
        if policy is not None and not isinstance(policy, Policy):
            raise ConfigError(f"policy must be a ragguard.Policy, got {type(policy).__name__}")
        if not callable(clock):
            raise ConfigError(f"clock must be a callable returning monotonic seconds, got {clock!r}")
        if sleep is not None and not callable(sleep):
            raise ConfigError(f"sleep must be an async function of seconds, got {sleep!r}")
        if rng is not None and not all(callable(getattr(rng, m, None)) for m in ("random", "uniform")):
            raise ConfigError(f"rng must be a random.Random, got {rng!r}")
        if quotas is not None and not all(
            callable(getattr(quotas, m, None)) for m in ("admit_now", "acquire", "release")
        ):
            raise ConfigError(f"quotas must be a QuotaBackend (admit_now, acquire, release), got {quotas!r}")
        self.policy = policy if policy is not None else Policy()
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()
        self.sleep = sleep if sleep is not None else anyio.sleep
        self.quotas: Any = quotas if quotas is not None else LocalQuotas(self.policy.quota, clock=clock)
        self.per_call_quota = not (
            self.policy.default_quota.max_concurrency is None and self.policy.default_quota.rate_per_s is None
        )
        self._stages: dict[str, Stage] = {}
        self._closers: list[Callable[[], Awaitable[Any]]] = []
        self.redis = redis
        self.redis_prefix = redis_prefix
        if redis is not None:
            if not callable(getattr(redis, "evalsha", None)):
                raise ConfigError(f"redis must be a redis.asyncio client, got {type(redis).__name__}")
            if quotas is None:
                from .distributed import RedisQuotas

                self.quotas = RedisQuotas(self.policy.quota, redis, key_prefix=redis_prefix)
                self._closers.append(self.quotas.aclose)

    def stage(self, name: str, *, breaker: Any = None) -> Stage:
        """The runtime of stage ``name``, created on first use (``breaker`` overrides its breaker)."""
        st = self._stages.get(name)
        if st is None:
            if not isinstance(name, str) or not name:
                raise ConfigError(f"stage name must be a non-empty str, got {name!r}")
            st = self._stages[name] = Stage(self, name, self.policy.stage(name), breaker)
        elif (
            breaker is not None
            and st.breaker is not breaker
            and getattr(st.breaker, "wrapped", None) is not breaker
        ):
            raise ConfigError(f"stage {name!r} already has a breaker; give one breaker per stage")
        return st

    async def aclose(self) -> None:
        """Stop the background work of shared (Redis) breakers and quotas; a no-op otherwise."""
        closers, self._closers = self._closers, []
        for close in closers:
            await close()

    def breaker(self, stage: str) -> Any:
        """The breaker guarding ``stage`` (None when the stage has none)."""
        return self.stage(stage).breaker

    def stage_names(self) -> tuple[str, ...]:
        """The names of the stages this Guard has built, in the order they were first used."""
        return tuple(self._stages)

    def breakers(self) -> dict[str, Any]:
        """Stage name -> its breaker, for every built stage that has one."""
        return {name: st.breaker for name, st in self._stages.items() if st.breaker is not None}

    def status(self) -> dict[str, Any]:
        """A JSON-ready snapshot for health endpoints::

            {"ok": bool, "open": [stage, ...],
             "stages": {stage: {"breaker": {"name": str, "state": str, "retry_after_s": float | None}
                                | None}}}

        ``ok`` is False while any breaker is open, forced open or half-open (``open`` names those
        stages); fallbacks may still be serving them.
        """
        stages: dict[str, Any] = {}
        not_closed: list[str] = []
        for name, st in self._stages.items():
            breaker = st.breaker
            if breaker is None:
                stages[name] = {"breaker": None}
                continue
            state = getattr(breaker.state, "value", str(breaker.state))
            if state not in ("closed", "disabled"):
                not_closed.append(name)
            stages[name] = {
                "breaker": {
                    "name": breaker.name,
                    "state": state,
                    "retry_after_s": getattr(breaker, "retry_after_s", None),
                }
            }
        return {"ok": not not_closed, "open": not_closed, "stages": stages}

    def tenant(self, tenant_id: str) -> TenantContext:
        """``async with guard.tenant("acme"):`` admits one request of the tenant (see :func:`tenant`)."""
        return TenantContext(tenant_id, self.quotas, self.policy.quota(tenant_id))

    def guard(self, stage: str, **options: Any) -> GuardDecorator:
        """``@g.guard("stage", fallback=...)``: like :func:`ragguard.guard`, bound to this Guard.

        Raises ConfigError for an unknown option."""
        return cast(GuardDecorator, _decorator(stage, lambda: self, options))


_default: Guard | None = None


def default_guard() -> Guard:
    """The registry ``@guard`` and ``tenant`` use (built from ``Policy()`` until :func:`configure`)."""
    global _default
    if _default is None:
        _default = Guard()
    return _default


def configure(
    policy: Policy | Mapping[str, Any] | str | PathLike[str] | None = None, **options: Any
) -> Guard:
    """Replace the default registry: ``policy`` is a Policy, a mapping, or a YAML/TOML/JSON path.

    ``options`` (clock, rng, sleep, quotas) go to :class:`Guard`. Breaker states start fresh.
    Raises ConfigError for an invalid policy.
    """
    global _default
    if policy is None:
        resolved = Policy()
    elif isinstance(policy, Policy):
        resolved = policy
    elif isinstance(policy, Mapping):
        resolved = Policy.parse(policy)
    elif isinstance(policy, (str, PathLike)):
        resolved = Policy.from_file(Path(policy))
    else:
        raise ConfigError(
            f"configure() takes a Policy, a mapping or a file path, not {type(policy).__name__}"
        )
    _default = Guard(resolved, **options)
    return _default


def tenant(tenant_id: str) -> TenantContext:
    """``async with tenant("acme"):`` one request of tenant ``acme`` in the default registry.

    On entry the tenant's quota admits the request (concurrency slot and rate token, waiting first
    come first served up to ``max_wait_s`` or the deadline), else raises QuotaExceeded with
    ``tenant`` and ``retry_after_s``; the tenant's ``timeout_s`` becomes the deadline. A bad id
    raises InvalidInput (a ValueError). Slots are released on exit, error and cancellation.
    """
    return default_guard().tenant(tenant_id)


class GuardDecorator(Protocol):
    """What ``guard(...)`` returns: keeps the decorated function's signature (ParamSpec)."""

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Callable[P, Coroutine[Any, Any, R]]: ...
    @overload
    def __call__(self, fn: Callable[P, AsyncIterator[Y]], /) -> Callable[P, AsyncIterator[Y]]: ...


def guard(
    stage: str,
    *,
    fallback: Callable[..., Any] | None = None,
    breaker: Any = None,
    texts_arg: int | str | None = None,
    batch_arg: int | str | None = None,
) -> GuardDecorator:
    """Guard an async function (or async generator function) as stage ``stage``.

    - ``fallback``: called with the same arguments when the stage fails in a way its breaker
      counts, its breaker is open, or the deadline is spent; its result is marked degraded
      (:func:`ragguard.degraded`). For an async generator, the fallback may be one too.
    - ``breaker``: a ragguard breaker or an ``aiobreaker.CircuitBreaker`` for this stage, instead
      of the one its policy builds.
    - ``texts_arg`` (embedding kinds): where the texts are (position or name; default 0).
    - ``batch_arg`` (rerank kinds): where the candidate list is (default: last list argument).

    Raises ConfigError at decoration for a bad option. At call time, raises what the call raised
    when no fallback serves, or BreakerOpen, QuotaExceeded, DeadlineExceeded.
    """
    options = {"fallback": fallback, "breaker": breaker, "texts_arg": texts_arg, "batch_arg": batch_arg}
    return cast(GuardDecorator, _decorator(stage, default_guard, options))


_OPTIONS = frozenset({"fallback", "breaker", "texts_arg", "batch_arg"})


def _decorator(stage: str, registry: Callable[[], Guard], options: Mapping[str, Any]) -> Any:
    if not isinstance(stage, str) or not stage:
        raise ConfigError(f"guard: stage must be a non-empty str, got {stage!r}")
    unknown = set(options) - _OPTIONS
    if unknown:
        raise ConfigError(f"guard: unknown option(s) {sorted(unknown)}; allowed: {sorted(_OPTIONS)}")
    fallback = options.get("fallback")
    if fallback is not None and not callable(fallback):
        raise ConfigError(f"guard: fallback must be callable, got {type(fallback).__name__}")
    breaker = options.get("breaker")
    if breaker is not None:
        breaker = _adapt_breaker(breaker)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise ConfigError(f"guard({stage!r}) decorates a callable, got {type(fn).__name__}")
        bound = _Bound(stage, fn, fallback, breaker, options.get("texts_arg"), options.get("batch_arg"))
        cache: list[Any] = [None, None]  # (guard, stage) of the last call

        def resolve() -> Stage:
            # the registry is looked up per call: configure() may replace the default one
            g = registry()
            if cache[0] is g:
                return cast(Stage, cache[1])
            st = g.stage(stage, breaker=breaker)
            cache[0], cache[1] = g, st
            return st

        if inspect.isasyncgenfunction(fn):

            @functools.wraps(fn)
            def stream(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
                return resolve().run_stream(bound, args, kwargs)

            stream.__ragguard_stage__ = stage  # type: ignore[attr-defined]
            return stream
        # every callable has a __call__: test that it is async, else a sync function slips through
        method = getattr(fn, "__call__", None)  # noqa: B004 - the method itself, not callability
        if not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(method)):
            raise ConfigError(f"guard({stage!r}) needs an async def function or async generator, got {fn!r}")

        @functools.wraps(fn)
        async def call(*args: Any, **kwargs: Any) -> Any:
            st = cache[1] if cache[0] is registry() else resolve()
            if bus.active or _metrics._tracer is not None:
                return await st.run_observed(bound, args, kwargs)
            return await st.run(bound, args, kwargs)

        call.__ragguard_stage__ = stage  # type: ignore[attr-defined]
        return call

    return decorate
