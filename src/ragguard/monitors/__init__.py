"""Monitors: an event-loop stall detector, a Redis pool monitor and an event recorder (``ragguard doctor``,
in :mod:`ragguard_tools.doctor`, correlates what they recorded).

Quick start, inside the service's running loop::

    from ragguard import monitors

    monitors.record_events("ragguard-events.jsonl")       # keep recent events for diagnose()/doctor
    detector = monitors.StallDetector().start()            # LoopStall events, 5 ms threshold
    pool = monitors.MonitoredBlockingConnectionPool.from_url(url, max_connections=20, leak_after_s=30)
    ...
    # then, from a shell: ragguard doctor --events ragguard-events.jsonl
"""

from ._events import ConnectionLeak, LoopStall, PoolExhausted
from ._pool import MonitoredBlockingConnectionPool, MonitoredConnectionPool
from ._record import record_events
from ._stall import StallDetector

__all__ = [
    "ConnectionLeak",
    "LoopStall",
    "MonitoredBlockingConnectionPool",
    "MonitoredConnectionPool",
    "PoolExhausted",
    "StallDetector",
    "record_events",
]
