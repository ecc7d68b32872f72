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
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, overload

import yaml
from pydantic import BaseModel, Field, PrivateAttr, ValidationError, field_validator, model_validator

from .. import _validate
from .._context import validate_tenant_id
from .._errors import ConfigError
from . import _base, _layers
from ._adaptive import AdaptivePolicy
from ._base import Options
from ._breaker import BreakerPolicy
from ._hedge import HedgePolicy
from ._keyed import GroupPolicy, LimitsPolicy, check_key_id
from ._retry import RetryPolicy
from ._throttle import ThrottlePolicy

if TYPE_CHECKING:
    from pydantic_core import InitErrorDetails

__all__ = [
    "IDEMPOTENT_PRESETS",
    "MAX_POLICY_VALUES",
    "STANDARD_STAGES",
    "GenerationPolicy",
    "Policy",
    "PoolQuota",
    "ReservePolicy",
    "StagePolicy",
    "TenantQuota",
    "TokenLimits",
    "policy_of",
]

MAX_POLICY_VALUES = 1_000_000
"""The most values (mappings, lists and scalars, counted after YAML aliases expand) a policy holds."""

Priority = Literal["critical", "interactive", "batch"]

_M = TypeVar("_M", bound=Options)


_MODEL_NAME_MAX = 128


def _unused(where: str, limits: TokenLimits | TenantQuota) -> list[str]:
    """What :meth:`Policy.unreachable_limits` finds within one quota (see there)."""
    found = []
    if isinstance(limits, TenantQuota) and limits.burst is not None and limits.rate_per_s is None:
        found.append(f"{where}.burst is set without rate_per_s: it limits nothing")
    if limits.token_burst is not None and limits.tokens_per_s is None:
        found.append(f"{where}.token_burst is set without tokens_per_s: it limits nothing")
    total = limits.token_quota
    for name in ("input_token_quota", "output_token_quota"):
        part = getattr(limits, name)
        if total is not None and part is not None and part >= total:
            found.append(
                f"{where}.{name} ({part}) is never reached: {where}.token_quota ({total}) counts input "
                "and output together in the same window and refuses first"
            )
    return found


def _looser(at: str, model: TokenLimits, where: str, tenant: TenantQuota) -> list[str]:
    """The limits of ``model`` that ``tenant``'s own of the same kind are always as tight as."""
    found = []
    for name in ("token_quota", "input_token_quota", "output_token_quota"):
        mine, theirs = getattr(model, name), getattr(tenant, name)
        if mine is None or theirs is None:
            continue
        if mine >= theirs and mine / model.token_window_s >= theirs / tenant.token_window_s:
            found.append(
                f"{at}.{name} ({mine} per {model.token_window_s:g} s) is never reached: the tenant's "
                f"own {where}.{name} ({theirs} per {tenant.token_window_s:g} s) is always as tight"
            )
    rate, theirs_rate = model.tokens_per_s, tenant.tokens_per_s
    if rate is not None and theirs_rate is not None and rate >= theirs_rate:
        theirs_burst = burst_of(theirs_rate, tenant.token_burst)
        if burst_of(rate, model.token_burst) >= theirs_burst:
            found.append(
                f"{at}.tokens_per_s ({rate:g}) is never reached: the tenant's own {where}.tokens_per_s "
                f"({theirs_rate:g}, burst {theirs_burst}) paces every stream at least as tightly"
            )
    return found


@overload
def burst_of(rate: float, burst: int | None) -> int: ...
@overload
def burst_of(rate: None, burst: int | None) -> None: ...
def burst_of(rate: float | None, burst: int | None) -> int | None:
    """The burst of a rate (``rate_per_s`` and ``burst``, ``tokens_per_s`` and ``token_burst``):
    ``burst``, else a second's worth of the rate (at least 1) when it is not set; None without a
    rate. The one statement of that default (the quotas, the token accounts and the Redis scripts
    all ask it)."""
    if rate is None:
        return None
    return burst if burst is not None else max(1, math.ceil(rate))


class _Requests(Options):
    """The request limits a tenant's quota and a pool share (see :class:`TenantQuota`)."""

    max_concurrency: int | None = Field(default=None, ge=1, le=1_000_000)
    rate_per_s: float | None = Field(default=None, gt=0, le=1e9)
    burst: int | None = Field(default=None, ge=1, le=1_000_000_000)


class TokenLimits(Options):
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


