"""Per-tenant quotas: concurrency (a FIFO bulkhead), rate (GCRA) and a time budget per request."""

from ..options import TenantQuota
from ._local import WAIT, Lease, LocalQuotas, QuotaBackend
from ._tenant import TenantContext

__all__ = ["WAIT", "Lease", "LocalQuotas", "QuotaBackend", "TenantContext", "TenantQuota"]
