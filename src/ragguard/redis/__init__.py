"""Breaker state, tenant quotas and token accounts shared by many replicas through Redis (or Redis
Cluster): the wing a Guard is handed as its backend.

::

    client = redis.asyncio.Redis.from_url(url, socket_timeout=0.5, retry=None)
    guard = ragguard.Guard(policy, backend=RedisBackend(client))   # all of it shared

The parts can be built one by one too::

    breaker = SharedCircuitBreaker(VectorStoreUnavailableBreaker(), client)
    guard = ragguard.Guard(policy, quotas=RedisQuotas(policy.quota, client))
    guard.stage("search", breaker=breaker)

When Redis is slow or down, each component falls back to its local state within a bounded time
(starting from the last shared state it read), logs once, emits :class:`SharedStateDegraded` on
``ragguard.events.bus``, and returns to Redis (emitting :class:`SharedStateRestored`) when it
answers again. See ``docs/distributed.md`` for the failure model and its measured times.
"""

from ._backend import RedisBackend
from ._borrow import LocalLease
from ._breaker import SharedCircuitBreaker
from ._events import SharedStateDegraded, SharedStateRestored
from ._quotas import RedisQuotas
from ._tokens import RedisTokens

__all__ = [
    "LocalLease",
    "RedisBackend",
    "RedisQuotas",
    "RedisTokens",
    "SharedCircuitBreaker",
    "SharedStateDegraded",
    "SharedStateRestored",
]