class TenantQuota(TokenLimits, _Requests):
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
      ``token_quota`` counts both together. A stream reserves its input estimate (the stage's
      ``input_tokens=``; the integrations' is the text they send, characters / 4) and settles
      with the input the provider reports (OpenAI's ``prompt_tokens``, Anthropic's input), 0 when
      neither is given; output tokens likewise (docs/integrations.md says which fields).
    - ``models``: model name -> :class:`TokenLimits`, limits of the tenant's streams of that model
      on top of the tenant's own (the stage's ``model=`` option names the call's model, and every
      integration passes its call's; a model not listed has the tenant's limits only). Names are
      1 to 128 printable characters. A limit no call can reach (one the tenant's own is always as
      tight as...) is logged when a Guard is built (:meth:`Policy.unreachable_limits`).
    - ``priority``: the priority of the tenant's requests at the stages' adaptive limits
      (``critical``, ``interactive`` or ``batch``; a front door's ``x-priority`` header may lower
      it per request, and raise it only for a trusted caller; :func:`ragguard.overload.priority`
      in code overrides it). Over a limit, lower
      priorities are shed first.
    - ``weight``: the tenant's share when shedding within one priority (> 0, default 1): the
      tenant whose usage per unit of weight is highest is shed first.
    """

    # the request limits (max_concurrency, rate_per_s, burst) and the tenant's own token limits
    # are those of _Requests and TokenLimits
    max_wait_s: float = Field(default=0.0, ge=0, le=3600)
    timeout_s: float | None = Field(default=None, gt=0, le=86_400)
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
        return super().limits_tokens or any(m.limits_tokens for m in self.models.values())

    @property
    def unlimited(self) -> bool:
        return self.max_concurrency is None and self.rate_per_s is None and self.timeout_s is None


class PoolQuota(_Requests):
    """A bound that a group of tenants share together (None means unlimited): the tenants not
    named in :attr:`Policy.tenants` share one (:attr:`Policy.unlisted_pool`).

    - ``max_concurrency``: requests of the whole group in flight at once, >= 1.
    - ``rate_per_s``: requests of the whole group admitted per second (GCRA), > 0.
    - ``burst``: requests admitted back to back above the rate, >= 1 (default: ceil(rate_per_s)).

    Each request of a member counts against its own :class:`TenantQuota` and against the pool: it
    is admitted only when both have a slot and a token (waiting, first come first served, up to
    the tenant's ``max_wait_s``).
    """

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
                and burst_of(self.rate_per_s, self.burst) <= burst_of(quota.rate_per_s, quota.burst))


class GenerationPolicy(Options):
    """The stream budgets (seconds; None: no such budget) and the shrink of a ``generation`` stage.

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
    - ``max_shrinks``: for a function that names its passages (``@guard(passages=...)``), how
      many times a call the model refused as longer than its context window is made again with
      fewer passages (the lowest-ranked dropped), within the deadline, 0-10 (0: never). Default 2.
    - ``min_passages``: a shrink never sends fewer passages than this, >= 0. Default 1.
    """

    first_item_s: float | None = Field(default=30.0, gt=0, le=86_400)
    idle_s: float | None = Field(default=10.0, gt=0, le=86_400)
    total_s: float | None = Field(default=300.0, gt=0, le=86_400)
    estimate_tokens: int = Field(default=256, ge=1, le=1_000_000_000)
    max_shrinks: int = Field(default=2, ge=0, le=10)
    min_passages: int = Field(default=1, ge=0, le=1_000_000)
class ReservePolicy(Options):
    """The time a stage with a fallback keeps for it under a deadline (its *reserve*).

    The primary attempts (retries and their backoff included) run under a deadline that ends the
    reserve's length before the request's, so a hung or slow dependency is cut while its fallback
    can still answer in time; the fallback then runs under the request's own deadline. By
    default the reserve is learnt: the ``percentile`` of the fallback chain's recent latencies
    (from the failure to its answer, misses of earlier fallbacks included; for a stream, to its
    first item) times ``margin``, within ``min_s`` and ``max_s``; and never more than
    ``max_share`` of the time left when the stage starts, so the primary always gets a real
    chance. A stream keeps it until its first item (its fallback serves only before it). Kept
    only under a deadline, and only by a stage that has a fallback.

    - ``fixed_s``: a fixed reserve in seconds instead of the learnt one (still at most
      ``max_share`` of the time left), 0 to 3600; 0 turns the reserve off. None (the default):
      learnt. A stage's ``reserve`` may be given as this number alone (``reserve: 0``).
    - ``min_s``: the floor of the learnt reserve, 0 to 60 (default 0.05: a cheap fallback still
      needs the event loop to come back to it, and a busy loop lags by tens of milliseconds).
    - ``max_s``: the ceiling of the learnt reserve, 0 to 3600, >= ``min_s`` (default 2.0; raise it
      for a fallback that is itself a slow call, such as a second model).
    - ``max_share``: the most of the time left when the stage starts that the reserve may take,
      > 0 and <= 0.9 (default 0.25: the primary keeps at least three quarters).
    - ``percentile``: which percentile of the fallback's recent latencies is learnt, 50 to 100
      (default 99: P99).
    - ``margin``: the learnt percentile is multiplied by this, 1 to 10 (default 1.5).
    - ``window``: how many of the fallback's most recent latencies are kept, 1 to 10000
      (default 100).
    """

    fixed_s: float | None = Field(default=None, ge=0, le=3600)
    min_s: float = Field(default=0.05, ge=0, le=60)
    max_s: float = Field(default=2.0, ge=0, le=3600)
    max_share: float = Field(default=0.25, gt=0, le=0.9)
    percentile: float = Field(default=99.0, ge=50, le=100)
    margin: float = Field(default=1.5, ge=1, le=10)
    window: int = Field(default=100, ge=1, le=10_000)

    @model_validator(mode="after")
    def _ordered(self) -> ReservePolicy:
        if self.max_s < self.min_s:
            raise ValueError(f"max_s ({self.max_s:g}) must be >= min_s ({self.min_s:g})")
        return self

    @property
    def off(self) -> bool:
        """Whether the reserve is turned off (``fixed_s`` 0)."""
        return self.fixed_s == 0


class StagePolicy(Options):
    """How one stage is guarded.

    - ``timeout_s``: per-attempt timeout in seconds (None: only the deadline bounds it).
    - ``min_attempt_s``: no attempt starts with less budget than this (seconds); a call with less
      left raises DeadlineExceeded at once instead of starting work it cannot finish.
    - ``deadline_share``: the most of the request's deadline the stage may spend, as a share of
      the time left when it starts, > 0 and <= 1 (None, the default: all of it). The stage runs
      under a deadline that ends there, its fallback and retries included, so the stages after it
      keep their time; one that runs out of it raises DeadlineExceeded (its fallback, if any,
      answers first within the share). The standard stages have shares of their own (see the
      standard stages' table).
    - ``reserve``: the time a stage with a fallback keeps for it under a deadline
      (:class:`ReservePolicy`; a number alone is its ``fixed_s``, 0 turns it off).
    - ``breaker``: the breaker kind and options; ``retry``: the retry policy.
    - ``fallback_on``: which failures the stage's fallback serves: ``breaker`` (the breaker's own
      failure kinds and BreakerOpen, the default) or ``any`` (every Exception but cancellation).
    - ``preset``: the RAG preset the stage runs (``embedding``, ``vector_store``, ``rerank``,
      ``generation``, or one registered with :func:`ragguard.rag.register_preset`; None: the
      generic layers only). The standard stages of the same names have theirs, and a stage that
      names a standard stage's preset starts from that stage's values (its timeout, breaker and
      retries: ``backup: {preset: generation}`` retries as ``generation`` does); the fields it
      sets replace them.
    - embedding cache (``embedding`` preset): ``cache_size`` entries, ``cache_ttl_s`` seconds.
    - rerank (``rerank`` preset): ``rerank_min_batch`` is the floor the batch is halved down to.
    - ``generation`` (``generation`` preset): the stream budgets and the token estimate
      (:class:`GenerationPolicy`).
    - ``layers``: every configured layer's options by layer name, each validated by that layer's
      own options model: the built-in layers' (``retry``, ``hedge``, ``throttle``, ``adaptive``,
      ``breaker``: usually written at the stage's top level, as fields) and those of layers added
      with :func:`ragguard.layers.register_layer`. Options for a name no layer has registered yet
      are kept as given and validated when a Guard is built (ConfigError naming the field, or
      the unknown layer and the nearest name); a layer with no entry is left out of the stage's
      chain unless it says otherwise (``retry`` and ``breaker`` run with their models' defaults).
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
    - ``limits``: requests and tokens per window (:class:`~ragguard.options.LimitsPolicy`): of each
      key of a keyed stage, else of the stage as a whole. None: none.

    Keyed by deployment (docs/layers.md, "Keyed stages"): each key (a model, an endpoint) gets its
    own breaker, adaptive limit, throttle, hedge and retry budgets, reserve and limits, under this
    one configuration:

    - ``key``: the parameter whose value is a call's key (``@guard(key=...)`` in code may name
      one or give a function of the arguments instead); None: the stage is keyed only by the
      functions that say so in code.
    - ``keys``: key -> its own options over the stage's (``{"gpt-4o": {"breaker": {...}}}``;
      a stage's fields but its preset, keys and threads): a key named here is always kept.
    - ``max_keys``: keys kept at once besides those named in ``keys``, 1 to 10000 (default 64);
      a new key past it runs on the stage's own instance (the overflow, shared by every key past
      the bound), so no caller's input grows memory, Redis keys or metric series without bound.
    - ``key_idle_s``: a key with no call in flight, a closed breaker and no call for this long is
      forgotten when a new key needs its room, seconds >= 1 (default 300). Its calls are counted,
      not timed: the map, looking at its keys as new ones ask for room (at most every quarter of
      this), takes a key as quiet from the first look that finds no new call, so a key goes at
      least this long after its last call.
    """

    timeout_s: float | None = Field(default=None, gt=0, le=86_400)
    min_attempt_s: float = Field(default=0.0, ge=0, le=3600)
    deadline_share: float | None = Field(default=None, gt=0, le=1)
    reserve: ReservePolicy = ReservePolicy()
    fallback_on: Literal["breaker", "any"] = "breaker"
    cache_size: int = Field(default=10_000, ge=0, le=10_000_000)
    cache_ttl_s: float = Field(default=3600.0, gt=0)
    rerank_min_batch: int = Field(default=4, ge=1)
    generation: GenerationPolicy = GenerationPolicy()
    preset: str | None = None
    idempotent: bool | None = None
    max_threads: int = Field(default=8, ge=1, le=10_000)
    key: str | None = Field(default=None, min_length=1, max_length=200)
    keys: dict[str, StagePolicy] = Field(default_factory=dict)
    max_keys: int = Field(default=64, ge=1, le=10_000)
    key_idle_s: float = Field(default=300.0, ge=1, le=31 * 86_400)
    layers: dict[str, Any] = Field(default_factory=dict)

    if TYPE_CHECKING:  # the built-in layers' options are keywords too (moved into ``layers``)

        def __init__(
            self,
            *,
            timeout_s: float | None = None,
            min_attempt_s: float = 0.0,
            deadline_share: float | None = None,
            reserve: ReservePolicy | Mapping[str, Any] | float = ...,
            fallback_on: Literal["breaker", "any"] = "breaker",
            cache_size: int = 10_000,
            cache_ttl_s: float = 3600.0,
            rerank_min_batch: int = 4,
            generation: GenerationPolicy | Mapping[str, Any] = ...,
            preset: str | None = None,
            idempotent: bool | None = None,
            max_threads: int = 8,
            key: str | None = None,
            keys: Mapping[str, StagePolicy | Mapping[str, Any]] = ...,
            max_keys: int = 64,
            key_idle_s: float = 300.0,
            layers: Mapping[str, Any] = ...,
            breaker: BreakerPolicy | Mapping[str, Any] | None = None,
            retry: RetryPolicy | Mapping[str, Any] | None = None,
            hedge: HedgePolicy | Mapping[str, Any] | None = None,
            throttle: ThrottlePolicy | Mapping[str, Any] | None = None,
            adaptive: AdaptivePolicy | Mapping[str, Any] | None = None,
            limits: LimitsPolicy | Mapping[str, Any] | None = None,
        ) -> None: ...

    also_spelt: ClassVar[tuple[str, ...]] = _layers.STAGE_FIELDS
    _layer_models: ClassVar[_base.LayerModels | None] = _layers
    """Names a stage's mapping may hold besides its fields: the built-in layers' options."""

    @model_validator(mode="before")
    @classmethod
    def _hoist(cls, data: Any) -> Any:
        # ``breaker: {...}`` at the stage's top level is the breaker layer's entry in ``layers``
        if not isinstance(data, Mapping) or not any(k in data for k in _layers.STAGE_FIELDS):
            return data
        data = dict(data)
        held = data.get("layers")
        if held is not None and not isinstance(held, Mapping):
            return data  # refused by the field's own check
        held = dict(held or {})
        for name in _layers.STAGE_FIELDS:
            if name in data:
                value = data.pop(name)
                if name in held:
                    raise ValueError(f"{name} is given twice: at the stage's top level and under layers")
                if value is not None:  # None: off (the default of those that are not always on)
                    held[name] = value
        data["layers"] = held
        return data

    @field_validator("reserve", mode="before")
    @classmethod
    def _reserve_number(cls, value: Any) -> Any:
        # ``reserve: 0`` (off) or ``reserve: 0.05`` (fixed): the number is the fixed reserve
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return {"fixed_s": value}
        return value

    @field_validator("layers")
    @classmethod
    def _layer_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not value:
            return value
        checked: dict[str, Any] = {}
        errors: list[Any] = []
        for name, options in value.items():
            try:
                checked[name] = _layer_options(name, options)
            except ValidationError as exc:
                errors += [_at(name, err) for err in exc.errors(include_url=False)]
            except (ConfigError, ValueError, TypeError) as exc:
                errors.append(_at(name, {"type": "value_error", "loc": (), "input": options,
                                         "ctx": {"error": exc}}))  # fmt: skip
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return checked

    @field_validator("keys")
    @classmethod
    def _key_options(cls, value: dict[str, StagePolicy]) -> dict[str, StagePolicy]:
        for name, options in value.items():
            check_key_id(name, "a key named in keys")
            stage_wide = sorted(options.model_fields_set & _STAGE_WIDE)
            if stage_wide:
                raise ValueError(
                    f"keys.{name}: {', '.join(stage_wide)}: the stage's, not one key's "
                    f"(a key may set: {', '.join(sorted(set(cls.model_fields) - _STAGE_WIDE))} "
                    "and the layers' options)"
                )
        return value

    @model_validator(mode="after")
    def _checked(self) -> StagePolicy:
        if self.preset is not None and self.preset not in _layers.PRESETS:
            known = ", ".join(sorted(_layers.PRESETS))
            raise ValueError(f"unknown preset {_validate.shown(self.preset)}; known: {known}")
        if self.layers.get("hedge") is not None and self.idempotent is False:
            raise ConfigError(_HEDGE_NOT_IDEMPOTENT, field="hedge")
        return self

    # -- the layers' options, by name -------------------------------------------------------

    def layer(self, name: str) -> Any:
        """The stage's options for the layer ``name`` (an instance of its options model), the
        model's defaults for a layer present by default (``retry``, ``breaker``), or None when
        the stage does not configure it. Options given for a layer registered after this policy
        was built are validated now; raises ConfigError (``field`` ``layers.<name>...``) when
        they are invalid or when no layer ``name`` is registered."""
        options = self.layers.get(name)
        if options is None:
            return _default(name) if name in _layers.DEFAULT_ON else None
        if isinstance(options, _Pending):
            options = self.layers[name] = _pending_checked(name, options)
        return options

    @property
    def pending(self) -> bool:
        """Whether some options wait for their layer to be registered (see :meth:`layer`)."""
        return any(isinstance(options, _Pending) for options in self.layers.values())

    def check_layers(self, where: str) -> None:
        """Validate the options kept for layers not registered when this policy was built
        (``where``: this stage's path, for the error's ``field``); ConfigError naming the field."""
        for name, options in self.layers.items():
            if isinstance(options, _Pending):
                try:
                    self.layer(name)
                except ConfigError as exc:
                    raise ConfigError(str(exc).replace("layers.", f"{where}.layers.", 1),
                                      field=f"{where}.{exc.field}") from None  # fmt: skip

    @property
    def breaker(self) -> BreakerPolicy:
        """The breaker kind and options (:class:`ragguard.BreakerPolicy`)."""
        return self.layer("breaker")  # type: ignore[no-any-return]

    @property
    def retry(self) -> RetryPolicy:
        """The retry policy (:class:`ragguard.RetryPolicy`)."""
        return self.layer("retry")  # type: ignore[no-any-return]

    @property
    def hedge(self) -> HedgePolicy | None:
        """Hedged requests (:class:`ragguard.HedgePolicy`), None: off."""
        return self.layer("hedge")  # type: ignore[no-any-return]

    @property
    def throttle(self) -> ThrottlePolicy | None:
        """Client-side adaptive throttling (:class:`ragguard.ThrottlePolicy`), None: off."""
        return self.layer("throttle")  # type: ignore[no-any-return]

    @property
    def adaptive(self) -> AdaptivePolicy | None:
        """The adaptive concurrency limit (:class:`ragguard.AdaptivePolicy`), None: off."""
        return self.layer("adaptive")  # type: ignore[no-any-return]

    @property
    def limits(self) -> LimitsPolicy | None:
        """The limits of each key, or of the stage (:class:`~ragguard.options.LimitsPolicy`), None: none."""
        return self.layer("limits")  # type: ignore[no-any-return]

    def for_key(self, key: str) -> StagePolicy:
        """The options of key ``key``: the stage's, with the key's own from ``keys`` over them."""
        own = self.keys.get(key)
        return self if own is None else _overlay(self.model_copy(update={"keys": {}}), own)

    @property
    def is_idempotent(self) -> bool:
        """``idempotent``, or the preset's answer when it is None (see the class docstring)."""
        if self.idempotent is not None:
            return self.idempotent
        return self.preset in IDEMPOTENT_PRESETS


