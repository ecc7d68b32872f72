"""Per-request context: the tenant and what was degraded, carried by context variables."""

from __future__ import annotations

import re
from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import Any

from ._errors import InvalidInput
from ._validate import bounded

__all__ = [
    "DEFAULT_TENANT",
    "RequestScope",
    "current_scope",
    "current_tenant",
    "degraded",
    "validate_tenant_id",
]

DEFAULT_TENANT = "default"
MAX_TENANT_ID_LEN = 64
_TENANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}")


class RequestScope:
    """One request's mutable record, created by ``tenant(...)``: which fallbacks served it, the
    worker threads its sync calls stopped waiting for that still run (``threads``, a
    :class:`ragguard.pipeline._threads.Pending`, None until one is), and how its guarded streams
    ended (``endings``, :mod:`ragguard._endings`; ``ended_before``: how many older ones were let
    go to keep the list bounded)."""

    __slots__ = ("ended_before", "endings", "fallbacks", "tenant", "threads")

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.fallbacks: list[str] | None = None  # allocated by the first fallback only
        self.threads: Any = None
        self.endings: list[Any] | None = None  # allocated by the first stream that ends
        self.ended_before = 0

    def __repr__(self) -> str:
        return f"RequestScope(tenant={self.tenant!r}, fallbacks={self.fallbacks!r})"


_scope: ContextVar[RequestScope | None] = ContextVar("ragguard_request", default=None)
current_scope: Callable[[], RequestScope | None] = _scope.get
"""The request scope opened by the innermost ``tenant(...)`` block, or None (the context
variable's own ``get``: read by layers on every call, so no Python frame)."""
open_scope: Callable[[RequestScope], Token[RequestScope | None]] = _scope.set
"""Make ``scope`` the current request scope; returns the token for :func:`close_scope`."""
close_scope: Callable[[Token[RequestScope | None]], None] = _scope.reset
"""Put back the request scope :func:`open_scope` replaced."""
_loose_fallbacks: ContextVar[tuple[int, tuple[str, ...]]] = ContextVar("ragguard_degraded", default=(0, ()))
"""(generation, names): the fallbacks marked outside a request in this context; names of an older
generation than :data:`_loose_generation` are forgotten (:func:`forget_loose_fallbacks`)."""
_loose_generation = 0


def validate_tenant_id(tenant_id: object) -> str:
    """Return ``tenant_id`` when it is a valid tenant id, else raise InvalidInput (a ValueError).

    Valid: a str of 1 to 64 characters from ``A-Z a-z 0-9 . _ : @ -``, starting with a letter or
    digit. Bounding ids keeps a flood of junk ids from creating unbounded quota buckets.
    """
    if not isinstance(tenant_id, str):
        raise InvalidInput(f"tenant id must be a str, got {type(tenant_id).__name__}")
    if _TENANT_RE.fullmatch(tenant_id) is None:
        raise InvalidInput(
            f"invalid tenant id {bounded(tenant_id, 80)!r}: use 1-{MAX_TENANT_ID_LEN} characters from "
            "A-Z a-z 0-9 . _ : @ -, starting with a letter or digit"
        )
    return tenant_id


def current_tenant() -> str:
    """The tenant id of the current context, or ``"default"`` outside any ``tenant(...)`` block."""
    scope = _scope.get()
    return DEFAULT_TENANT if scope is None else scope.tenant


def degraded() -> tuple[str, ...]:
    """Names of the fallbacks that served calls in the current request, in order; () when none.

    Inside ``tenant(...)`` this covers every guarded call of the request, child tasks included;
    outside it, the calls made directly in the current context, each fallback named once.
    """
    scope = _scope.get()
    if scope is not None:
        return tuple(scope.fallbacks or ())
    generation, names = _loose_fallbacks.get()
    return names if generation == _loose_generation else ()


def degraded_count() -> int:
    """``len(degraded())`` without building the tuple (read twice per observed call)."""
    scope = _scope.get()
    if scope is not None:
        return 0 if scope.fallbacks is None else len(scope.fallbacks)
    generation, names = _loose_fallbacks.get()
    return len(names) if generation == _loose_generation else 0


def mark_degraded(fallback: str) -> None:
    scope = _scope.get()
    if scope is not None:
        if scope.fallbacks is None:
            scope.fallbacks = []
        scope.fallbacks.append(fallback)
    else:
        # No request scope bounds this context (a long-lived task): keep each name once, so the
        # tuple cannot grow with every call (it would cost memory and O(n) per fallback served).
        generation, loose = _loose_fallbacks.get()
        if generation != _loose_generation:
            loose = ()
        if fallback not in loose:
            _loose_fallbacks.set((_loose_generation, (*loose, fallback)))


def forget_loose_fallbacks() -> None:
    """Forget the fallbacks marked outside any request, in every context at once (test suites
    share one context across tests: :func:`ragguard.testing.reset` calls this)."""
    global _loose_generation
    _loose_generation += 1
