"""The one way a quota refuses a request: its :class:`~ragguard.events.QuotaRejected` event and its
:class:`~ragguard.QuotaExceeded`, which tells, when the request's deadline cut the wait, what set
that deadline and its budget (as a :class:`~ragguard.DeadlineExceeded` does)."""

from __future__ import annotations

from .._deadline import current_expiry
from .._errors import QuotaExceeded
from ..events import QuotaRejected, bus

__all__ = ["refusal"]


def refusal(tenant: str, retry_after_s: float, reason: str) -> QuotaExceeded:
    """The error refusing ``tenant`` for ``reason`` (a retry could be admitted in ``retry_after_s``
    seconds), its event emitted. For reason ``"deadline"`` it reads the current deadline's budget
    and what set it."""
    if bus.active:
        bus.emit(QuotaRejected(tenant, reason, retry_after_s))
    if reason == "deadline":
        expiry = current_expiry()
        if expiry is not None:
            by, budget_s = expiry.set_by, expiry.budget_s
            return QuotaExceeded(tenant, retry_after_s, reason, deadline_s=budget_s, set_by=by)
    return QuotaExceeded(tenant, retry_after_s, reason)
