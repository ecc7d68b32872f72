"""The retry layer's options (:mod:`ragguard.layers._retry`): attempts, backoff, what is retried,
the retry budget.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from ._base import Options

__all__ = ["RetryOn", "RetryPolicy"]


RetryOn = Literal["connection", "timeout", "out_of_memory", "rejection", "any"]


class RetryPolicy(Options):
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
      have left (a refused connection, a connect timeout). A dependency's own word replaces what
      its status says, as the OpenAI and Anthropic SDKs let it: ``x-should-retry: false`` is never
      retried (a 500 included), ``x-should-retry: true`` is (a 400 included) when the stage
      retries at all (``Outcome.retry``).
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
