"""Breaker state and tenant quotas shared by many replicas through Redis.

::

    client = redis.asyncio.Redis.from_url(url, socket_timeout=0.5, retry=None)
    breaker = SharedCircuitBreaker(VectorStoreUnavailableBreaker(), client)
    guard = ragguard.Guard(policy, quotas=RedisQuotas(policy.quota, client))
    guard.stage("search", breaker=breaker)

When Redis is slow or down, each component falls back to its local state within a bounded time,
logs once, emits :class:`SharedStateDegraded` on ``ragguard.events.bus``, and returns to Redis
(emitting :class:`SharedStateRestored`) when it answers again. See ``docs/distributed.md``.
"""

from ._breaker import SharedCircuitBreaker, breaker_keys
from ._events import SharedStateDegraded, SharedStateRestored
from ._link import RedisLink
from ._quotas import RedisQuotas, SharedLease, quota_keys

__all__ = [
    "RedisLink",
    "RedisQuotas",
    "SharedCircuitBreaker",
    "SharedLease",
    "SharedStateDegraded",
    "SharedStateRestored",
    "breaker_keys",
    "quota_keys",
]
