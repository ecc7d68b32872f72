"""The breaker layer's options (:mod:`ragguard.layers._breaker`): which breaker kind guards a stage,
and its options, checked by the breaker's own rules (:mod:`ragguard.breakers`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import PrivateAttr, field_validator

from .._errors import ConfigError
from ..breakers import (
    CircuitBreaker,
    EmbeddingTimeoutBreaker,
    RerankOOMBreaker,
    VectorStoreUnavailableBreaker,
)
from ..breakers._options import OPTIONS, BreakerConfig, check_option
from ._base import Options

__all__ = ["BREAKER_KINDS", "BreakerKind", "BreakerPolicy"]


BreakerKind = Literal["embedding_timeout", "vector_store_unavailable", "rerank_oom", "generic", "none"]


class BreakerPolicy(Options):
    """Which breaker guards a stage and its options; None keeps the kind's default.

    - ``kind``: ``embedding_timeout``, ``vector_store_unavailable``, ``rerank_oom`` (the typed
      breakers, each with its defaults and its error), ``generic`` (counts every error but a
      caller's) or ``none`` (no breaker).
    - every other field is the option of the same name of :class:`ragguard.breakers.BreakerConfig`,
      which declares each one's default, range and meaning once (resilience4j's names: ``open_for_s``
      is its ``waitDurationInOpenState``) and checks each value here by the same rule. The rules
      between options (``minimum_calls`` <= ``window_size`` of a count window, a time window of at
      most a day, ``open_max_s`` >= ``open_for_s``) are checked with the kind's defaults filled in
      when the :class:`Policy` is built, once: the stage's breaker is built from that config
      (:meth:`config`).
    """

    kind: BreakerKind = "generic"
    failure_rate_threshold: float | None = None
    slow_call_rate_threshold: float | None = None
    slow_call_duration_s: float | None = None
    consecutive_failures_threshold: int | None = None
    rejection_rate_threshold: float | None = None
    minimum_calls: int | None = None
    window_type: Literal["count", "time"] | None = None
    window_size: int | None = None
    half_open_permits: int | None = None
    open_for_s: float | None = None
    open_backoff_multiplier: float | None = None
    open_max_s: float | None = None
    open_jitter: float | None = None
    _config: tuple[int, BreakerConfig | None] | None = PrivateAttr(default=None)

    @field_validator(*OPTIONS)
    @classmethod
    def _in_range(cls, value: Any, info: Any) -> Any:
        return None if value is None else check_option(info.field_name, value)

    def __eq__(self, other: object) -> bool:  # the config built from it is no part of it
        if not isinstance(other, BreakerPolicy):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash((type(self), *self.__dict__.values()))

    def options(self) -> dict[str, Any]:
        """The options that were set, as keyword arguments for the breaker's constructor."""
        return {k: v for k, v in self.model_dump(exclude={"kind"}).items() if v is not None}

    def config(self) -> BreakerConfig | None:
        """The options the stage's breaker gets (the kind's defaults, then the options set),
        validated by the breaker's own rules, once: the breaker is built from this very object
        (``CircuitBreaker(name, config=...)``). None for kind ``none``. Raises ConfigError whose
        ``field`` names the option."""
        made = self._config
        if made is not None and made[0] == id(self):  # a model_copy carries a stale one
            return made[1]
        config = None if self.kind == "none" else self._validated()
        self._config = (id(self), config)
        return config

    def _validated(self) -> BreakerConfig:
        options = self.options()
        try:
            return BreakerConfig.of(**{**BREAKER_KINDS[self.kind].defaults, **options})
        except ConfigError as exc:
            if exc.field is None or exc.field in options:
                raise
            # the value refused is a default the user never wrote: say so
            raise ConfigError(f"{exc} (the {self.kind} breaker's default)", field=exc.field) from None


BREAKER_KINDS: dict[str, type[CircuitBreaker]] = {
    "embedding_timeout": EmbeddingTimeoutBreaker,
    "vector_store_unavailable": VectorStoreUnavailableBreaker,
    "rerank_oom": RerankOOMBreaker,
    "generic": CircuitBreaker,
}
