"""What the share and the reserve layers have in common: a gate of item scope whose ``enter`` makes an
earlier deadline than the request's current (:func:`ragguard._deadline.shorten`, its token returned;
:data:`~ragguard.pipeline.NO_EXIT` when it makes none) and whose ``exit`` puts the request's back, so
the layers inside it read the earlier one and the layers outside it (the fallback, for the reserve)
the request's."""

from __future__ import annotations

from typing import Any, ClassVar

from .._deadline import restore
from ..pipeline import Call, Scope

__all__ = ["EarlierDeadline"]


class EarlierDeadline:
    """The base of :class:`~ragguard.layers._share.ShareLayer` and
    :class:`~ragguard.layers._reserve.ReserveLayer`: a subclass writes ``enter``."""

    scope: ClassVar[Scope] = "item"
    __slots__ = ()

    def enter(self, call: Call) -> Any:  # pragma: no cover - every subclass writes its own
        raise NotImplementedError

    async def enter_async(self, call: Call) -> Any:  # pragma: no cover - enter never waits
        return self.enter(call)

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        restore(token)  # (an enter that made no earlier deadline answers NO_EXIT: no exit)
        return None
