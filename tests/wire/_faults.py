"""Faults a wire server applies to its next requests, scripted per route by the test.

::

    faults = Faults()
    faults.push("embeddings", Fault(status=429, headers={"retry-after-ms": "250"}), times=2)
    faults.push("chat", Fault(stall_after=2, stall_s=5.0))        # two events, then silence
    faults.push("chat", Fault(reset=True))                          # TCP reset, no response
    faults.push("chat", Fault(reset=True, after_tokens=3))          # three tokens, then a reset

A request takes the first fault queued for its route (or for ``"*"``), once per ``times``; with
none queued it is served normally. ``seen`` counts the requests of each route (a test asserts how
many reached the server). Thread-safe: the servers run in their own threads.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["Fault", "Faults", "placed"]


@dataclass(frozen=True)
class Fault:
    """What to do to one request instead of (or on top of) serving it.

    - ``status``/``headers``/``body``: answer this instead (``body`` a dict is sent as JSON, bytes
      as they are; None: the API's error body for ``status``);
    - ``delay_s``: wait this long before the first byte (the response, or the stream's head);
    - ``stall_after``/``stall_s``: a stream sends this many events, then waits ``stall_s``;
    - ``event``: a stream sends this many normal events, then this error event (a dict), then
      ends (``event_after`` events first);
    - ``reset``: reset the TCP connection (RST) before any byte (``reset_after`` events first, for
      a stream: mid-stream);
    - ``after_tokens``: for a stream, the stall (``stall_s``), the error event (``event``) or the
      reset (``reset``) comes after this many tokens, whatever events open the stream (a role
      chunk, ``message_start``...);
    - ``grpc_code``/``trailers``: for the gRPC servers, abort with this status and trailing
      metadata.
    """

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    delay_s: float = 0.0
    stall_after: int | None = None
    stall_s: float = 0.0
    event: dict[str, Any] | None = None
    event_after: int = 0
    reset: bool = False
    reset_after: int | None = None
    after_tokens: int | None = None
    grpc_code: str | None = None
    details: str = ""
    trailers: tuple[tuple[str, str], ...] = ()


def placed(fault: Fault | None, preamble: int) -> Fault | None:
    """``fault`` with its ``after_tokens`` turned into the event index it applies at, in a stream
    whose tokens follow ``preamble`` opening events."""
    if fault is None or fault.after_tokens is None:
        return fault
    at = preamble + fault.after_tokens
    if fault.event is not None:
        return replace(fault, event_after=at, after_tokens=None)
    if fault.reset:
        return replace(fault, reset_after=at, after_tokens=None)
    return replace(fault, stall_after=at, after_tokens=None)


class Faults:
    """The scripted faults of one server, per route (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued: dict[str, deque[list[Any]]] = defaultdict(deque)
        self.seen: dict[str, int] = defaultdict(int)

    def push(self, route: str, fault: Fault, *, times: int = 1) -> Faults:
        """Queue ``fault`` for the next ``times`` requests of ``route`` (``"*"``: any route)."""
        with self._lock:
            self._queued[route].append([fault, times])
        return self

    def always(self, route: str, fault: Fault) -> Faults:
        """Apply ``fault`` to every request of ``route`` until :meth:`clear`."""
        return self.push(route, fault, times=10**9)

    def clear(self) -> None:
        with self._lock:
            self._queued.clear()

    def take(self, route: str) -> Fault | None:
        """Count one request of ``route`` and return the fault it gets, if any."""
        with self._lock:
            self.seen[route] += 1
            for key in (route, "*"):
                queue = self._queued.get(key)
                if queue:
                    entry = queue[0]
                    entry[1] -= 1
                    if entry[1] <= 0:
                        queue.popleft()
                    return entry[0]  # type: ignore[no-any-return]
        return None
