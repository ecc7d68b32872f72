"""How a Guard built with ``redis=`` shares its state: the quotas, every stage's breaker and the
generation stages' token accounts, each wrapping the process-local object it falls back to.

:class:`RedisWiring` holds the client, the key prefix and ``redis_options`` (validated here, once);
the Guard asks it for its quotas, and the layers reach it through their build context
(:meth:`ragguard.pipeline.BuildContext.share`), which also closes what it made.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from .._clock import Clock, monotonic
from .._errors import ConfigError
from ..options import Policy
from ..quotas import LocalQuotas
from ._breaker import SharedCircuitBreaker
from ._quotas import RedisQuotas
from ._tokens import RedisTokens

__all__ = ["RedisWiring", "redis_options_of"]

T = TypeVar("T")

_PARTS = ("quotas", "breakers", "tokens")


def redis_options_of(options: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """``Guard(redis_options=...)`` checked: ``{"quotas" | "breakers" | "tokens": {keyword: value}}``;
    ConfigError otherwise."""
    given = dict(options or {})
    if set(given) - set(_PARTS) or not all(isinstance(v, Mapping) for v in given.values()):
        raise ConfigError(
            "redis_options must map 'quotas', 'breakers' and/or 'tokens' to keyword options, "
            f"got {sorted(map(str, given))!r:.80}"
        )
    return {k: dict(v) for k, v in given.items()}


class RedisWiring:
    """The shared-state side of one Guard: ``client`` (a ``redis.asyncio`` client), keys under
    ``prefix``, ``options`` per part (:func:`redis_options_of`).

    Replicas share open-until times and buckets: in production they are computed on the Redis
    server's clock (no replica's wall clock matters); a Guard given its own clock (a FakeClock in
    tests) drives its shared state with it, the replica's countdowns and the link's outage timing too.
    """

    __slots__ = ("client", "clock", "options", "prefix", "rng")

    def __init__(
        self,
        client: Any,
        prefix: str,
        options: dict[str, dict[str, Any]],
        *,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        if not callable(getattr(client, "evalsha", None)):
            raise ConfigError(f"redis must be a redis.asyncio client, got {type(client).__name__}")
        self.client = client
        self.prefix = prefix
        self.options = options
        self.clock = clock
        self.rng = rng

    def _server_clock(self) -> Clock | None:
        return None if self.clock is monotonic else self.clock  # None: Redis server time

    def quotas(self, policy: Policy, sleep: Callable[[float], Awaitable[Any]]) -> RedisQuotas:
        """The tenant quotas, falling back to in-memory ones while Redis is unreachable."""
        options = {
            "clock": self._server_clock(),
            "link_clock": self.clock,
            "rng": self.rng,
            "fallback": LocalQuotas(policy.quota, clock=self.clock, sleep=sleep),
            **self.options.get("quotas", {}),
        }
        return _made(RedisQuotas, "quotas", policy.quota, self.client, key_prefix=self.prefix, **options)

    def breaker(self, local: Any) -> SharedCircuitBreaker:
        """A stage's breaker ``local`` shared across replicas."""
        options = {
            "clock": self._server_clock(),
            "local_clock": self.clock,
            "link_clock": self.clock,
            **self.options.get("breakers", {}),
        }
        return _made(SharedCircuitBreaker, "breakers", local, self.client, key_prefix=self.prefix, **options)

    def tokens(self, local: Any) -> RedisTokens:
        """The generation stages' token accounts ``local`` shared across replicas."""
        options = {"clock": self._server_clock(), "link_clock": self.clock, **self.options.get("tokens", {})}
        return _made(RedisTokens, "tokens", local, self.client, key_prefix=self.prefix, **options)


def _made(cls: Callable[..., T], part: str, *args: Any, **options: Any) -> T:
    try:
        return cls(*args, **options)
    except TypeError as exc:  # an option the class does not take
        raise ConfigError(f"redis_options[{part!r}]: {exc}") from None
