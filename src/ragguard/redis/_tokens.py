"""Each tenant's token quotas and pacing shared by many replicas through Redis (or Redis Cluster).

The buckets are those of :mod:`ragguard.quotas._tokens` (GCRA over tokens: pacing of output tokens,
the quotas of input + output, input and output tokens per window, the tenant's and each listed
model's), with their ``tat`` in Redis, one key per bucket under the tenant's hash tag, so every
script runs on the one node that owns the tenant::

    {<prefix>:tokens:<tenant>}:q:total | :q:input | :q:output | :pace     the tenant's buckets
    {<prefix>:tokens:<tenant>}m:<model>:q:total | ... | m:<model>:pace    a listed model's
    {<prefix>:tokens:<tenant>}:res                                        open reservations

- **Reserve** (one EVALSHA when a stream opens): every quota bucket of the stream takes its share
  of the estimates, all of them or none, atomically, on the Redis server's clock: refused when the
  longest wait is longer than the tenant may wait (``max_wait_s``, cut to the deadline left), as
  in one process. The reservation's id is recorded in ``:res``.
- **Settle** (one EVALSHA when the stream ends, sent in the background): each bucket is charged the
  tokens really used minus those reserved, once: the script applies it only if it removes the id
  from ``:res``, so a settlement sent twice (a lost reply, a retry after an outage) counts once. A
  settlement that cannot be sent waits in memory (at most ``max_unsettled``) and is sent when the
  link is back; a reservation whose replica died is never refunded (its estimate stays charged: the
  error is on the safe side).
- **Pacing** (shared ``tat``, one EVALSHA per block): a stream's items take their tokens from a
  block this replica took from the tenant's pacing buckets, and an item the block cannot cover
  takes the next block, waiting what the buckets say (``block_s`` of the rate per block, at least
  the item's tokens, at most the burst); the block's other tokens go no sooner. An item is never
  handed over before its tokens were taken in Redis and their wait is over, so the replicas
  together never hand over more than the rate allows, give or take the block each replica may
  hold; a block's unused rest stays with its replica.

When Redis is slow, down, coming back or refusing credentials the ledger follows the rules of the
shared request quotas (:class:`~ragguard.redis.RedisLink`, ``docs/distributed.md``): after
two failed commands in a row (at once for a refused password, ACL permission or TLS certificate)
it decides on the replica's own :class:`~ragguard.rag.TokenAccounts` (each replica then allows a
tenant's whole token limits), logs once, emits ``SharedStateDegraded("tokens")``, and goes back to
Redis when its health probe passes (the scripts load and the ACL user may run every command they
run); no stream fails because of it. ``start(strict=True)`` raises ConfigError for a refused
configuration instead.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import random
from collections import deque
from typing import TYPE_CHECKING, Any

from .._clock import Clock, monotonic
from .._deadline import remaining
from .._errors import ConfigError, QuotaExceeded
from ..quotas._tokens import NOTHING, Reservation, TokenAccount, TokenAccounts, due, refuse_or_wait, shares
from ._breaker import encode_key_part
from ._link import Probe, RedisLink, Script, SharedStateUnavailable
from ._scripts import GCRA, NOW

if TYPE_CHECKING:
    pass

__all__ = ["RedisTokens", "token_key"]

log = logging.getLogger("ragguard.distributed")

_MAX_BLOCKS = 10_000
"""Pacing blocks kept at most (per tenant and model); past it the empty ones are forgotten."""

_NOW = NOW + GCRA + """
local function keep(key, tat)  -- a bucket whose tat is past is full: its key may go
  local ms = math.ceil((tat - now) * 1000)
  if ms > 0 then
    redis.call('SET', key, string.format('%.6f', tat), 'PX', ms + 1000)
  else
    redis.call('DEL', key)
  end
end
local function tat_of(key)  -- false when the key is gone: a full bucket
  return tonumber(redis.call('GET', key) or '') or false
end
"""

TOKENS_RESERVE = (
    _NOW
    + """
-- KEYS: the quota buckets, then the reservations hash.
-- ARGV: now|'', budget_s, id, reservations ttl ms, then (n, interval_s, tolerance_s) per bucket.
local budget = tonumber(ARGV[2])
local nb = #KEYS - 1
local tats, wait = {}, 0
for i = 1, nb do
  local base = 4 + 3 * (i - 1)
  local w
  tats[i], w = gcra(tat_of(KEYS[i]), now, tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]),
                    tonumber(ARGV[base + 3]))
  if w > wait then wait = w end
