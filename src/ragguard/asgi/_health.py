"""A status endpoint for health checks and ``ragguard top``: :func:`ragguard._status.snapshot` as JSON."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .._errors import ConfigError
from .._status import StatusCounts
from .._status import snapshot as status_snapshot
from ._middleware import Receive, Scope, Send

if TYPE_CHECKING:
    from .._guard import Guard

__all__ = ["StatusEndpoint"]


class StatusEndpoint:
    """A pure ASGI app answering every HTTP request with the guard's status snapshot::

        {"ok": true, "open": [], "stages": {"embed": {"breaker": {"name": "embed",
                                                                  "state": "closed", ...}}},
         "quotas": {...}, "links": [...], "counts": {...}}

    (the whole shape: :mod:`ragguard._status`).

    ``guard``: the :class:`~ragguard.Guard` to report (default: the default registry, looked up
    per request). ``open_status``: the HTTP status while a breaker is not closed (default 200:
    fallbacks may still be serving, and a load balancer that pulls every replica whose vector
    store is down takes the whole service down; give 503 to a probe that should). Mount it on
    an exempt path, e.g. ``app.add_route("/health", StatusEndpoint())`` in FastAPI or Starlette.
    ``counts`` (default True): from the first request on, also count fallbacks served, calls
    shed, throttled and rejected (a :class:`ragguard._status.StatusCounts` on the event bus, so
    guarded calls build their events from then on, as with any listener; ``ragguard top`` shows
    them per second); False keeps the bus as it is. Raises :class:`~ragguard.ConfigError` for a
    bad ``open_status``.
    """

    def __init__(self, guard: Guard | None = None, *, open_status: int = 200, counts: bool = True) -> None:
        if isinstance(open_status, bool) or not isinstance(open_status, int) or not 200 <= open_status <= 599:
            raise ConfigError(
                f"StatusEndpoint: open_status must be an HTTP status 200-599, got {open_status!r}"
            )
        if guard is not None and not callable(getattr(guard, "status", None)):
            raise ConfigError(f"StatusEndpoint: guard must be a ragguard.Guard, got {guard!r}")
        self._guard = guard
        self.open_status = open_status
        self.counts: StatusCounts | None = StatusCounts() if counts else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise ConfigError(f"StatusEndpoint serves HTTP only, not {scope['type']!r}")
        guard = self._guard
        if guard is None:
            from .._guard import default_guard

            guard = default_guard()
        counts = self.counts
        if counts is not None and not counts.started:
            counts.start()
        snapshot = status_snapshot(guard, counts)
        body = json.dumps(snapshot, separators=(",", ":")).encode()
        status = 200 if snapshot["ok"] else self.open_status
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body if scope["method"] != "HEAD" else b""})
