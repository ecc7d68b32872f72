"""Configuration: one :class:`Policy` describes every stage and every tenant.

Build it in Python, or load it from a YAML or TOML file (:meth:`Policy.from_file`) or from
environment variables (:meth:`Policy.from_env`, nested with ``__``)::

    RAGGUARD_STAGES__EMBEDDING__TIMEOUT_S=2.5
    RAGGUARD_TENANTS__ACME__MAX_CONCURRENCY=8

A value out of range raises :class:`~ragguard.ConfigError` naming the field path and the allowed
range, when the policy is built or loaded: breaker options are checked with the breaker's own rules
(:class:`ragguard.breakers.BreakerConfig`, with the stage's breaker kind's defaults filled in), so a
policy that loads builds breakers that accept it. Messages are bounded: a refused value is shown in
at most a few dozen characters, at most :data:`MAX_ERRORS_SHOWN` errors are listed, and a policy
whose YAML aliases expand past :data:`MAX_POLICY_VALUES` values is refused before validation.
Options mirror resilience4j's names in snake_case with units (``open_for_s`` is resilience4j's
``waitDurationInOpenState``, ``minimum_calls`` its ``minimumNumberOfCalls``...).
"""

from __future__ import annotations

import json
import math
import os
import threading
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from . import _model_errors, _validate
from ._errors import ConfigError
from .breakers import EmbeddingTimeoutBreaker, RerankOOMBreaker, VectorStoreUnavailableBreaker
from .breakers._options import NUMBER_OPTIONS, BreakerConfig, check_option

__all__ = [
    "IDEMPOTENT_PRESETS",
    "MAX_ERRORS_SHOWN",
    "MAX_POLICY_VALUES",
    "STANDARD_STAGES",
    "AdaptivePolicy",
    "BreakerPolicy",
    "GenerationPolicy",
    "HedgePolicy",
    "Policy",
    "PoolQuota",
    "RetryPolicy",
    "StagePolicy",
    "TenantQuota",
    "ThrottlePolicy",
    "TokenLimits",
    "policy_of",
]

MAX_ERRORS_SHOWN = 20
"""The most invalid values one ConfigError lists (then ``... and N more``)."""
MAX_POLICY_VALUES = 1_000_000
"""The most values (mappings, lists and scalars, counted after YAML aliases expand) a policy holds."""

