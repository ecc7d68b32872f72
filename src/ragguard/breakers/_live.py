"""Every breaker alive in this process, for exporters that read breaker states when scraped.

A breaker registers itself once, when it is built (a weak reference: the registry never keeps a
breaker alive); nothing happens per call. Exporters list the live breakers at scrape time, so a
breaker's state is visible from its creation, before its first transition.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

__all__ = ["live_breakers", "register_breaker"]

_LIVE: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_serial = itertools.count()


def register_breaker(breaker: Any) -> None:
    """List ``breaker`` (anything with ``name`` and ``state``) among the live breakers."""
    _LIVE[next(_serial)] = breaker


def live_breakers() -> list[Any]:
    """The breakers alive now, oldest first. A breaker another one wraps (the local state machine
    of a ``SharedCircuitBreaker``, its ``wrapped``) is left out: the wrapper speaks for it."""
    breakers = [b for _, b in sorted(list(_LIVE.items()), key=lambda item: item[0])]
    hidden = {id(w) for w in (getattr(b, "wrapped", None) for b in breakers) if w is not None}
    return [b for b in breakers if id(b) not in hidden]
