"""``async with tenant("acme"):`` admits one request of a tenant and scopes it."""

from __future__ import annotations

from contextvars import Token
from functools import partial
from itertools import islice
from types import TracebackType
from typing import Any

from .._clock import Clock, monotonic
from .._context import MAX_TENANT_ID_LEN, RequestScope, close_scope, open_scope, validate_tenant_id
from .._deadline import Expiry, narrow, restore
from ..options import TenantQuota
from ._local import WAIT, QuotaBackend

__all__ = ["TenantContext"]

_VALID_MAX = 4096
_valid: dict[str, str] = {}
"""Tenant ids that passed the check, kept for the next request of the tenant: at most
``_VALID_MAX``, the oldest half forgotten when full (so a rotation over more tenants than that
pays the check, about 100 ns for an id of letters and digits, never unbounded memory)."""


def _checked(tenant_id: object) -> str:
    if isinstance(tenant_id, str):
        hit = _valid.get(tenant_id)
        if hit is not None:
            return hit
        if tenant_id.isalnum() and tenant_id.isascii() and len(tenant_id) <= MAX_TENANT_ID_LEN:
            checked = tenant_id  # [A-Za-z0-9]{1,64}: valid without the regular expression
        else:
            checked = validate_tenant_id(tenant_id)
    else:
        checked = validate_tenant_id(tenant_id)  # raises InvalidInput
    if len(_valid) >= _VALID_MAX:
        for old in list(islice(_valid, _VALID_MAX // 2)):
            del _valid[old]
    _valid[checked] = checked
    return checked


class TenantContext(RequestScope):
    """One request of one tenant: quota admitted on entry, released on exit, error or cancellation.

    Entering raises :class:`~ragguard.QuotaExceeded` when the tenant is over quota; inside, the
    tenant's ``timeout_s`` is the deadline (or the caller's, if shorter), guarded calls are
    attributed to the tenant, and :func:`ragguard.degraded` reports the fallbacks that served it.
    A bad tenant id raises :class:`~ragguard.InvalidInput` (a ValueError) at construction. A
    worker thread of a sync guarded call that the request stopped waiting for keeps the slot
    until it returns (docs/sync.md). The
    context is itself the request's scope (``async with tenant("acme") as scope``). ``clock``
    (monotonic seconds) is the one the tenant's deadline is set on (the Guard's).
    """

    __slots__ = ("_backend", "_clock", "_deadline_token", "_lease", "_quota", "_token")

    def __init__(
        self, tenant_id: str, backend: QuotaBackend, quota: TenantQuota, clock: Clock = monotonic
    ) -> None:
        hit = _valid.get(tenant_id) if type(tenant_id) is str else None
        self.tenant = hit if hit is not None else _checked(tenant_id)
        self.fallbacks = None
        self.threads = None
        self.endings = None
        self.ended_before = 0
        self._backend = backend
        self._quota = quota
        self._lease: Any = None
        self._clock = clock
        self._token: Token[RequestScope | None] | None = None
        self._deadline_token: Token[Expiry | None] | None = None

    @property
    def tenant_id(self) -> str:
        return self.tenant

    async def __aenter__(self) -> TenantContext:
        if self._token is not None:
            raise RuntimeError("tenant(...) is not reentrant; create one per request")
        backend = self._backend
        lease = backend.admit_now(self.tenant)
        if lease is WAIT:
            lease = await backend.acquire(self.tenant)
        self._lease = lease
        timeout_s = self._quota.timeout_s
        if timeout_s is not None:
            self._deadline_token = narrow(timeout_s, self._clock, "tenant")
        self._token = open_scope(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token, self._token = self._token, None
        try:
            if token is not None:
                close_scope(token)
            dl_token, self._deadline_token = self._deadline_token, None
            if dl_token is not None:
                restore(dl_token)
        finally:
            lease, self._lease = self._lease, None
            if lease is not None:
                threads = self.threads
                if threads is not None and threads.count:  # a sync call's thread still runs
                    threads.hold(partial(self._backend.release, lease))
                else:
                    self._backend.release(lease)