end
if wait > budget then return {0, string.format('%.6f', wait)} end
for i = 1, nb do keep(KEYS[i], tats[i]) end
redis.call('HSET', KEYS[#KEYS], ARGV[3], '1')
redis.call('PEXPIRE', KEYS[#KEYS], ARGV[4])
return {1, string.format('%.6f', wait)}
"""
)

TOKENS_SETTLE = (
    _NOW
    + """
-- KEYS: the quota buckets, then the reservations hash. ARGV: now|'', id, then (tokens given back:
-- reserved minus used, < 0 for a debt; interval_s) per bucket.
if redis.call('HDEL', KEYS[#KEYS], ARGV[2]) == 0 then return 0 end
for i = 1, #KEYS - 1 do
  local n = tonumber(ARGV[1 + 2 * i])
  if n ~= 0 then
    keep(KEYS[i], gcra_back(tat_of(KEYS[i]) or now, n, tonumber(ARGV[2 + 2 * i])))
  end
end
return 1
"""
)

TOKENS_PACE = (
    _NOW
    + """
-- KEYS: the pacing buckets. ARGV: now|'', then (n, interval_s, tolerance_s) per bucket. Never
-- refused.
local wait = 0
for i = 1, #KEYS do
  local base = 1 + 3 * (i - 1)
  local tat, w = gcra(tat_of(KEYS[i]), now, tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]),
                      tonumber(ARGV[base + 3]))
  keep(KEYS[i], tat)
  if w > wait then wait = w end
end
return string.format('%.6f', wait)
"""
)


def token_key(tenant: str, bucket: str, key_prefix: str = "ragguard") -> str:
    """The Redis key of ``tenant``'s bucket ``bucket`` (``:q:total``, ``:pace``,
    ``m:<model>:q:input``...; see the module docstring)."""
    return f"{{{key_prefix}:tokens:{tenant}}}{encode_key_part(bucket)}"


class _Block:
    """Pacing tokens this replica took from an account's shared buckets and has not handed over,
    and when they may be (``ready_at``, the local clock: the wait the buckets gave the block)."""

    __slots__ = ("left", "lock", "ready_at")

    def __init__(self) -> None:
        self.left = 0
        self.ready_at = 0.0
        self.lock = asyncio.Lock()  # one take in flight per account: a replica holds one block


class RedisTokens(TokenAccounts):
    """A Guard's token accounts shared through Redis (see the module docstring).

    ``local`` is the replica's own :class:`~ragguard.rag.TokenAccounts`: the accounts' limits and
    counts (``reserved``, ``settled``, ``open_streams`` are this replica's), and the decisions while
    Redis cannot answer. ``redis`` is a ``redis.asyncio.Redis`` or ``RedisCluster`` client.

    Options (keyword-only): ``key_prefix`` (``"ragguard"``); ``redis_timeout_s`` (0.25),
    ``probe_every_s`` (1.0), ``max_in_flight``: see :class:`RedisLink`; ``clock``: seconds shared
    by every replica (default None: the Redis server's TIME; tests pass a ``FakeClock``);
    ``block_s`` (0.05): each pacing block holds this many seconds of the tightest pacing rate
    (at least 1 token, at most its burst); ``reservation_ttl_s`` (3600): how long the open
    reservations of a tenant are kept after its last reservation (a stream open longer settles
    nothing back: its estimate stays charged); ``max_unsettled`` (10,000): settlements kept while
    Redis is away (past it the oldest are dropped, their estimates charged). Raises ConfigError for
    an out-of-range option.
    """

    shared = True

    def __init__(
        self,
        local: TokenAccounts,
        redis: Any,
        *,
        key_prefix: str = "ragguard",
        redis_timeout_s: float = 0.25,
        probe_every_s: float = 1.0,
        max_in_flight: int | None = None,
        clock: Clock | None = None,
        block_s: float = 0.05,
        reservation_ttl_s: float = 3600.0,
        max_unsettled: int = 10_000,
        holder_id: str | None = None,
        link_clock: Clock = monotonic,
    ) -> None:
        if not isinstance(local, TokenAccounts) or isinstance(local, RedisTokens):
            raise ConfigError(f"local must be a ragguard.rag.TokenAccounts, got {type(local).__name__}")
        if not isinstance(key_prefix, str) or not key_prefix or "{" in key_prefix or "}" in key_prefix:
            raise ConfigError(f"key_prefix must be a non-empty str without braces, got {key_prefix!r}")
        if clock is not None and not callable(clock):
            raise ConfigError(f"clock must be None or a callable returning seconds, got {clock!r}")
        for name, value, top in (
            ("block_s", block_s, 60.0),
            ("reservation_ttl_s", reservation_ttl_s, 31 * 86400),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= top:
                raise ConfigError(f"{name} must be seconds in (0, {top:g}], got {value!r:.40}")
        if (
            isinstance(max_unsettled, bool)
            or not isinstance(max_unsettled, int)
            or not 1 <= max_unsettled <= 10**7
        ):
            raise ConfigError(f"max_unsettled must be an int in [1, 10000000], got {max_unsettled!r:.40}")
        self.local = local
        self.clock = local.clock
        self.sleep = local.sleep
        self._prefix = key_prefix
        self._shared_clock = clock
        self._block_s = float(block_s)
        self._res_ttl_ms = int(reservation_ttl_s * 1000)
        self._holder = holder_id or f"{os.getpid()}-{random.getrandbits(32):08x}"
        self._ids = itertools.count(1)
        probe = Probe(
            redis, f"{{{key_prefix}:tokens:*probe}}:q:total", (TOKENS_RESERVE, TOKENS_SETTLE, TOKENS_PACE)
        )
        self.link = RedisLink(
            redis,
            "tokens",
            probe=probe,
            timeout_s=redis_timeout_s,
            probe_every_s=probe_every_s,
            max_in_flight=max_in_flight,
            clock=link_clock,
        )
        self.link.on_restored.append(self._send_unsettled)
        self._redis = redis
        self._scripts: dict[tuple[str, int], Script] = {}
        self._blocks: dict[tuple[str, str | None], _Block] = {}
        self._unsettled: deque[tuple[list[str], list[Any]]] = deque(maxlen=max_unsettled)
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- inspection: this replica's counts ----------------------------------------------------

    def reserved(self, tenant: str) -> int:
        return self.local.reserved(tenant)

    def settled(self, tenant: str) -> int:
        return self.local.settled(tenant)

    def open_streams(self, tenant: str) -> int:
        return self.local.open_streams(tenant)

    def total_reserved(self) -> int:
        return self.local.total_reserved()

    def bucket_tat(self, tenant: str, key: str) -> float | None:
        return self.local.bucket_tat(tenant, key)

    @property
    def unsettled(self) -> int:
        """Settlements waiting for Redis to answer again."""
        return len(self._unsettled)

    # -- streams ----------------------------------------------------------------------------

    def open(self, tenant: str, model: str | None = None) -> TokenAccount | None:
        return self.local.open(tenant, model)

    def close(self, account: TokenAccount) -> None:
        self.local.close(account)

    def _script(self, source: str, numkeys: int) -> Script:
        """``source`` bound to ``numkeys`` keys (a stream's buckets: one to eight)."""
        script = self._scripts.get((source, numkeys))
        if script is None:
            script = self._scripts[(source, numkeys)] = Script(self._redis, source, numkeys)
        return script

    def _now(self) -> str:
        clock = self._shared_clock
        return "" if clock is None else repr(float(clock()))

    def _keys(self, account: TokenAccount, buckets: Any) -> list[str]:
        return [token_key(account.tenant, b.key, self._prefix) for b in buckets]

    def reserve(
        self, account: TokenAccount, estimate: int, input_tokens: int = 0
    ) -> tuple[Reservation, float]:
        """The local decision (what :meth:`reserve_async` falls back to)."""
        return self.local.reserve(account, estimate, input_tokens)

    async def reserve_async(
        self, account: TokenAccount, estimate: int, input_tokens: int = 0
    ) -> tuple[Reservation, float]:
        """Reserve in Redis (see :meth:`TokenAccounts.reserve`); locally while Redis cannot answer."""
        if not account.quotas:
            return NOTHING, 0.0
        if self.link.degraded:
            return self.local.reserve(account, estimate, input_tokens)
        quota = account.state.quota
        taken = shares(account, input_tokens, estimate)
        budget = quota.max_wait_s
        left = remaining()
        if left is not None and left < budget:
            budget = max(left, 0.0)
        ref = f"{self._holder}:{next(self._ids)}"
        keys = [
            *self._keys(account, (b for _, b in account.quotas)),
            token_key(account.tenant, ":res", self._prefix),
        ]
        args: list[Any] = [self._now(), repr(budget), ref, self._res_ttl_ms]
        for (_, bucket), n in zip(account.quotas, taken, strict=True):
            args += [n, repr(bucket.rate.interval_s), repr(bucket.rate.tolerance_s)]
        try:
            ok, wait_text = await self.link.call(self._script(TOKENS_RESERVE, len(keys)), *keys, *args)
        except SharedStateUnavailable:
            return self.local.reserve(account, estimate, input_tokens)
        except BaseException:  # cancelled: the script may have run; give it back if it did
            self._send(keys, [self._now(), ref, *_deltas(account, taken, (0, 0, 0))])
            raise
        wait = float(wait_text)
        if not int(ok):
            refuse_or_wait(account.tenant, wait, quota)  # raises, naming the reason
            raise QuotaExceeded(account.tenant, wait, "tokens")  # the deadline moved meanwhile
        reservation = Reservation.of(account, taken, input_tokens, estimate, ref=(ref, keys))
        account.state.reserved += reservation.total
        return reservation, due(wait)

    def settle(
        self, account: TokenAccount, reservation: Reservation, used: int, input_used: int | None = None
    ) -> None:
        """Charge the real count (see :meth:`TokenAccounts.settle`): in Redis for a reservation
        made there (sent in the background, once), locally for one made locally."""
        if reservation.ref is None:
            self.local.settle(account, reservation, used, input_used)
            return
        ref, keys = reservation.ref
        spent = reservation.spent(used, input_used)
        self._send(keys, [self._now(), ref, *_deltas(account, reservation.taken, spent)])
        state = account.state
        state.reserved -= reservation.total
        state.settled += spent[0]

    def _send(self, keys: list[str], args: list[Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._settle_one(keys, args))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle_one(self, keys: list[str], args: list[Any]) -> None:
        try:
            await self.link.call(self._script(TOKENS_SETTLE, len(keys)), *keys, *args)
        except SharedStateUnavailable:
            self._unsettled.append((keys, args))  # idempotent: sent again when Redis answers

    def _send_unsettled(self) -> None:
        while self._unsettled:
            keys, args = self._unsettled.popleft()
            self._send(keys, args)

    def pace(self, account: TokenAccount, tokens: int) -> Any:
        """The seconds to wait before handing ``tokens`` over (a float), or an awaitable of them
        when the block is spent and the next must come from Redis."""
        if tokens <= 0 or not account.paces:
            return 0.0
        if self.link.degraded:
            return self.local.pace(account, tokens)
        key = (account.tenant, account.model)
        block = self._blocks.get(key)
        if block is None:
            if len(self._blocks) >= _MAX_BLOCKS:
                self._forget_blocks()
            block = self._blocks[key] = _Block()
        if block.left >= tokens and not block.lock.locked():
            return self._from_block(block, tokens)
        return self._take(account, block, tokens)

    def _from_block(self, block: _Block, tokens: int) -> float:
        block.left -= tokens
        return due(block.ready_at - self.clock())

    async def _take(self, account: TokenAccount, block: _Block, tokens: int) -> float:
        async with block.lock:
            if block.left >= tokens:  # the take this one waited for covers it
                return self._from_block(block, tokens)
            need = tokens - block.left
            size = max(need, self._block_size(account))
            args: list[Any] = [self._now()]
            for bucket in account.paces:
                args += [size, repr(bucket.rate.interval_s), repr(bucket.rate.tolerance_s)]
            keys = self._keys(account, account.paces)
            try:
                wait = float(await self.link.call(self._script(TOKENS_PACE, len(keys)), *keys, *args))
            except SharedStateUnavailable:
                return self.local.pace(account, tokens)
            block.left = size - need
            ready = self.clock() + wait
            if ready > block.ready_at:  # the block's rest goes no sooner than this item
                block.ready_at = ready
            return due(wait)

    def _forget_blocks(self) -> None:
        for key in [k for k, b in self._blocks.items() if not b.left and not b.lock.locked()]:
            del self._blocks[key]

    def _block_size(self, account: TokenAccount) -> int:
        rates = [b.rate for b in account.paces]
        return max(1, min(min(r.burst, math.ceil(self._block_s / r.interval_s)) for r in rates))

    def unpace(self, account: TokenAccount, tokens: int) -> None:
        """Tokens taken and never handed over (the wait was cancelled) go back to the block."""
        if self.link.degraded:
            self.local.unpace(account, tokens)
            return
        block = self._blocks.get((account.tenant, account.model))
        if block is not None:
            block.left += tokens

    async def start(self, *, strict: bool = False) -> RedisTokens:
        """Check Redis now with the health probe (the scripts load, the ACL user may run every
        command they run on the token keys); returns self. Unreachable: the accounts start local
        and keep probing; a refused configuration (password, ACL, TLS): logged at ERROR, then the
        same, or with ``strict=True`` :class:`~ragguard.ConfigError` naming the cause."""
        await self.link.start(strict=strict)
        return self

    async def aclose(self) -> None:
        """Send the settlements under way (waiting at most a second), then stop the link's probe."""
        tasks = list(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        await self.link.aclose()


def _deltas(account: TokenAccount, taken: tuple[int, ...], spent: tuple[int, int, int]) -> list[Any]:
    """Per quota bucket: (tokens it reserved minus those used of its kind, given back; its interval)."""
    out: list[Any] = []
    for (kind, bucket), n in zip(account.quotas, taken, strict=True):
        out += [n - spent[kind], repr(bucket.rate.interval_s)]
    return out
