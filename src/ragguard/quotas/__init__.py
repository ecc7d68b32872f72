"""Per-tenant quotas: concurrency (a FIFO bulkhead), rate (GCRA) and a time budget per request;
and each tenant's tokens (:class:`TokenAccounts`: pacing and token quotas, GCRA over tokens)."""

from ._local import LocalQuotas, QuotaBackend
from ._tokens import TokenAccounts

__all__ = ["LocalQuotas", "QuotaBackend", "TokenAccounts"]
