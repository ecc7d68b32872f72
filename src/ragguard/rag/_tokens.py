"""Each tenant's generated tokens: pacing (a flow of tokens per second) and a token quota.

Both are the Generic Cell Rate Algorithm that :mod:`ragguard.quotas` uses for request rates (one
number per tenant, the theoretical arrival time ``tat``), with a cost of ``n`` tokens where a
request costs one (ATM Forum TM 4.0; a token bucket of ``burst`` tokens refilled at ``rate``)::

    interval  = 1 / rate                      seconds per token
    tolerance = burst * interval
    tat'      = max(tat, now) + n * interval  the step; then tat = tat'
    wait      = tat' - now - tolerance        <= 0: the n tokens fit now; > 0: that many seconds

- pacing (``tokens_per_s``, ``token_burst``): every item a stream hands over takes the step, and
  the stream waits ``wait`` seconds (on the Guard's sleep) before handing it over: never refused.
  The tenant's streams share one ``tat``, so together they keep to the rate.
- the quota (``token_quota`` per ``token_window_s``: rate ``token_quota / token_window_s``, burst
  ``token_quota``): a stream reserves its estimate ``e`` before it opens (the same step with
  ``n = e``; refused with QuotaExceeded when the wait would be longer than the tenant's
  ``max_wait_s`` or the deadline left, else waited for), and when it ends, however it ends,
  settles with the tokens it really counted ``r``: ``tat += (r - e) * interval`` (a refund when
  ``r < e``, a debt the tenant's next streams wait for when ``r > e``), as token-aware gateways
  do. What is reserved and not yet settled is :meth:`TokenAccounts.reserved`.

Time is the Guard's clock; the accounts live in the process (one per Guard, shared by its
generation stages: :func:`token_accounts`), not in Redis.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .._clock import Clock
from .._errors import QuotaExceeded
from ..deadline import remaining
from ..events import QuotaRejected, bus
from ..policy import TenantQuota

if TYPE_CHECKING:
    from ..guard import Guard

__all__ = ["TokenAccount", "TokenAccounts", "count_tokens", "token_accounts"]

_EPSILON_S = 1e-9


def count_tokens(item: Any) -> int:
    """The default token count of a stream item: a ``str`` (or ``bytes``) item's length / 4,
    rounded, and at least 1 when it is not empty (the usual rule of thumb for English text and
    GPT-style tokenizers); 0 for an empty one; 1 for an item of any other type (give
    ``@guard(tokens=...)`` a counter for chunk objects)."""
    if isinstance(item, (str, bytes, bytearray)):
        n = len(item)
        return (n + 2) // 4 or (1 if n else 0)
    return 1


class TokenAccount:
    """One tenant's token state: the pacing and quota ``tat`` (clock seconds), what its open
    streams have reserved from the quota and not yet settled, and the tokens settled so far."""

    __slots__ = (
        "burst_s",
        "interval_s",
        "pace_tat",
        "quota",
        "quota_burst_s",
        "quota_interval_s",
        "quota_tat",
        "reserved",
        "settled",
        "streams",
        "tenant",
    )

    def __init__(self, tenant: str, quota: TenantQuota, now: float) -> None:
        self.tenant = tenant
        self.pace_tat = now
        self.quota_tat = now
        self.reserved = 0
        self.settled = 0
        self.streams = 0
        self.adopt(quota)

    def adopt(self, quota: TenantQuota) -> None:
        """Take ``quota``'s token limits (precomputed for the per-item step)."""
        self.quota = quota
        rate = quota.tokens_per_s
        self.interval_s = 0.0 if rate is None else 1.0 / rate
        burst = quota.token_burst if quota.token_burst is not None else max(1, math.ceil(rate or 1.0))
        self.burst_s = burst * self.interval_s
        limit = quota.token_quota
        self.quota_interval_s = 0.0 if limit is None else quota.token_window_s / limit
        self.quota_burst_s = 0.0 if limit is None else limit * self.quota_interval_s

    @property
    def paces(self) -> bool:
        return self.interval_s > 0.0

    @property
    def limits(self) -> bool:
        return self.quota_interval_s > 0.0


