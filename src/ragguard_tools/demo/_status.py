"""What ``ragguard demo --status-port PORT`` serves on ``127.0.0.1:PORT/status``, from start-up to exit.

Only the guarded run has a Guard, so only its status says anything about breakers, limits and
tenants: while it runs the endpoint answers that Guard's snapshot (with counts of its fallbacks,
sheds and refusals), and after it the run's last snapshot. Before it (start-up, the baseline,
the unguarded run) the endpoint answers a snapshot with no stages whose ``note`` says so, rather
than refusing connections, so ``ragguard top`` pointed at it early shows what is going on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ragguard import ConfigError, Guard
from ragguard._status import StatusCounts, snapshot
from ragguard_tools.status import StatusServer, serve

__all__ = ["DemoStatus"]

_NOT_YET = "demo: {phase}; nothing is guarded yet (the guarded run's status comes after the unguarded run)"


class DemoStatus:
    """The demo's status endpoint (see the module docstring): :meth:`open` binds it, :meth:`phase`
    names what the demo does, :meth:`guarding` and :meth:`ended` bracket the guarded run."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/status"
        self._server: StatusServer | None = None
        self._phase = "starting up"
        self._guard: Guard | None = None
        self._counts: StatusCounts | None = None
        self._last: dict[str, Any] | None = None

    def open(self) -> DemoStatus:
        """Serve from now on (call on the demo's event loop). Raises ConfigError (field
        ``status_port``) when the port cannot be bound."""
        try:
            self._server = serve(self.port, source=self.view)
        except OSError as exc:
            raise ConfigError(f"status_port {self.port} cannot be served on 127.0.0.1: "
                              f"{exc.strerror or exc}", field="status_port") from None  # fmt: skip
        return self

    def phase(self, text: str) -> None:
        self._phase = text

    def guarding(self, guard: Guard) -> None:
        """The guarded run begins with ``guard``: serve its snapshot, counting from now."""
        self._guard, self._counts = guard, StatusCounts().start()

    def ended(self) -> None:
        """The guarded run is over: keep serving its last snapshot (taken now), stop counting."""
        if self._guard is not None:
            self._last = snapshot(self._guard, self._counts)
        self._guard = None
        if self._counts is not None:
            self._counts.close()

    def view(self) -> dict[str, Any]:
        """What the endpoint answers now (on the demo's loop)."""
        if self._guard is not None:
            return {**snapshot(self._guard, self._counts), "note": "demo: the guarded run"}
        if self._last is not None:
            return {**self._last, "note": "demo: the guarded run is over; its last status"}
        return {"ok": True, "open": [], "stages": {}, "note": _NOT_YET.format(phase=self._phase)}

    async def aclose(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await asyncio.to_thread(server.close)
        if self._counts is not None:
            self._counts.close()