_STAGE_WIDE = frozenset({
    "preset", "key", "keys", "max_keys", "key_idle_s", "idempotent", "max_threads", "cache_size",
    "cache_ttl_s", "rerank_min_batch",
})  # fmt: skip
"""What a key of a keyed stage cannot set for itself: the stage's preset and what its state holds."""


class _Pending(dict[str, Any]):
    """The options of a layer not registered (yet): kept as given, validated when asked for."""


def _layer_options(name: str, options: Any) -> Any:
    model = _layers.model(name)
    if model is None:
        if _layers.registered(name):
            raise ValueError(f"{name} takes no options (registered without a policy model)")
        if not isinstance(options, Mapping):
            raise ValueError(f"expected a mapping of the layer's options, got {type(options).__name__}")
        return _Pending(options)
    if isinstance(options, model):
        return options
    if not isinstance(options, Mapping):
        raise ValueError(f"expected a mapping of the layer's options, got {type(options).__name__}")
    if isinstance(model, type) and issubclass(model, BaseModel):
        return model.model_validate(dict(options))
    return model(**options)


def _pending_checked(name: str, options: _Pending) -> Any:
    if not _layers.registered(name):
        raise ConfigError(_layers.unknown(name), field=f"layers.{name}")
    try:
        with _base.nested():
            return _layer_options(name, dict(options))
    except ValidationError as exc:
        errors = [_at(name, err) for err in exc.errors(include_url=False)]
        wrapped = ValidationError.from_exception_data(
            "StagePolicy", [{**err, "loc": ("layers", *err["loc"])} for err in errors]
        )
        raise _base.config_error(wrapped, f"layer {name}", StagePolicy, _layers) from None
    except (ConfigError, ValueError, TypeError) as exc:
        text = _validate.bounded(str(exc), 300)
        raise ConfigError(f"layers.{name}: {text}", field=f"layers.{name}") from None