BreakerKind = Literal["embedding_timeout", "vector_store_unavailable", "rerank_oom", "generic", "none"]
RetryOn = Literal["connection", "timeout", "out_of_memory", "rejection", "any"]
Priority = Literal["critical", "interactive", "batch"]
OverloadSignal = Literal["loop_lag", "pool_wait", "out_of_memory"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    def __init__(self, **data: Any) -> None:
        # Built from Python, a bad value raises the same ConfigError (naming the field and the
        # allowed range) as a bad value in a policy file or the environment. Only the outermost
        # construction converts: a nested one re-raises pydantic's error so its path is kept.
        depth = getattr(_nesting, "depth", 0)
        _nesting.depth = depth + 1
        try:
            super().__init__(**data)
        except ValidationError as exc:
            if depth:
                raise
            raise _config_error(exc, type(self).__name__) from None
        finally:
            _nesting.depth = depth


_nesting = threading.local()


_M = TypeVar("_M", bound=_Model)


_MODEL_NAME_MAX = 128


class TokenLimits(_Model):
    """One model's token limits for a tenant (``TenantQuota.models``), on top of the tenant's own;
    None means unlimited. The same fields, units and rules as :class:`TenantQuota`'s:

    - ``tokens_per_s``, ``token_burst``: pacing of the output tokens the tenant's streams of this
      model hand over;
    - ``token_quota``: input + output tokens per ``token_window_s``; ``input_token_quota``: input
      (prompt) tokens per window; ``output_token_quota``: output (generated) tokens per window.
    """

    tokens_per_s: float | None = Field(default=None, gt=0, le=1e9)
    token_burst: int | None = Field(default=None, ge=1, le=1_000_000_000)
    token_quota: int | None = Field(default=None, ge=1, le=1_000_000_000_000)
    input_token_quota: int | None = Field(default=None, ge=1, le=1_000_000_000_000)
    output_token_quota: int | None = Field(default=None, ge=1, le=1_000_000_000_000)
    token_window_s: float = Field(default=60.0, gt=0, le=31 * 86_400)

    @property
    def limits_tokens(self) -> bool:
        """Whether any token limit is set."""
        return not (
            self.tokens_per_s is None
            and self.token_quota is None
            and self.input_token_quota is None
            and self.output_token_quota is None
        )


class TenantQuota(_Model):
    """A tenant's share of the service; None means unlimited.

    - ``max_concurrency``: requests in flight at once (a bulkhead per tenant), >= 1.
    - ``rate_per_s``: admitted requests per second (GCRA, i.e. a token bucket), > 0.
    - ``burst``: requests admitted back to back above the rate, >= 1 (default: ceil(rate_per_s)).
    - ``max_wait_s``: how long a request may queue, first come first served, for a slot or a token
      before :class:`~ragguard.QuotaExceeded` (seconds, >= 0; also cut to the request's deadline).
    - ``timeout_s``: the tenant's time budget per request, applied as a deadline (seconds, > 0).

    Generated tokens (the streams of stages with the ``generation`` preset; see docs/generation.md):

    - ``tokens_per_s``: the tenant's streams together hand over at most this many tokens per
      second beyond ``token_burst``; an item over the budget is delayed, never refused (pacing,
      GCRA over tokens), > 0.
    - ``token_burst``: tokens handed over back to back above the rate, >= 1 (default:
      ceil(tokens_per_s)).
    - ``token_quota``: tokens the tenant may spend per ``token_window_s`` seconds (a bucket of
      ``token_quota`` tokens refilled at ``token_quota / token_window_s`` per second, GCRA). Each
      stream reserves its estimate before it opens (waiting up to ``max_wait_s``, else
      :class:`~ragguard.QuotaExceeded` with reason ``tokens``) and settles with its real count when
      it ends, however it ends, >= 1.
    - ``token_window_s``: the quota's window, seconds, > 0 (default 60: tokens per minute).
    - ``input_token_quota``, ``output_token_quota``: input (prompt) and output (generated) tokens
      per ``token_window_s``, each its own bucket, reserved and settled as ``token_quota`` is;
      ``token_quota`` counts both together. Input tokens are what the stage's ``input_tokens=``
      estimate or the provider's reported usage says (0 when neither is given).
    - ``models``: model name -> :class:`TokenLimits`, limits of the tenant's streams of that model
      on top of the tenant's own (the stage's ``model=`` option names the call's model; a model
      not listed has the tenant's limits only). Names are 1 to 128 printable characters.
    - ``priority``: the priority of the tenant's requests at the stages' adaptive limits
      (``critical``, ``interactive`` or ``batch``; a front door's ``x-priority`` header may lower
      it per request, and raise it only for a trusted caller; :func:`ragguard.overload.priority`
      in code overrides it). Over a limit, lower
      priorities are shed first.
    - ``weight``: the tenant's share when shedding within one priority (> 0, default 1): the
      tenant whose usage per unit of weight is highest is shed first.
    """

    max_concurrency: int | None = Field(default=None, ge=1, le=1_000_000)
    rate_per_s: float | None = Field(default=None, gt=0, le=1e9)
    burst: int | None = Field(default=None, ge=1, le=1_000_000_000)
    max_wait_s: float = Field(default=0.0, ge=0, le=3600)
    timeout_s: float | None = Field(default=None, gt=0, le=86_400)
    tokens_per_s: float | None = Field(default=None, gt=0, le=1e9)
    token_burst: int | None = Field(default=None, ge=1, le=1_000_000_000)
    token_quota: int | None = Field(default=None, ge=1, le=1_000_000_000_000)
    token_window_s: float = Field(default=60.0, gt=0, le=31 * 86_400)
    input_token_quota: int | None = Field(default=None, ge=1, le=1_000_000_000_000)
    output_token_quota: int | None = Field(default=None, ge=1, le=1_000_000_000_000)
    models: dict[str, TokenLimits] = Field(default_factory=dict)
    priority: Priority = "interactive"
    weight: float = Field(default=1.0, gt=0, le=1e6)

    @field_validator("models")
    @classmethod
    def _model_names(cls, models: dict[str, TokenLimits]) -> dict[str, TokenLimits]:
        for name in models:
            if not 1 <= len(name) <= _MODEL_NAME_MAX or not name.isprintable():
                raise ValueError(
                    f"model names are 1 to {_MODEL_NAME_MAX} printable characters, got {name!r:.60}"
                )
        return models

    @property
    def limits_tokens(self) -> bool:
        """Whether any token limit is set, the tenant's or a model's."""
        return not (
            self.tokens_per_s is None
            and self.token_quota is None
            and self.input_token_quota is None
            and self.output_token_quota is None
            and not any(m.limits_tokens for m in self.models.values())
        )

    @property
    def unlimited(self) -> bool:
        return self.max_concurrency is None and self.rate_per_s is None and self.timeout_s is None


class PoolQuota(_Model):
    """A bound that a group of tenants share together (None means unlimited): the tenants not
    named in :attr:`Policy.tenants` share one (:attr:`Policy.unlisted_pool`).

    - ``max_concurrency``: requests of the whole group in flight at once, >= 1.
    - ``rate_per_s``: requests of the whole group admitted per second (GCRA), > 0.
    - ``burst``: requests admitted back to back above the rate, >= 1 (default: ceil(rate_per_s)).

    Each request of a member counts against its own :class:`TenantQuota` and against the pool: it
    is admitted only when both have a slot and a token (waiting, first come first served, up to
    the tenant's ``max_wait_s``).
    """

    max_concurrency: int | None = Field(default=None, ge=1, le=1_000_000)
    rate_per_s: float | None = Field(default=None, gt=0, le=1e9)
    burst: int | None = Field(default=None, ge=1, le=1_000_000_000)

    @property
    def unlimited(self) -> bool:
        return self.max_concurrency is None and self.rate_per_s is None

    def covers(self, quota: TenantQuota) -> bool:
        """True when this pool is at least as strict as ``quota`` in concurrency, rate and burst:
        then a member's own quota can never refuse what the pool admits (one check suffices)."""
        if quota.max_concurrency is not None and (
            self.max_concurrency is None or self.max_concurrency > quota.max_concurrency
        ):
            return False
        if quota.rate_per_s is None:
            return True
        return (self.rate_per_s is not None and self.rate_per_s <= quota.rate_per_s
                and _burst(self.burst, self.rate_per_s) <= _burst(quota.burst, quota.rate_per_s))


def _burst(burst: int | None, rate: float) -> int:
    return burst if burst is not None else max(1, math.ceil(rate))


class BreakerPolicy(_Model):
    """Which breaker guards a stage and its options; None keeps the kind's default.

    ``kind`` is one of ``embedding_timeout``, ``vector_store_unavailable``, ``rerank_oom``,
    ``generic`` (counts every error) or ``none`` (no breaker). Each option has the range
    :class:`ragguard.breakers.BreakerConfig` gives it (percentages in (0, 100], durations in
    seconds up to a year, ``open_jitter`` in [0, 1), ...); the rules between options
    (``minimum_calls`` <= ``window_size`` of a count window, a time window of at most a day,
    ``open_max_s`` >= ``open_for_s``) are checked with the kind's defaults filled in when the
    :class:`Policy` is built.
    """

    kind: BreakerKind = "generic"
    failure_rate_threshold: float | None = None
    slow_call_rate_threshold: float | None = None
    slow_call_duration_s: float | None = None
    consecutive_failures_threshold: int | None = None
    minimum_calls: int | None = None
    window_type: Literal["count", "time"] | None = None
    window_size: int | None = None
    half_open_permits: int | None = None
    open_for_s: float | None = None
    open_backoff_multiplier: float | None = None
    open_max_s: float | None = None
    open_jitter: float | None = None

    @field_validator(*NUMBER_OPTIONS)
    @classmethod
    def _in_range(cls, value: Any, info: Any) -> Any:
        return None if value is None else check_option(info.field_name, value)

    def options(self) -> dict[str, Any]:
        """The options that were set, as keyword arguments for the breaker's constructor."""
        return {k: v for k, v in self.model_dump(exclude={"kind"}).items() if v is not None}

    def config(self) -> BreakerConfig | None:
        """The options the stage's breaker gets (the kind's defaults, then the options set),
        validated by the breaker's own rules; None for kind ``none``. Raises ConfigError whose
        ``field`` names the option."""
        if self.kind == "none":
            return None
        options = self.options()
        try:
            return BreakerConfig.of(**{**_KIND_DEFAULTS[self.kind], **options})
        except ConfigError as exc:
            if exc.field is None or exc.field in options:
                raise
            # the value refused is a default the user never wrote: say so
            raise ConfigError(f"{exc} (the {self.kind} breaker's default)", field=exc.field) from None


_KIND_DEFAULTS: dict[str, dict[str, Any]] = {
    "embedding_timeout": EmbeddingTimeoutBreaker.defaults,
    "vector_store_unavailable": VectorStoreUnavailableBreaker.defaults,
    "rerank_oom": RerankOOMBreaker.defaults,
    "generic": {},
}


class RetryPolicy(_Model):
    """Retries of one stage (run by tenacity), cut to the request's deadline.

    - ``attempts``: total attempts including the first (1 = no retry), 1-20.
    - backoff: exponential from ``initial_backoff_s`` times ``multiplier`` per retry, capped at
      ``max_backoff_s``, plus uniform jitter up to ``jitter_s`` (seconds).
    - ``retry_on``: the outcomes (:mod:`ragguard.outcomes`) that are retried: ``connection`` (a
      dependency failure: refused, reset, 5xx, ``UNAVAILABLE``), ``timeout``, ``out_of_memory``,
      ``rejection`` (429, 529, ``RESOURCE_EXHAUSTED``: after the wait the dependency stated), ``any``
      (every error the stage's breaker counts, and rejections). Never a caller's error,
      cancellation, BreakerOpen, QuotaExceeded, Overloaded or DeadlineExceeded. A stage that is not
      idempotent (``StagePolicy.idempotent``) retries only errors raised before its request could
      have left (a refused connection, a connect timeout).
    - ``max_retry_after_s``: the longest wait a dependency may state (``Retry-After``,
      ``retry-after-ms``, rate-limit resets, gRPC pushback) that a retry sleeps for, seconds; a
      longer stated wait, or one the deadline cannot fit, ends the retries at once so the stage's
      fallback serves. Default 10.
    - retry budget, after Envoy and Finagle: retries may add at most ``budget_ratio`` of the
      stage's calls over the last ``budget_window_s`` seconds (Envoy's default 20%), plus
      ``budget_min_per_s`` retries per second so a quiet stage can still retry.
    - tenacity strategies of your own (from Python only; None: the policy's): ``stop`` stops
      earlier than the policy does (it is asked after ``attempts`` and the deadline, before the
      budget: ``tenacity.stop_after_delay(2)``), ``wait`` the seconds between attempts instead of
      the exponential backoff and jitter (``tenacity.wait_fixed(0.1)``; still cut to the deadline
      and never shorter than an error's ``retry_after_s``), ``retry`` which errors are retried
      instead of ``retry_on`` (``tenacity.retry_if_exception_type(MyError)``; still never a
      cancellation or a rejection by ragguard). Each is a callable of a
      ``tenacity.RetryCallState``; tenacity's combinators (``|``, ``&``) work as in tenacity.
    """

    attempts: int = Field(default=1, ge=1, le=20)
    initial_backoff_s: float = Field(default=0.05, ge=0, le=60)
    max_backoff_s: float = Field(default=1.0, ge=0, le=300)
    multiplier: float = Field(default=2.0, ge=1, le=10)
    jitter_s: float = Field(default=0.02, ge=0, le=60)
    retry_on: tuple[RetryOn, ...] = ("connection", "timeout", "rejection")
    max_retry_after_s: float = Field(default=10.0, ge=0, le=86_400)
    budget_ratio: float = Field(default=0.2, ge=0, le=1)
    budget_min_per_s: float = Field(default=10.0, ge=0)
    budget_window_s: float = Field(default=10.0, gt=0, le=3600)
    stop: Any = None
    wait: Any = None
    retry: Any = None

    @field_validator("stop", "wait", "retry")
    @classmethod
    def _strategy(cls, value: Any) -> Any:
        if value is not None and not callable(value):
            raise ValueError(
                "must be a tenacity strategy (a callable of a RetryCallState) or None, "
                f"got {type(value).__name__}"
            )
        return value


class GenerationPolicy(_Model):
    """The stream budgets of a stage with the ``generation`` preset (seconds; None: no such budget).

    Each budget ends the stream with :class:`~ragguard.StreamTimeout` naming it; before the first
    item a fallback or a retry may still serve the stream, after it the error reaches the caller.

    - ``first_item_s``: the wait for a stream's first item, per attempt (a reasoning model that
      thinks before its first token needs a long one), > 0. Default 30.
    - ``idle_s``: the wait for each later item, > 0. Default 10.
    - ``total_s``: the time a stream may spend waiting for its items, summed over the stream
      (retries before the first item included). Pacing waits and the caller's own time between
      items do not count: the request deadline bounds those (:class:`~ragguard.DeadlineExceeded`),
      > 0. Default 300.
    - ``estimate_tokens``: tokens reserved from the tenant's ``token_quota`` before a stream opens
      and settled with the real count when it ends (``@guard(estimate=...)`` may compute it per
      call from its arguments), >= 1. Default 256. A reservation is at most the quota itself.
    """

    first_item_s: float | None = Field(default=30.0, gt=0, le=86_400)
    idle_s: float | None = Field(default=10.0, gt=0, le=86_400)
    total_s: float | None = Field(default=300.0, gt=0, le=86_400)
    estimate_tokens: int = Field(default=256, ge=1, le=1_000_000_000)
class AdaptivePolicy(_Model):
    """An adaptive concurrency limit on a stage's calls to its dependency (see
    :mod:`ragguard.overload`): the limit follows the dependency's latency, and calls over it queue
    by priority or are shed with :class:`~ragguard.Overloaded`.

    - ``min_limit`` (floor) <= ``initial_limit`` <= ``max_limit`` (ceiling): calls in flight at
      once, 1-100,000.
    - ``tolerance``: how far above the baseline latency (``min_rtt``) a window's latency may be
      before the limit shrinks, as a share (0.5 = 50%; Envoy's ``buffer``), 0-10.
    - ``percentile``: the latency of a window is this quantile of its samples (0-1], Envoy's p50.
    - ``window_s``: the limit is recomputed at most once per window (seconds, (0, 60]), from at
      least ``min_samples`` finished calls.
    - ``smoothing``: the share of the way to the new target the limit moves per window, (0, 1].
    - ``growth``: the limit grows only up to ``growth`` x the most calls in flight in the window
      (failsafe-go's rule: a limit nobody uses does not climb), >= 1.
    - baseline probes: every ``probe_interval_s`` seconds (plus up to ``probe_jitter`` of it, drawn
      from the Guard's rng) the limit is pinned to ``probe_limit`` for ``probe_samples`` calls to
      re-measure ``min_rtt`` (Envoy's minRTT window); the first probe runs at start.
    - queue: over the limit a call waits up to ``max_wait_s`` seconds (cut to its deadline); the
      queue holds ``max_queue`` x limit calls, and from ``early_queue`` x limit on it sheds calls
      with a rising probability (lowest priority, then heaviest tenant first). ``max_queue: 0``
      sheds at once.
    - ``usage_window_s``: the time constant (seconds) of a tenant's recent admissions, counted in
      its usage when choosing whom to shed.
    - ``signals``: outside pressure that backs the limit off by ``backoff`` (a factor in (0, 1)),
      at most once per window: ``loop_lag`` (a loop stall of ``loop_lag_s`` seconds or more
      reported by :class:`ragguard.monitors.StallDetector`), ``pool_wait`` (a Redis pool monitor's
      slow acquire or timeout), ``out_of_memory`` (a call that ran out of memory).
    """

    min_limit: int = Field(default=1, ge=1, le=100_000)
    max_limit: int = Field(default=256, ge=1, le=100_000)
    initial_limit: int = Field(default=16, ge=1, le=100_000)
    tolerance: float = Field(default=0.5, ge=0, le=10)
    percentile: float = Field(default=0.5, gt=0, le=1)
    window_s: float = Field(default=0.25, gt=0, le=60)
    min_samples: int = Field(default=8, ge=1, le=100_000)
    smoothing: float = Field(default=0.5, gt=0, le=1)
    growth: float = Field(default=2.0, ge=1, le=100)
    probe_interval_s: float = Field(default=30.0, gt=0, le=86_400)
    probe_jitter: float = Field(default=0.15, ge=0, le=1)
    probe_samples: int = Field(default=25, ge=1, le=100_000)
    probe_limit: int = Field(default=3, ge=1, le=100_000)
    backoff: float = Field(default=0.8, gt=0, lt=1)
    max_queue: float = Field(default=2.0, ge=0, le=100)
    early_queue: float = Field(default=1.0, ge=0, le=100)
    max_wait_s: float = Field(default=1.0, ge=0, le=3600)
    usage_window_s: float = Field(default=1.0, gt=0, le=3600)
    signals: tuple[OverloadSignal, ...] = ("loop_lag", "out_of_memory")
    loop_lag_s: float = Field(default=0.05, gt=0, le=60)

    @model_validator(mode="after")
    def _ordered(self) -> AdaptivePolicy:
        if not self.min_limit <= self.initial_limit <= self.max_limit:
            raise ValueError(
                f"need min_limit <= initial_limit <= max_limit, got {self.min_limit}, "
                f"{self.initial_limit}, {self.max_limit}"
            )
        if self.early_queue > self.max_queue:
            raise ValueError(f"early_queue ({self.early_queue}) must be <= max_queue ({self.max_queue})")
        return self


class ThrottlePolicy(_Model):
    """Client-side adaptive throttling of a stage whose dependency rejects calls (Google SRE book,
    "Handling Overload"): a call is refused locally with probability
    ``min(max_reject, max(0, (requests - k * accepts) / (requests + 1)))`` over the last
    ``window_s`` seconds of the Guard's clock.

    - ``k``: how many times the accepted calls the client may send, >= 1 (the book's 2).
    - ``window_s``: seconds of history, (0, 3600] (the book's two minutes; default 60).
    - ``max_reject``: the highest refusal probability, [0, 1): a trickle always probes.
    """

    k: float = Field(default=2.0, ge=1, le=100)
    window_s: float = Field(default=60.0, gt=0, le=3600)
    max_reject: float = Field(default=0.9, ge=0, lt=1)


class HedgePolicy(_Model):
    """Hedged requests for an idempotent stage (retrieval, rerank): when an attempt has not
    answered after about the stage's ``quantile`` latency, a second attempt is sent; the first
    success wins and the other is cancelled; an error never wins the race.

    - ``quantile``: the hedge delay is this quantile of the stage's recent attempt latencies,
      (0, 1) (0.95: the P95), at least ``min_delay_s`` and at most ``max_delay_s`` (seconds; None:
      no cap); no hedge until ``min_samples`` latencies were seen (of the last ``samples``).
    - budget, as the retry budget's: hedges add at most ``budget_ratio`` of the stage's calls
      over ``budget_window_s`` seconds, plus ``budget_min_per_s`` per second (default 10%, 0).
    """

    quantile: float = Field(default=0.95, gt=0, lt=1)
    min_delay_s: float = Field(default=0.001, ge=0, le=3600)
    max_delay_s: float | None = Field(default=None, gt=0, le=3600)
    min_samples: int = Field(default=20, ge=1, le=100_000)
    samples: int = Field(default=256, ge=16, le=100_000)
    budget_ratio: float = Field(default=0.1, ge=0, le=1)
    budget_min_per_s: float = Field(default=0.0, ge=0, le=1e6)
    budget_window_s: float = Field(default=10.0, gt=0, le=3600)


class StagePolicy(_Model):
    """How one stage is guarded.

    - ``timeout_s``: per-attempt timeout in seconds (None: only the deadline bounds it).
    - ``min_attempt_s``: no attempt starts with less budget than this (seconds); a call with less
      left raises DeadlineExceeded at once instead of starting work it cannot finish.
    - ``breaker``: the breaker kind and options; ``retry``: the retry policy.
    - ``fallback_on``: which failures the stage's fallback serves: ``breaker`` (the breaker's own
      failure kinds and BreakerOpen, the default) or ``any`` (every Exception but cancellation).
    - ``preset``: the RAG preset the stage runs (``embedding``, ``vector_store``, ``rerank``,
      ``generation``, or one registered with :func:`ragguard.rag.register_preset`; None: the
      generic layers only). The standard stages of the same names have theirs.
    - embedding cache (``embedding`` preset): ``cache_size`` entries, ``cache_ttl_s`` seconds.
    - rerank (``rerank`` preset): ``rerank_min_batch`` is the floor the batch is halved down to.
    - ``generation`` (``generation`` preset): the stream budgets and the token estimate
      (:class:`GenerationPolicy`).
    - ``layers``: the options of layers added with :func:`ragguard.layers.register_layer`, by layer
      name, each validated by that layer's own policy model (an unknown name is an error); a
      layer with no entry here is left out of the stage's chain unless it says otherwise.
    - overload (:mod:`ragguard.overload`, each None = off): ``adaptive`` an adaptive concurrency
      limit with priority shedding, ``throttle`` client-side adaptive throttling, ``hedge`` hedged
      requests (idempotent stages only).
    - ``idempotent``: whether calling the stage twice has the effect of calling it once (a read).
      None (the default) takes the preset's answer: the ``embedding``, ``vector_store``,
      ``rerank`` and ``generation`` presets are idempotent reads, a stage without a preset is not.
      A stage that is not idempotent is retried only on errors raised before its request could
      have left, and cannot hedge (ConfigError naming ``hedge``).
    - ``max_threads``: worker threads the stage's sync functions run in at once, at most (the
      stage's thread bulkhead, 1 to 10000, default 8; docs/sync.md). A thread a timeout stopped
      waiting for counts until it returns; a call waits for a thread within its attempt's timeout.
    """

    timeout_s: float | None = Field(default=None, gt=0, le=86_400)
    min_attempt_s: float = Field(default=0.0, ge=0, le=3600)
    breaker: BreakerPolicy = BreakerPolicy()
    retry: RetryPolicy = RetryPolicy()
    fallback_on: Literal["breaker", "any"] = "breaker"
    cache_size: int = Field(default=10_000, ge=0, le=10_000_000)
    cache_ttl_s: float = Field(default=3600.0, gt=0)
    rerank_min_batch: int = Field(default=4, ge=1)
    generation: GenerationPolicy = GenerationPolicy()
    preset: str | None = None
    idempotent: bool | None = None
    adaptive: AdaptivePolicy | None = None
    throttle: ThrottlePolicy | None = None
    hedge: HedgePolicy | None = None
    max_threads: int = Field(default=8, ge=1, le=10_000)
    layers: dict[str, Any] = Field(default_factory=dict)

    @property
    def is_idempotent(self) -> bool:
        """``idempotent``, or the preset's answer when it is None (see the class docstring)."""
        if self.idempotent is not None:
            return self.idempotent
        return self.preset in IDEMPOTENT_PRESETS

    @field_validator("hedge")
    @classmethod
    def _hedge_needs_idempotent(cls, value: HedgePolicy | None, info: Any) -> HedgePolicy | None:
        if value is not None and info.data.get("idempotent") is False:
            raise ValueError(_HEDGE_NOT_IDEMPOTENT)
        return value

    @field_validator("layers")
    @classmethod
    def _registered_layers(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not value:
            return value
        from .layers import layer_policy_model

        checked: dict[str, Any] = {}
        for name, options in value.items():
            model = layer_policy_model(name)  # ValueError naming the registered layers
            if isinstance(options, model):
                checked[name] = options
                continue
            if not isinstance(options, Mapping):
                got = type(options).__name__
                raise ValueError(f"{name}: expected a mapping of the layer's options, got {got}")
            try:
                checked[name] = model(**options)
            except (ValidationError, ConfigError) as exc:
                raise ValueError(f"{name}: {_validate.bounded(str(exc), 300)}") from None
        return checked

    @model_validator(mode="after")
    def _known_preset(self) -> StagePolicy:
        if self.preset is not None:
            from .rag import PRESETS

            if self.preset not in PRESETS:
                known = ", ".join(sorted(PRESETS))
                raise ValueError(f"unknown preset {_validate.shown(self.preset)}; known: {known}")
        return self


IDEMPOTENT_PRESETS = frozenset({"embedding", "vector_store", "rerank", "generation"})
"""The presets whose stages are idempotent reads unless ``StagePolicy.idempotent`` says otherwise
(a generation without tools has no effect at the provider; set ``idempotent: false`` for one that
calls tools)."""

_HEDGE_NOT_IDEMPOTENT = (
    "hedge needs an idempotent stage: a hedged call runs twice; set idempotent: true (or use a "
    "preset whose calls are reads: embedding, vector_store, rerank, generation)"
)


def _standard_stages() -> dict[str, StagePolicy]:
    return {
        "embedding": StagePolicy(
            preset="embedding",
            timeout_s=5.0,
            breaker=BreakerPolicy(kind="embedding_timeout"),
            retry=RetryPolicy(attempts=2, retry_on=("connection", "rejection")),
        ),
        "vector_store": StagePolicy(
            preset="vector_store",
            timeout_s=2.0,
            breaker=BreakerPolicy(kind="vector_store_unavailable"),
            retry=RetryPolicy(attempts=2, retry_on=("connection", "timeout", "rejection")),
        ),
        "rerank": StagePolicy(
            preset="rerank",
            timeout_s=None,
            breaker=BreakerPolicy(kind="rerank_oom"),
            retry=RetryPolicy(attempts=1, retry_on=()),
        ),
        "generation": StagePolicy(
            preset="generation",
            timeout_s=None,
            breaker=BreakerPolicy(kind="generic"),
            retry=RetryPolicy(attempts=2, retry_on=("connection", "timeout", "rejection")),
        ),
    }


STANDARD_STAGES = ("embedding", "vector_store", "rerank", "generation")


def _overlay(base: _M, given: _M) -> _M:
    """``base`` with the fields ``given`` set explicitly, nested models merged the same way (so
    ``breaker: {open_for_s: 10}`` keeps the standard breaker kind)."""
    update: dict[str, Any] = {}
    for name in given.model_fields_set:
        value = getattr(given, name)
        current = getattr(base, name)
        if isinstance(value, _Model) and type(value) is type(current):
            value = _overlay(current, value)
        update[name] = value
    return base.model_copy(update=update)


class Policy(_Model):
    """Every stage's and every tenant's settings.

    - ``stages``: stage name -> StagePolicy. The standard stages ``embedding``, ``vector_store``,
      ``rerank`` and ``generation`` are always present with their presets and breakers; for those,
      the fields you set override the standard values and the rest keep them. Stages not listed use
      ``default_stage``.
    - ``tenants``: tenant id -> TenantQuota; tenants not listed get ``default_quota`` each.
    - ``unlisted_pool``: the bound the tenants not listed share all together (a
      :class:`PoolQuota`), so that new tenant ids cannot multiply ``default_quota``. None (the
      default): ``default_quota``'s concurrency, rate and burst, i.e. all of them together get
      what one of them gets, like one anonymous tenant. ``{}`` (no limit) gives each its own
      ``default_quota`` with no bound on the sum: only when every tenant id is authenticated.
      Listed tenants are never counted in it.
    """

    stages: dict[str, StagePolicy] = Field(default_factory=_standard_stages)
    default_stage: StagePolicy = StagePolicy(breaker=BreakerPolicy(kind="generic"))
    tenants: dict[str, TenantQuota] = Field(default_factory=dict)
    default_quota: TenantQuota = TenantQuota()
    unlisted_pool: PoolQuota | None = None
    _pool: tuple[Any, PoolQuota | None] = PrivateAttr(default=(None, None))

    @model_validator(mode="after")
    def _set_pool(self) -> Policy:
        self._pool = self._derive_pool()
        return self

    def _derive_pool(self) -> tuple[Any, PoolQuota | None]:
        """``(what it was derived from, the pool or None)``: one object for every unlisted tenant,
        so backends tell a changed pool by identity."""
        given = self.unlisted_pool
        if given is not None:
            return given, None if given.unlimited else given
        q = self.default_quota
        derived = PoolQuota(max_concurrency=q.max_concurrency, rate_per_s=q.rate_per_s, burst=q.burst)
        return q, None if derived.unlimited else derived

    @model_validator(mode="after")
    def _fill_standard(self) -> Policy:
        # A standard stage given by the user keeps the standard values of the fields it leaves
        # unset: setting only ``timeout_s`` must not drop the typed breaker.
        stages = _standard_stages()
        for name, given in self.stages.items():
            base = stages.get(name)
            if base is None:
                stages[name] = given
            else:
                stages[name] = _overlay(base, given)
        object.__setattr__(self, "stages", stages)
        checked = [(f"stages.{name}", stage) for name, stage in stages.items()]
        for where, stage in [*checked, ("default_stage", self.default_stage)]:
            try:
                stage.breaker.config()
            except ConfigError as exc:
                raise ConfigError(str(exc), field=f"{where}.breaker.{exc.field}") from None
            if stage.hedge is not None and not stage.is_idempotent:
                raise ConfigError(_HEDGE_NOT_IDEMPOTENT, field=f"{where}.hedge")
        from ._context import validate_tenant_id

        for tenant_id in self.tenants:
            validate_tenant_id(tenant_id)
        return self

    def stage(self, name: str) -> StagePolicy:
        """The policy of stage ``name`` (``default_stage`` when not listed)."""
        return self.stages.get(name, self.default_stage)

    def pool(self, tenant_id: str) -> PoolQuota | None:
        """The aggregate bound ``tenant_id`` shares with the other tenants not listed (see
        ``unlisted_pool``); None for a listed tenant, or when the pool limits nothing."""
        try:
            if tenant_id in self.tenants:
                return None
        except TypeError:  # an unhashable id: not a tenant; the tenant context rejects it by name
            return None
        source, pool = self._pool
        if source is not (self.unlisted_pool if self.unlisted_pool is not None else self.default_quota):
            source, pool = self._pool = self._derive_pool()  # after model_copy(update=...)
        return pool

    def quota(self, tenant_id: str) -> TenantQuota:
        """The quota of ``tenant_id`` (``default_quota`` when not listed)."""
        try:
            return self.tenants.get(tenant_id, self.default_quota)
        except TypeError:  # an unhashable id: not a tenant; the tenant context rejects it by name
            return self.default_quota

    # -- loading ----------------------------------------------------------------------------

    @classmethod
    def parse(cls, data: Mapping[str, Any], *, source: str = "policy") -> Policy:
        """Validate a mapping; raises ConfigError naming each bad field and its allowed range.

        A mapping holding more than :data:`MAX_POLICY_VALUES` values (counting each use of a
        shared value, as YAML aliases expand) is refused before it is validated."""
        if not _fits(data, MAX_POLICY_VALUES):
            raise ConfigError(
                f"{_validate.bounded(source, 200)}: more than {MAX_POLICY_VALUES:,} values once YAML "
                "aliases are expanded, far more than any policy needs"
            )
        try:
            depth = getattr(_nesting, "depth", 0)
            _nesting.depth = depth + 1
            try:
                return cls.model_validate(dict(data))
            finally:
                _nesting.depth = depth
        except ValidationError as exc:
            raise _config_error(exc, source) from None
        except ValueError as exc:
            raise ConfigError(_validate.bounded(f"{source}: {exc}", 500)) from None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Policy:
        """Load a ``.yaml``/``.yml``, ``.toml`` or ``.json`` file; raises ConfigError when invalid."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read policy file {p}: {exc.strerror}") from exc
        try:
            if p.suffix in (".yaml", ".yml"):
                data = yaml.safe_load(text) or {}
            elif p.suffix == ".toml":
                data = tomllib.loads(text)
            elif p.suffix == ".json":
                data = json.loads(text)
            else:
                raise ConfigError(f"policy file {p}: use .yaml, .yml, .toml or .json, not {p.suffix!r}")
        except (yaml.YAMLError, tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            detail = _validate.bounded(str(exc), 500)
            raise ConfigError(f"policy file {p} is not valid {p.suffix[1:].upper()}: {detail}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"policy file {p}: the top level must be a mapping")
        return cls.parse(data, source=str(p))

    @classmethod
    def from_env(cls, prefix: str = "RAGGUARD_", environ: Mapping[str, str] | None = None) -> Policy:
        """Build a policy from environment variables ``{prefix}FIELD__KEY__SUBFIELD=value``.

        ``RAGGUARD_STAGES__EMBEDDING__TIMEOUT_S=2.5`` sets ``stages.embedding.timeout_s``;
        ``RAGGUARD_TENANTS__ACME__MAX_CONCURRENCY=8`` the quota of tenant ``acme``. Names are
        case-insensitive and read in lower case (a tenant id with capitals needs a policy file).
        Values are parsed as JSON where they parse (numbers, booleans, lists), else kept as
        strings. ``environ`` defaults to :data:`os.environ` and is only read. Raises ConfigError
        naming the variable or the field.
        """
        env = os.environ if environ is None else environ
        top = set(cls.model_fields)
        data: dict[str, Any] = {}
        wanted = prefix.upper()
        for name, raw in env.items():
            if not name.upper().startswith(wanted):
                continue
            path = [part.lower() for part in name[len(prefix) :].split("__")]
            if path[0] not in top or any(not part for part in path):
                raise ConfigError(
                    f"environment variable {_validate.bounded(name)}: {_validate.shown(path[0])} is not a "
                    "policy field; "
                    f"use {prefix}<{'|'.join(sorted(f.upper() for f in top))}>__..."
                )
            node = data
            for part in path[:-1]:
                child = node.setdefault(part, {})
                if not isinstance(child, dict):
                    raise ConfigError(
                        f"environment variable {_validate.bounded(name)}: {_validate.shown(part)} is set "
                        "both as a value and a group"
                    )
                node = child
            try:
                node[path[-1]] = json.loads(raw)
            except ValueError:
                node[path[-1]] = raw
        return cls.parse(data, source=f"environment ({prefix}*)")


def policy_of(
    given: Policy | Mapping[str, Any] | str | os.PathLike[str] | None, *, who: str
) -> Policy | None:
    """``given`` (a Policy, a mapping, or a YAML/TOML/JSON path; None stays None) as a Policy, for
    ``configure()`` and ``fresh_guard()`` (``who``); ConfigError for anything else or an invalid one."""
    if given is None or isinstance(given, Policy):
        return given
    if isinstance(given, Mapping):
        return Policy.parse(given)
    if isinstance(given, (str, os.PathLike)):
        return Policy.from_file(Path(given))
    raise ConfigError(f"{who}() takes a Policy, a mapping or a file path, not {type(given).__name__}")


def _fits(data: Any, limit: int) -> bool:
    """True when ``data`` holds at most ``limit`` values, each use of a shared one counted."""
    stack, seen = [data], 0
    while stack:
        value = stack.pop()
        seen += 1
        if seen > limit:
            return False
        if isinstance(value, Mapping):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list | tuple | set):
            stack.extend(value)
    return True


def _config_error(exc: ValidationError, source: str) -> ConfigError:
    errors = exc.errors(include_url=False)
    lines = [f"{_validate.bounded(source, 200)}: {len(errors)} invalid value(s)"]
    first: str | None = None
    for err in errors[:MAX_ERRORS_SHOWN]:
        path, text = _describe_one(err)
        first = first if first is not None else path
        lines.append(_validate.bounded(f"  {path}: {text}", 400))
    if len(errors) > MAX_ERRORS_SHOWN:
        lines.append(f"  ... and {len(errors) - MAX_ERRORS_SHOWN} more")
    return ConfigError("\n".join(lines), field=first)


def _describe_one(err: Any) -> tuple[str, str]:
    """The field path of one pydantic error and what is wrong there, both bounded."""
    loc = [_validate.bounded(str(part), 40) for part in err["loc"]]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigError) and cause.field:
        # Our own rule (a breaker option): its message starts with the option's name.
        parts = cause.field.split(".")
        if not loc or loc[-1] != parts[-1]:
            loc += parts
        text, head = str(cause), parts[-1] + " "
        return ".".join(loc) or "(top level)", text[len(head) :] if text.startswith(head) else text
    return ".".join(loc) or "(top level)", _model_errors.describe(err, Policy)