class TokenAccounts:
    """The token accounts of one Guard's tenants (see the module docstring).

    ``quota_for(tenant)`` gives each tenant's :class:`~ragguard.TenantQuota` (read when a stream
    opens); ``clock`` returns monotonic seconds; ``sleep`` waits seconds on that clock. Accounts of
    tenants with nothing open and nothing owed are forgotten once more than ``max_tenants`` are
    kept, so a flood of tenant ids cannot grow memory without bound.
    """

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
        self._accounts: dict[str, TokenAccount] = {}

    # -- inspection -------------------------------------------------------------------------

    def reserved(self, tenant: str) -> int:
        """Tokens ``tenant``'s open streams reserved from its quota and have not settled yet."""
        account = self._accounts.get(tenant)
        return 0 if account is None else account.reserved

    def settled(self, tenant: str) -> int:
        """Tokens ``tenant``'s ended streams counted and settled, in all (0 for an unknown tenant)."""
        account = self._accounts.get(tenant)
        return 0 if account is None else account.settled

    def open_streams(self, tenant: str) -> int:
        """Streams of ``tenant`` holding an account now (opened and not yet ended)."""
        account = self._accounts.get(tenant)
        return 0 if account is None else account.streams

    def total_reserved(self) -> int:
        """Tokens reserved and not yet settled, over every tenant."""
        return sum(a.reserved for a in self._accounts.values())

    # -- streams ----------------------------------------------------------------------------

    def open(self, tenant: str) -> TokenAccount | None:
        """The account a new stream of ``tenant`` uses (counted among its open streams until
        :meth:`close`), or None when the tenant has no token limits."""
        account = self._accounts.get(tenant)
        quota = self._quota_for(tenant)
        if account is None:
            if quota.tokens_per_s is None and quota.token_quota is None:
                return None
            if len(self._accounts) >= self._max_tenants:
                self._evict()
            account = self._accounts[tenant] = TokenAccount(tenant, quota, self.clock())
        elif quota is not account.quota:
            account.adopt(quota)
        account.streams += 1
        return account

    def close(self, account: TokenAccount) -> None:
        account.streams -= 1

    def reserve(self, account: TokenAccount, estimate: int) -> tuple[int, float]:
        """Reserve up to ``estimate`` tokens of ``account``'s quota: ``(reserved, wait_s)``, the
        tokens reserved (at most the quota itself) and the seconds to wait before the stream may
        open (0.0: now). Raises QuotaExceeded (reason ``tokens``, or ``deadline`` when the
        request's deadline is what the wait cannot fit) when the wait is longer than the
        tenant's ``max_wait_s`` or the deadline left; nothing is then reserved."""
        if not account.limits:
            return 0, 0.0
        limit = account.quota.token_quota
        assert limit is not None
        n = min(estimate, limit)
        now = self.clock()
        tat = (account.quota_tat if account.quota_tat > now else now) + n * account.quota_interval_s
        wait = tat - now - account.quota_burst_s
        if wait > _EPSILON_S:
            budget = account.quota.max_wait_s
            left = remaining()
            by_deadline = left is not None and left < budget
            if by_deadline:
                budget = left  # type: ignore[assignment]
            if wait > budget:
                if bus.active:
                    bus.emit(QuotaRejected(account.tenant, "deadline" if by_deadline else "tokens", wait))
                raise QuotaExceeded(account.tenant, wait, "deadline" if by_deadline else "tokens")
        else:
            wait = 0.0
        account.quota_tat = tat
        account.reserved += n
        return n, wait

    def settle(self, account: TokenAccount, reserved: int, used: int) -> None:
        """End a stream that reserved ``reserved`` tokens and counted ``used``: the quota is
        charged the real count (the difference is given back or owed) and the reservation
        released."""
        if account.limits:
            account.quota_tat += (used - reserved) * account.quota_interval_s
        account.reserved -= reserved
        account.settled += used

    def pace(self, account: TokenAccount, tokens: int) -> float:
        """Take ``tokens`` from ``account``'s pacing budget: the seconds to wait before handing
        them over (0.0 when they fit now)."""
        interval = account.interval_s
        if not interval or tokens <= 0:
            return 0.0
        now = self.clock()
        tat = (account.pace_tat if account.pace_tat > now else now) + tokens * interval
        account.pace_tat = tat
        wait = tat - now - account.burst_s
        return wait if wait > _EPSILON_S else 0.0

    def unpace(self, account: TokenAccount, tokens: int) -> None:
        """Give back ``tokens`` paced and never handed over (the wait was cancelled)."""
        account.pace_tat -= tokens * account.interval_s

    def _evict(self) -> None:
        """Forget accounts with no open stream, nothing reserved and nothing owed, down to 90% of
        ``max_tenants`` (amortised O(1) per new tenant)."""
        now = self.clock()
        target = int(self._max_tenants * 0.9)
        for tenant in [
            t
            for t, a in self._accounts.items()
            if not a.streams and not a.reserved and a.pace_tat <= now and a.quota_tat <= now
        ]:
            if len(self._accounts) <= target:
                return
            del self._accounts[tenant]


_of_guard: weakref.WeakKeyDictionary[Guard, TokenAccounts] = weakref.WeakKeyDictionary()


def token_accounts(guard: Guard) -> TokenAccounts:
    """The token accounts of ``guard``'s tenants (created on first use; shared by every stage with
    the generation preset): inspect them in tests and dashboards (``reserved``, ``settled``)."""
    accounts = _of_guard.get(guard)
    if accounts is None:
        accounts = _of_guard[guard] = TokenAccounts(guard.policy.quota, clock=guard.clock, sleep=guard.sleep)
    return accounts
