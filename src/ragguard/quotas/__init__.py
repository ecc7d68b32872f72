"""Per-tenant quotas: concurrency (a FIFO bulkhead), rate (GCRA) and a time budget per request;
and each tenant's tokens (:class:`TokenAccounts`: pacing and token quotas, GCRA over tokens)."""

from ..options import TenantQuota
from ._local import WAIT, Lease, LocalQuotas, QuotaBackend
from ._tenant import TenantContext
from ._tokens import TokenAccounts

__all__ = ["WAIT", "Lease", "LocalQuotas", "QuotaBackend", "TenantContext", "TenantQuota", "TokenAccounts"]
