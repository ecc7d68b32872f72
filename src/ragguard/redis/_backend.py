"""``Guard(backend=RedisBackend(client))``: a Guard's shared state in Redis: the tenant quotas, every
stage's breaker and the generation stages' token accounts, each wrapping the process-local object it
falls back to while Redis cannot answer.

:class:`RedisBackend` holds the client, the key prefix and each part's options (checked here, once);
the Guard asks it for its quotas, and the layers reach it through their build context
(:meth:`ragguard.pipeline.BuildContext.share`), which also closes what it made. It is a
:class:`ragguard.pipeline.Backend`.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from .._clock import Clock, monotonic
from .._errors import ConfigError
from .._validate import shown
from ..options import Policy
from ..quotas import LocalQuotas, TokenAccounts
from ._breaker import SharedCircuitBreaker
from ._quotas import RedisQuotas
from ._tokens import RedisTokens

__all__ = ["RedisBackend"]

T = TypeVar("T")

_PARTS: dict[str, type[Any]] = {
    "quotas": RedisQuotas, "breakers": SharedCircuitBreaker, "tokens": RedisTokens,
}  # fmt: skip


def _options_of(part: str, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """``given`` as the keyword options of ``part``'s class; ConfigError naming the part and the
    option when it is not a mapping of options that class takes."""
    if given is None:
        return {}
    cls = _PARTS[part]
    if not isinstance(given, Mapping) or not all(isinstance(k, str) for k in given):
        raise ConfigError(
            f"RedisBackend: {part} must map {cls.__name__}'s option names to values, got {shown(given)}",
            field=part,
        )
    taken = {
        name for name, p in inspect.signature(cls).parameters.items()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    }  # fmt: skip
    for name in given:
        if name not in taken:
            raise ConfigError(
                f"RedisBackend: {part}: {cls.__name__} takes no option {shown(name)} "
                f"(its options: {', '.join(sorted(taken))})",
                field=f"{part}.{name}",
            )
    return dict(given)


class RedisBackend:
    """Shared state in Redis or Redis Cluster for ``Guard(backend=...)``: tenant quotas become a
    :class:`RedisQuotas` and every breaker the policy builds a :class:`SharedCircuitBreaker`, under
    keys starting with ``prefix``; the generation stages' token accounts a :class:`RedisTokens`.

    - ``client``: a ``redis.asyncio`` client (``Redis`` or ``RedisCluster``) with short timeouts
      and no retries of its own (see docs/distributed.md); call ``await guard.aclose()`` at
      shutdown;
    - ``prefix``: the start of every key (default ``"ragguard"``);
    - ``quotas``, ``breakers``, ``tokens``: keyword options of those three classes
      (``lease_s``, ``local_lease``, ``redis_timeout_s``, ``staleness_s``...).

    Replicas share open-until times and buckets: in production they are computed on the Redis
    server's clock (no replica's wall clock matters); a Guard given its own clock (a FakeClock in
    tests) drives its shared state with it, the replica's countdowns and the link's outage timing
    too. Raises ConfigError naming the argument: a client that is not a ``redis.asyncio`` one,
    options that are not a mapping or name an option the class does not take.
    """

    __slots__ = ("client", "options", "prefix")

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = "ragguard",
        quotas: Mapping[str, Any] | None = None,
        breakers: Mapping[str, Any] | None = None,
        tokens: Mapping[str, Any] | None = None,
    ) -> None:
        if not callable(getattr(client, "evalsha", None)):
            raise ConfigError(
                f"RedisBackend: client must be a redis.asyncio client, got {type(client).__name__}",
                field="client",
            )
        self.client = client
        self.prefix = prefix
        self.options = {
            "quotas": _options_of("quotas", quotas),
            "breakers": _options_of("breakers", breakers),
            "tokens": _options_of("tokens", tokens),
        }

    def __repr__(self) -> str:
        return f"RedisBackend({type(self.client).__name__}, prefix={self.prefix!r})"

    @staticmethod
    def _server_clock(clock: Clock) -> Clock | None:
        return None if clock is monotonic else clock  # None: Redis server time

    def quotas(
        self,
        policy: Policy,
        *,
        clock: Clock,
        sleep: Callable[[float], Awaitable[Any]],
        rng: random.Random,
    ) -> RedisQuotas:
        """The tenant quotas, falling back to in-memory ones while Redis is unreachable."""
        options = {
            "clock": self._server_clock(clock),
            "link_clock": clock,
            "rng": rng,
            "fallback": LocalQuotas(policy.quota, clock=clock, sleep=sleep),
            **self.options["quotas"],
        }
        return _made(RedisQuotas, "quotas", policy.quota, self.client, key_prefix=self.prefix, **options)

    def breaker(self, local: Any, *, clock: Clock) -> SharedCircuitBreaker:
        """A stage's breaker ``local`` shared across replicas."""
        options = {
            "clock": self._server_clock(clock),
            "local_clock": clock,
            "link_clock": clock,
            **self.options["breakers"],
        }
        return _made(SharedCircuitBreaker, "breakers", local, self.client, key_prefix=self.prefix, **options)

    def tokens(self, local: TokenAccounts, *, clock: Clock) -> RedisTokens:
        """The generation stages' token accounts ``local`` shared across replicas."""
        options = {"clock": self._server_clock(clock), "link_clock": clock, **self.options["tokens"]}
        return _made(RedisTokens, "tokens", local, self.client, key_prefix=self.prefix, **options)


def _made(cls: Callable[..., T], part: str, *args: Any, **options: Any) -> T:
    try:
        return cls(*args, **options)
    except TypeError as exc:  # an option given twice, or of a form the class cannot take
        raise ConfigError(f"RedisBackend: {part}: {exc}", field=part) from None