def _at(name: str, err: Any) -> InitErrorDetails:
    """Pydantic's error ``err`` of the options of layer ``name``, placed under that name."""
    return {"type": err["type"], "loc": (name, *err["loc"]), "input": err.get("input"),
            "ctx": err.get("ctx") or {}}  # fmt: skip


_DEFAULTS: dict[str, Any] = {}


def _default(name: str) -> Any:
    made = _DEFAULTS.get(name)
    if made is None:
        model = _layers.model(name)
        assert model is not None
        made = _DEFAULTS[name] = model()
    return made


IDEMPOTENT_PRESETS = frozenset({"embedding", "vector_store", "rerank", "generation"})
"""The presets whose stages are idempotent reads unless ``StagePolicy.idempotent`` says otherwise
(a generation without tools has no effect at the provider; set ``idempotent: false`` for one that
calls tools)."""

_HEDGE_NOT_IDEMPOTENT = (
    "hedge needs an idempotent stage: a hedged call runs twice; set idempotent: true (or use a "
    "preset whose calls are reads: embedding, vector_store, rerank, generation)"
)


STANDARD_STAGE_OPTIONS: dict[str, dict[str, Any]] = {
    "embedding": {
        "preset": "embedding",
        "deadline_share": 0.25,
        "timeout_s": 5.0,
        "breaker": {"kind": "embedding_timeout"},
        "retry": {"attempts": 2, "retry_on": ("connection", "rejection")},
    },
    "vector_store": {
        "preset": "vector_store",
        "deadline_share": 0.25,
        "timeout_s": 2.0,
        "breaker": {"kind": "vector_store_unavailable"},
        "retry": {"attempts": 2, "retry_on": ("connection", "timeout", "rejection")},
    },
    "rerank": {
        "preset": "rerank",
        "deadline_share": 0.3,
        "timeout_s": None,
        "breaker": {"kind": "rerank_oom"},
        "retry": {"attempts": 1, "retry_on": ()},
    },
    "generation": {
        "preset": "generation",
        "deadline_share": 1.0,
        "timeout_s": None,
        "breaker": {"kind": "generic", "minimum_calls": 10},
        "retry": {"attempts": 2, "retry_on": ("connection", "timeout", "rejection")},
    },
}
"""What the standard stages set (each with the preset of its name); the rest are the defaults."""


