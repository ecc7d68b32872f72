"""A request's priority: set by a front door (a header) or by the code, else the tenant's quota's.

A priority the client sends (``x-priority``) can lower its tenant's configured priority, never
raise it, unless the door's tenant resolver says the caller is trusted
(:func:`sent_priority`); the code's own ``with priority(...)`` is always taken as written.

Three levels, after the criticality classes of Google's SRE book: ``critical`` (shed last: a
health check, a paying user's answer the page waits for), ``interactive`` (the default: a person
is waiting) and ``batch`` (shed first: indexing, evaluation jobs, prefetching). Over an adaptive
limit, the lowest priority is shed first, and within one priority the heaviest tenant.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal

from .._errors import InvalidInput
from .._validate import shown

__all__ = [
    "PRIORITIES",
    "PRIORITY_HEADER",
    "Priority",
    "current_priority",
    "parse_priority",
    "priority",
    "sent_priority",
]

Priority = Literal["critical", "interactive", "batch"]
PRIORITIES: tuple[str, ...] = ("batch", "interactive", "critical")
"""The priority names, lowest first (a name's index is its rank)."""
RANK: dict[str, int] = {name: i for i, name in enumerate(PRIORITIES)}
PRIORITY_HEADER = "x-priority"
"""The header (HTTP) or metadata key (gRPC) a front door reads a request's priority from."""

_priority: ContextVar[str | None] = ContextVar("ragguard_priority", default=None)


def parse_priority(value: object) -> str:
    """``value`` (a priority name, any case, or bytes of one) as a priority name; InvalidInput
    naming the allowed values otherwise."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if isinstance(value, str):
        name = value.strip().lower()
        if name in RANK:
            return name
    raise InvalidInput(f"priority must be one of {', '.join(PRIORITIES)}; got {shown(value)}")


def sent_priority(value: object, configured: str, *, trusted: bool = False) -> str | None:
    """The priority a front door runs a request at whose client sent ``value`` (a priority name,
    or bytes of one) and whose tenant's quota says ``configured``: as sent when the caller is
    ``trusted``, else at most ``configured``. None when the tenant's own applies (nothing sent,
    or an untrusted client asked for as much or more). InvalidInput for a bad name."""
    if value is None:
        return None
    name = parse_priority(value)
    if trusted or RANK[name] < RANK[configured]:
        return name
    return None


current_priority: Callable[[], str | None] = _priority.get
"""The priority set for the current context (:func:`priority`, a front door's header), or
None: then each stage uses the tenant's quota's ``priority``. (The context variable's own
``get``: layers read it on every call, so no Python frame.)"""


@contextmanager
def priority(name: str) -> Iterator[str]:
    """``with priority("batch"):`` the guarded calls inside run at that priority (a name of
    :data:`PRIORITIES`; InvalidInput otherwise), whatever the tenant's quota says."""
    token = _priority.set(parse_priority(name))
    try:
        yield _priority.get() or name
    finally:
        _priority.reset(token)


def set_priority(name: str | None) -> object:
    """Set the context's priority (None: the tenant's) and return the token to reset it with
    :func:`reset_priority` (front doors, whose scopes are not ``with`` blocks)."""
    return _priority.set(None if name is None else parse_priority(name))


def reset_priority(token: object) -> None:
    _priority.reset(token)  # type: ignore[arg-type]
