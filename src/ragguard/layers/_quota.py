"""The tenant quota of a call made outside any ``tenant(...)`` block.

Inside ``async with tenant("acme")`` (or a front door that opens one) the request was admitted once
on entry, and its guarded calls pass. A call made outside any request is its own request of the
default tenant: this gate of call scope admits it against ``default_quota`` (a slot and a rate
token, waiting first come first served up to ``max_wait_s``; :class:`~ragguard.QuotaExceeded` when
refused) and releases it when the call (or stream) ends. It is in the chain only when the default
quota limits anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .._context import DEFAULT_TENANT, current_scope
from ..pipeline import NO_EXIT, Call, Scope
from ..quotas import QuotaBackend

if TYPE_CHECKING:
    from ._shapes import Bound, Stage

__all__ = ["QuotaLayer", "build"]


class QuotaLayer:
    """Admits calls made outside a request scope as requests of the default tenant."""

    scope: ClassVar[Scope] = "call"
    holds: ClassVar[bool] = True  # a slot: held until a sync call's worker thread returns
    __slots__ = ("quotas",)

    def __init__(self, quotas: QuotaBackend) -> None:
        self.quotas = quotas

    def enter(self, call: Call) -> Any:
        if current_scope() is not None:
            return NO_EXIT  # admitted on entry to the request: nothing to release
        return self.quotas.admit_now(DEFAULT_TENANT)

    async def enter_async(self, call: Call) -> Any:
        return await self.quotas.acquire(DEFAULT_TENANT)

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        self.quotas.release(token)
        return None


def build(stage: Stage, bound: Bound) -> QuotaLayer | None:
    ctx = stage.context
    return QuotaLayer(ctx.quotas) if ctx.per_call_quota else None