def _standard_stages() -> dict[str, StagePolicy]:
    return {name: StagePolicy(**options) for name, options in STANDARD_STAGE_OPTIONS.items()}


def _with_preset_defaults(given: StagePolicy) -> StagePolicy:
    """``given`` over the standard stage of its preset (the fields it sets win), or ``given`` as
    it is when its preset is not a standard stage's (None, or one registered by the user)."""
    options = STANDARD_STAGE_OPTIONS.get(given.preset) if given.preset is not None else None
    return given if options is None else _overlay(StagePolicy(**options), given)


STANDARD_STAGES = ("embedding", "vector_store", "rerank", "generation")

PROVIDER_STAGES = ("openai", "anthropic")
"""The stages the OpenAI and Anthropic integrations run their generations as by default: each
starts from the policy's ``generation`` stage (the standard one with what you set for it), and
the fields you set for it replace those; each has its own runtime, so one provider's faults never
refuse another's calls."""


def _standard_origin(name: str, stage: StagePolicy) -> str | None:
    """The standard stage whose values the stage ``name`` started from, or None."""
    if name in STANDARD_STAGE_OPTIONS:
        return name
    if name in PROVIDER_STAGES:
        return "generation"
    return stage.preset if stage.preset in STANDARD_STAGE_OPTIONS else None


