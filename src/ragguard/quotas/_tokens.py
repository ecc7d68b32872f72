"""Each tenant's tokens: pacing (a flow of output tokens per second) and token quotas.

Every limit is a bucket of the Generic Cell Rate Algorithm that :mod:`ragguard.quotas` uses for
request rates (:mod:`ragguard.quotas._gcra`: one number per bucket, the theoretical arrival time
``tat``), with a cost of ``n`` tokens where a request costs one: the step of ``n`` tokens gives
``tat'`` (then kept) and the ``wait`` before they fit (0 or less: now).

- pacing (``tokens_per_s``, ``token_burst``): every item a stream hands over takes the step with
  its output tokens, and the stream waits ``wait`` seconds (on the Guard's sleep) before handing it
  over: never refused. The tenant's streams share one ``tat``, so together they keep to the rate.
- the quotas, per ``token_window_s`` (rate ``quota / window``, burst ``quota``): ``token_quota``
  (input + output tokens), ``input_token_quota``, ``output_token_quota``. A stream reserves its
  estimates (input ``i``, output ``o``) before it opens: each quota bucket takes the step with
  its share (``i + o``, ``i``, ``o``), all of them or none: refused with QuotaExceeded when the
  longest wait would be longer than the tenant's ``max_wait_s`` or the deadline left, else waited
  for. When it ends, however it ends, it settles each bucket with the tokens really used (counted,
  or reported by the provider: ``tat += (used - reserved) * interval``, a refund when less, a debt
  the tenant's next streams wait for when more), as token-aware gateways do.
- per model (``TenantQuota.models``): a stream of a listed model also takes that model's buckets
  (the same fields), after the tenant's own; a model not listed takes the tenant's only.

What is reserved and not yet settled is :meth:`TokenAccounts.reserved` (input + output). Time is
the Guard's clock; these accounts live in the process (one per Guard, shared by its generation
stages: :func:`ragguard.rag.token_accounts`). With ``Guard(backend=RedisBackend(...))`` the buckets
live in Redis (:class:`ragguard.redis.RedisTokens`), which falls back to these accounts while Redis
cannot answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .._clock import Clock
from .._deadline import remaining
from ..options import TenantQuota, TokenLimits
from ..options._policy import burst_of
from ._gcra import EPSILON_S, Rate
from ._refusal import refusal

__all__ = [
    "Bucket",
    "Reservation",
    "TokenAccount",
    "TokenAccounts",
    "quota_buckets",
]

KINDS = ("total", "input", "output")
"""What a quota bucket counts: input + output tokens, input tokens, output tokens."""


class Bucket:
    """One GCRA bucket: its ``rate`` (a :class:`~ragguard.quotas._gcra.Rate`; ``rate.burst`` is
    the most tokens one step may take) and its ``tat`` (clock seconds)."""

    __slots__ = ("key", "rate", "tat")

    def __init__(self, key: str, rate: Rate, now: float) -> None:
        self.key = key
        self.rate = rate
        self.tat = now

    def step(self, n: int, now: float) -> tuple[float, float]:
        """``(tat', wait)`` for ``n`` tokens now (see :mod:`ragguard.quotas._gcra`); nothing changes."""
        return self.rate.step(self.tat, now, n)


def _pace_bucket(key: str, limits: TokenLimits, now: float) -> Bucket | None:
    per_s = limits.tokens_per_s
    if per_s is None:
        return None
    return Bucket(key, Rate(per_s, burst_of(per_s, limits.token_burst)), now)


def quota_buckets(prefix: str, limits: TokenLimits, now: float) -> list[tuple[int, Bucket]]:
    """The quota buckets ``limits`` sets, as ``(kind index in KINDS, bucket)``; keys
    ``<prefix>total`` / ``input`` / ``output``."""
    found: list[tuple[int, Bucket]] = []
    window = limits.token_window_s
    for kind, limit in enumerate((limits.token_quota, limits.input_token_quota, limits.output_token_quota)):
        if limit is not None:
            found.append((kind, Bucket(prefix + KINDS[kind], Rate(limit / window, limit), now)))
    return found


class TokenAccount:
    """What one stream of ``tenant`` (of ``model``, when the tenant's policy lists it) takes:
    its pacing buckets (the tenant's, the model's) and its quota buckets, with the kind each
    counts. Shared by the streams of one tenant and model."""

    __slots__ = ("model", "paces", "quotas", "state", "tenant")

    def __init__(self, state: _TenantTokens, model: str | None) -> None:
        self.state = state
        self.tenant = state.tenant
        self.model = model
        self.paces: tuple[Bucket, ...] = ()
        self.quotas: tuple[tuple[int, Bucket], ...] = ()
        self.adopt()

    def adopt(self) -> None:
        buckets = self.state.buckets
        prefixes = [""] if self.model is None else ["", f"m:{self.model}"]
        paces = (buckets.get(f"{p}:pace") for p in prefixes)
        self.paces = tuple(b for b in paces if b is not None)
        quotas = ((kind, buckets.get(f"{p}:q:{name}")) for p in prefixes for kind, name in enumerate(KINDS))
        self.quotas = tuple((kind, b) for kind, b in quotas if b is not None)

    @property
    def paces_items(self) -> bool:
        return bool(self.paces)

    @property
    def interval_s(self) -> float:
        """Seconds per output token of the tightest pacing (0.0: not paced)."""
        return max((b.rate.interval_s for b in self.paces), default=0.0)

    @property
    def limits(self) -> bool:
        return bool(self.quotas)


class _TenantTokens:
    """One tenant's buckets (by key), its accounts by model, and its counts."""

    __slots__ = ("accounts", "buckets", "quota", "reserved", "settled", "streams", "tenant")

    def __init__(self, tenant: str, quota: TenantQuota, now: float) -> None:
        self.tenant = tenant
        self.quota = quota
        self.buckets: dict[str, Bucket] = {}
        self.accounts: dict[str | None, TokenAccount] = {}
        self.reserved = 0
        self.settled = 0
        self.streams = 0
        self.adopt(quota, now)

    def adopt(self, quota: TenantQuota, now: float) -> None:
        """Take ``quota``'s limits; a bucket whose key stays keeps its ``tat``."""
        old = self.buckets
        fresh: dict[str, Bucket] = {}
        sources: list[tuple[str, TokenLimits]] = [("", quota)]
        sources += [(f"m:{name}", limits) for name, limits in quota.models.items()]
        for prefix, limits in sources:
            pace = _pace_bucket(f"{prefix}:pace", limits, now)
            found = [] if pace is None else [pace]
            found += [b for _, b in quota_buckets(f"{prefix}:q:", limits, now)]
            for bucket in found:
                before = old.get(bucket.key)
                if before is not None:
                    bucket.tat = before.tat
                fresh[bucket.key] = bucket
        self.quota = quota
        self.buckets = fresh
        for account in self.accounts.values():
            account.adopt()

    def account(self, model: str | None) -> TokenAccount:
        key = model if model is not None and model in self.quota.models else None
        account = self.accounts.get(key)
        if account is None:
            account = self.accounts[key] = TokenAccount(self, key)
        return account

    def idle(self, now: float) -> bool:
        return not self.streams and not self.reserved and all(b.tat <= now for b in self.buckets.values())


class Reservation:
    """What one stream reserved: per quota bucket of its account, the tokens taken (``taken``,
    aligned with ``account.quotas``), the input and output estimates, and ``total`` (input +
    output, at most what the buckets hold). ``ref``: the shared ledger's id for it, if any."""

    __slots__ = ("input", "output", "ref", "taken", "total")

    def __init__(self, taken: tuple[int, ...], input: int, output: int, total: int, ref: Any = None) -> None:
        self.taken = taken
        self.input = input
        self.output = output
        self.total = total
        self.ref = ref

    @classmethod
    def of(
        cls, account: TokenAccount, taken: tuple[int, ...], input_n: int, output_n: int, ref: Any = None
    ) -> Reservation:
        """The reservation of ``taken`` (per quota bucket of ``account``) for ``input_n`` input and
        ``output_n`` output tokens: its total, each kind at most what its buckets let it take."""
        caps = [input_n + output_n, input_n, output_n]
        for (kind, _), n in zip(account.quotas, taken, strict=True):
            caps[kind] = min(caps[kind], n)
        return cls(taken, input_n, output_n, min(caps[0], caps[1] + caps[2]), ref)

    def spent(self, used: int, input_used: int | None) -> tuple[int, int, int]:
        """The tokens a stream that reserved this used, by kind (total, input, output): ``used``
        output tokens and ``input_used`` input tokens (None: the input estimate)."""
        inp = self.input if input_used is None else input_used
        return inp + used, inp, used


def due(wait_s: float) -> float:
    """``wait_s``, or 0.0 when it is a nanosecond or less (float noise of a bucket already due)."""
    return wait_s if wait_s > EPSILON_S else 0.0


NOTHING = Reservation((), 0, 0, 0)
"""The reservation of a stream whose account has no quota."""


def shares(account: TokenAccount, input_n: int, output_n: int) -> tuple[int, ...]:
    """Each quota bucket's share of an estimate (``input_n + output_n``, ``input_n``, ``output_n``
    by kind), at most the bucket's limit (a stream may reserve at most a whole bucket)."""
    wanted = (input_n + output_n, input_n, output_n)
    return tuple(min(wanted[kind], bucket.rate.burst) for kind, bucket in account.quotas)


def refuse_or_wait(tenant: str, wait: float, quota: TenantQuota) -> float:
    """``wait`` when the tenant may wait that long (``max_wait_s``, cut to the deadline left),
    0.0 when it needs none; else raise QuotaExceeded (reason ``tokens``, or ``deadline``)."""
    if wait <= EPSILON_S:
        return 0.0
    budget = quota.max_wait_s
    left = remaining()
    by_deadline = left is not None and left < budget
    if by_deadline:
        budget = left  # type: ignore[assignment]
    if wait > budget:
        raise refusal(tenant, wait, "deadline" if by_deadline else "tokens")
    return wait


class TokenAccounts:
    """The token accounts of one Guard's tenants (see the module docstring).

    ``quota_for(tenant)`` gives each tenant's :class:`~ragguard.TenantQuota` (read when a stream
    opens); ``clock`` returns monotonic seconds; ``sleep`` waits seconds on that clock. Tenants
    with nothing open and nothing owed are forgotten once more than ``max_tenants`` are kept, so
    a flood of tenant ids cannot grow memory without bound.

    The stream's side (:class:`ragguard.rag._generation.TokenMeter` calls it): :meth:`open`, then
    :meth:`reserve` (``shared`` ledgers: ``await reserve_async``), :meth:`pace` per item,
    :meth:`settle` and :meth:`close` when the stream ends.
    """

    shared = False
    """Whether reservations need ``await reserve_async`` (a ledger in Redis)."""

    def __init__(
        self,
        quota_for: Callable[[str], TenantQuota],
        *,
        clock: Clock,
        sleep: Callable[[float], Awaitable[Any]],
        max_tenants: int = 10_000,
    ) -> None:
        self._quota_for = quota_for
        self.clock = clock
        self.sleep = sleep
        self._max_tenants = max_tenants
        self._tenants: dict[str, _TenantTokens] = {}

    # -- inspection -------------------------------------------------------------------------

    def reserved(self, tenant: str) -> int:
        """Tokens (input + output) ``tenant``'s open streams reserved and have not settled yet."""
        state = self._tenants.get(tenant)
        return 0 if state is None else state.reserved

    def settled(self, tenant: str) -> int:
        """Tokens (input + output) ``tenant``'s ended streams used and settled, in all."""
        state = self._tenants.get(tenant)
        return 0 if state is None else state.settled

    def open_streams(self, tenant: str) -> int:
        """Streams of ``tenant`` holding an account now (opened and not yet ended)."""
        state = self._tenants.get(tenant)
        return 0 if state is None else state.streams

    def total_reserved(self) -> int:
        """Tokens reserved and not yet settled, over every tenant."""
        return sum(s.reserved for s in self._tenants.values())

    def bucket_tat(self, tenant: str, key: str) -> float | None:
        """The ``tat`` of ``tenant``'s bucket ``key`` (``:pace``, ``:q:total``, ``m:<model>:q:input``...),
        None when it has none (for tests and dashboards)."""
        state = self._tenants.get(tenant)
        bucket = None if state is None else state.buckets.get(key)
        return None if bucket is None else bucket.tat

    # -- streams ----------------------------------------------------------------------------

    def open(self, tenant: str, model: str | None = None) -> TokenAccount | None:
        """The account a new stream of ``tenant`` (of ``model``) uses, counted among its open
        streams until :meth:`close`, or None when the tenant has no token limits."""
        state = self._tenants.get(tenant)
        quota = self._quota_for(tenant)
        if state is None:
            if not quota.limits_tokens:
                return None
            if len(self._tenants) >= self._max_tenants:
                self._evict()
            state = self._tenants[tenant] = _TenantTokens(tenant, quota, self.clock())
        elif quota is not state.quota:
            state.adopt(quota, self.clock())
        account = state.account(model)
        state.streams += 1
        return account

    def close(self, account: TokenAccount) -> None:
        account.state.streams -= 1

    def reserve(
        self, account: TokenAccount, estimate: int, input_tokens: int = 0
    ) -> tuple[Reservation, float]:
        """Reserve ``input_tokens`` and ``estimate`` output tokens from ``account``'s quota
        buckets, all or none: ``(reservation, wait_s)``, the seconds to wait before the stream may
        open (0.0: now). Raises QuotaExceeded (reason ``tokens``, or ``deadline`` when the
        request's deadline is what the wait cannot fit) when the wait is longer than the tenant's
        ``max_wait_s`` or the deadline left; nothing is then reserved."""
        if not account.quotas:
            return NOTHING, 0.0
        taken = shares(account, input_tokens, estimate)
        now = self.clock()
        steps = [bucket.step(n, now) for (_, bucket), n in zip(account.quotas, taken, strict=True)]
        wait = refuse_or_wait(account.tenant, max(w for _, w in steps), account.state.quota)
        for (_, bucket), (tat, _) in zip(account.quotas, steps, strict=True):
            bucket.tat = tat
        reservation = Reservation.of(account, taken, input_tokens, estimate)
        account.state.reserved += reservation.total
        return reservation, wait

    async def reserve_async(
        self, account: TokenAccount, estimate: int, input_tokens: int = 0
    ) -> tuple[Reservation, float]:
        """:meth:`reserve`, awaitable (what a shared ledger does with a round trip)."""
        return self.reserve(account, estimate, input_tokens)

    def settle(
        self, account: TokenAccount, reservation: Reservation, used: int, input_used: int | None = None
    ) -> None:
        """End a stream that reserved ``reservation`` and used ``used`` output tokens and
        ``input_used`` input tokens (None: its input estimate): each quota bucket is charged the
        real count of its kind (the difference given back or owed), the reservation released."""
        spent = reservation.spent(used, input_used)
        for (kind, bucket), n in zip(account.quotas, reservation.taken, strict=False):
            bucket.tat = bucket.rate.give_back(bucket.tat, n - spent[kind])
        state = account.state
        state.reserved -= reservation.total
        state.settled += spent[0]

    def pace(self, account: TokenAccount, tokens: int) -> float:
        """Take ``tokens`` from ``account``'s pacing budgets: the seconds to wait before handing
        them over (0.0 when they fit now; the longest of the tenant's and the model's)."""
        if tokens <= 0 or not account.paces:
            return 0.0
        now = self.clock()
        wait = 0.0
        for bucket in account.paces:
            tat, w = bucket.step(tokens, now)
            bucket.tat = tat
            if w > wait:
                wait = w
        return due(wait)

    def unpace(self, account: TokenAccount, tokens: int) -> None:
        """Give back ``tokens`` paced and never handed over (the wait was cancelled)."""
        for bucket in account.paces:
            bucket.tat = bucket.rate.give_back(bucket.tat, tokens)

    def _evict(self) -> None:
        """Forget tenants with no open stream, nothing reserved and nothing owed, down to 90% of
        ``max_tenants`` (amortised O(1) per new tenant)."""
        now = self.clock()
        target = int(self._max_tenants * 0.9)
        for tenant in [t for t, s in self._tenants.items() if s.idle(now)]:
            if len(self._tenants) <= target:
                return
            del self._tenants[tenant]


