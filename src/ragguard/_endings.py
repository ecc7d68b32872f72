"""How a guarded stream ended: ``completed``, ``continued`` or ``incomplete``.

Every guarded stream (an async generator function under ``@guard``) ends with one
:class:`StreamEnding`, set by the stream driver when its last item has been handed over or its
error raised, before the layers it held are released:

- ``completed``: the stream (the model's, or a fallback's that served it before its first item)
  ran to its end; the caller has the whole answer;
- ``continued``: the stream failed after items had reached the caller (past its commit point), and
  a continuation (``@guard("generation", continuation=...)``) took over from the partial output and
  ran to its end: ``continued_by`` names it, ``continued_after`` is how many items the failed
  stream had handed over;
- ``incomplete``: the stream ended without its end, ``items`` items having reached the caller: it
  failed (``error`` names the error's class) with no continuation that could take over, or the
  caller stopped reading (``error`` is ``"closed"``, or ``"cancelled"``).

The caller reads it on the stream object (``stream.ending``, None until the stream ends) and, in a
request (``ragguard.tenant(...)``, a front door), with :func:`stream_endings`; the front doors send
it to their clients (docs/http.md, docs/grpc.md).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from ._context import current_scope
from .events import quick_init

__all__ = ["MAX_ENDINGS", "Ending", "StreamEnding", "record_ending", "stream_endings"]

Ending = Literal["completed", "continued", "incomplete"]

MAX_ENDINGS = 32
"""Endings a request keeps (the latest ones): a request streaming more keeps a bounded record."""


@quick_init  # made at the end of every guarded stream
@dataclass(frozen=True, slots=True)
class StreamEnding:
    """How one guarded stream of stage ``stage`` ended (see the module docstring).

    ``kind``: ``completed``, ``continued`` or ``incomplete``; ``items``: items that reached the
    caller in all (the continuation's included); ``continued_by``: the continuation that took over
    ("" when none did; an incomplete stream names one that failed in its turn);
    ``continued_after``: items the failed stream had handed over before it (0 when none took
    over); ``error``: the class name of the error that ended the stream (incomplete)
    or that the continuation took over from (continued), ``"closed"`` or ``"cancelled"`` when the
    caller stopped reading, "" when completed."""

    kind: Ending
    stage: str
    items: int
    continued_by: str = ""
    continued_after: int = 0
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"ending": kind, "stage", "items"}``, with ``continued_by`` and
        ``continued_after`` when continued and ``error`` when one is named (what the front doors
        send)."""
        out: dict[str, Any] = {"ending": self.kind, "stage": self.stage, "items": self.items}
        if self.continued_by:
            out["continued_by"] = self.continued_by
            out["continued_after"] = self.continued_after
        if self.error:
            out["error"] = self.error
        return out

    def __str__(self) -> str:
        if self.kind == "continued":
            return (
                f"continued by {self.continued_by} after {self.continued_after} of {self.items} items "
                f"({self.error})"
            )
        if self.kind == "incomplete":
            return f"incomplete after {self.items} items ({self.error})"
        return f"completed ({self.items} items)"


def ended_by(exc: BaseException) -> str:
    """What :attr:`StreamEnding.error` says of ``exc``: ``"closed"`` for a caller that stopped
    reading (``GeneratorExit``), ``"cancelled"`` for a cancellation, else the error's class name."""
    if isinstance(exc, GeneratorExit):
        return "closed"
    if isinstance(exc, asyncio.CancelledError) or not isinstance(exc, Exception):
        return "cancelled"
    return type(exc).__name__


def record_ending(ending: StreamEnding) -> None:
    """Keep ``ending`` in the current request's scope (none outside a request), the latest
    :data:`MAX_ENDINGS` of them."""
    scope = current_scope()
    if scope is None:
        return
    endings = scope.endings
    if endings is None:
        scope.endings = [ending]
        return
    if len(endings) >= MAX_ENDINGS:
        del endings[0]
        scope.ended_before += 1
    endings.append(ending)


def stream_endings() -> tuple[StreamEnding, ...]:
    """The endings of the guarded streams that ended in the current request (inside
    ``ragguard.tenant(...)`` or a front door, child tasks included), in the order they ended;
    () outside a request (read ``stream.ending`` on the stream itself). At most the latest
    :data:`MAX_ENDINGS`."""
    scope = current_scope()
    if scope is None or scope.endings is None:
        return ()
    return tuple(scope.endings)