def _overlay(base: _M, given: _M) -> _M:
    """``base`` with the fields ``given`` set explicitly, nested models merged the same way (so
    ``breaker: {open_for_s: 10}`` keeps the standard breaker kind)."""
    update: dict[str, Any] = {}
    for name in given.model_fields_set:
        value = getattr(given, name)
        current = getattr(base, name)
        if isinstance(value, Options) and type(value) is type(current):
            value = _overlay(current, value)
        elif name == "layers":  # by layer name, each layer's options merged the same way
            value = {**current, **{
                layer: _overlay(current[layer], options)
                if isinstance(options, Options) and type(options) is type(current.get(layer)) else options
                for layer, options in value.items()
            }}  # fmt: skip
        update[name] = value
    return base.model_copy(update=update)


class Policy(Options):
    """Every stage's and every tenant's settings.

    - ``stages``: stage name -> StagePolicy. The standard stages ``embedding``, ``vector_store``,
      ``rerank`` and ``generation`` are always present with their presets and breakers; for those,
      the fields you set override the standard values and the rest keep them; so does any stage
      (and ``default_stage``) whose ``preset`` is one of theirs. Stages not listed use
      ``default_stage``.
      The provider stages ``openai`` and ``anthropic`` (:data:`PROVIDER_STAGES`) start from the
      ``generation`` stage as you set it.
    - ``groups``: model group name -> :class:`~ragguard.options.GroupPolicy` (its deployments,
      bound to callables by name in code: :meth:`ragguard.Guard.group`).
    - ``tenants``: tenant id -> TenantQuota; tenants not listed get ``default_quota`` each.
    - ``unlisted_pool``: the bound the tenants not listed share all together (a
      :class:`PoolQuota`), so that new tenant ids cannot multiply ``default_quota``. None (the
      default): ``default_quota``'s concurrency, rate and burst, i.e. all of them together get
      what one of them gets, like one anonymous tenant. ``{}`` (no limit) gives each its own
      ``default_quota`` with no bound on the sum: only when every tenant id is authenticated.
      Listed tenants are never counted in it.
    """

    stages: dict[str, StagePolicy] = Field(default_factory=_standard_stages)
    default_stage: StagePolicy = StagePolicy()
    groups: dict[str, GroupPolicy] = Field(default_factory=dict)
    tenants: dict[str, TenantQuota] = Field(default_factory=dict)
    default_quota: TenantQuota = TenantQuota()
    unlisted_pool: PoolQuota | None = None
    _pool: tuple[Any, PoolQuota | None] = PrivateAttr(default=(None, None))
    _layer_models: ClassVar[_base.LayerModels | None] = _layers

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
        # unset: setting only ``timeout_s`` must not drop the typed breaker. So does any stage that
        # names a standard stage's preset (``backup: {preset: generation}`` retries as the
        # standard ``generation`` stage does), and ``default_stage`` when it names one.
        stages = _standard_stages()
        given = {f"stages.{name}": own for name, own in self.stages.items()}  # as written, for errors
        given["default_stage"] = self.default_stage
        for name, stage in self.stages.items():
            if name in PROVIDER_STAGES:
                continue
            base = stages.get(name)
            stages[name] = _with_preset_defaults(stage) if base is None else _overlay(base, stage)
        for name in PROVIDER_STAGES:  # after generation, as you set it
            own = self.stages.get(name)
            stages[name] = stages["generation"] if own is None else _overlay(stages["generation"], own)
        object.__setattr__(self, "stages", stages)
        if self.default_stage.preset in STANDARD_STAGE_OPTIONS:
            object.__setattr__(self, "default_stage", _with_preset_defaults(self.default_stage))
        checked = [(f"stages.{name}", stage) for name, stage in stages.items()]
        for where, stage in [*checked, ("default_stage", self.default_stage)]:
            keyed = [(f"{where}.keys.{key}", stage.for_key(key)) for key in stage.keys]
            for at, options in [(where, stage), *keyed]:
                try:
                    options.breaker.config()
                except ConfigError as exc:
                    written = given.get(where)
                    origin = _standard_origin(where.removeprefix("stages."), stage)
                    message = str(exc)
                    if origin is not None and exc.field in STANDARD_STAGE_OPTIONS[origin]["breaker"] and (
                        written is None or exc.field not in written.breaker.model_fields_set
                    ):  # a value the user never wrote: say where it came from
                        message += f" (the standard {origin} stage's value)"
                    raise ConfigError(message, field=f"{at}.breaker.{exc.field}") from None
                if options.hedge is not None and not options.is_idempotent:
                    raise ConfigError(_HEDGE_NOT_IDEMPOTENT, field=f"{at}.hedge")
        for name in self.groups:
            try:
                check_key_id(name, "a group's name")
            except ValueError as exc:
                raise ConfigError(str(exc), field=f"groups.{name[:40]}") from None
        for tenant_id in self.tenants:
            validate_tenant_id(tenant_id)
        return self

    def stage(self, name: str) -> StagePolicy:
        """The policy of stage ``name`` (``default_stage`` when not listed). Options it keeps for
        a layer that was not registered when the policy was built are validated now (the Guard
        asks when it builds the stage): ConfigError naming the field when they are invalid or no
        such layer is registered."""
        stage = self.stages.get(name)
        if stage is None:
            stage, where = self.default_stage, "default_stage"
        else:
            where = f"stages.{name}"
        if stage.pending:
            stage.check_layers(where)
        return stage

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

    def unreachable_limits(self) -> list[str]:
        """The limits of this policy that no call can ever reach, each a sentence naming its field
        (a :class:`~ragguard.Guard` logs them when it is built): a ``burst`` without
        ``rate_per_s``, a ``token_burst`` without ``tokens_per_s``, an entry of ``models`` that
        sets no limit; an ``input_token_quota`` or ``output_token_quota`` not below the
        ``token_quota`` beside it (a stream's input and its output are each at most their sum,
        counted in the same window); a model's limit that the tenant's own of the same kind is
        always at least as tight as (its bucket holds no more and refills no faster: every stream
        of the model takes the tenant's bucket too). [] when there is none."""
        found: list[str] = []
        quotas = [("default_quota", self.default_quota)]
        quotas += [(f"tenants.{tenant}", quota) for tenant, quota in self.tenants.items()]
        for where, quota in quotas:
            found += _unused(where, quota)
            for model, limits in quota.models.items():
                at = f"{where}.models.{model}"
                if not limits.limits_tokens:
                    found.append(f"{at} sets no limit")
                found += _unused(at, limits) + _looser(at, limits, where, quota)
        return found

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
            with _base.nested():
                return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise _base.config_error(exc, source, cls, _layers) from None
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
