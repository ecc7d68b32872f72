"""Chaos toolkit: faults at guarded stages, a TCP fault proxy, scenarios and pytest fixtures.

In-process faults (:class:`Latency`, :class:`Error`, :class:`PartialResults`, ...) are injected at
guarded stages through a :class:`Chaos` injector; :class:`FaultProxy` breaks real TCP connections;
scenarios (:func:`load_scenario`) schedule phases of faults over a run.
"""

from ._chaos import Chaos, FaultHandle, FaultInjected
from ._faults import (
    BlockLoop,
    CorruptPayload,
    EmptyResults,
    Error,
    Fault,
    FaultContext,
    Hang,
    HoldConnections,
    Latency,
    PartialResults,
    Schedule,
    StaleResults,
    Timeout,
    batch_size,
    corrupt_bytes,
    make_error,
)
from ._proxy import FaultProxy, ProxyStats
from ._redis_server import RedisServer, RedisServerUnavailable

__all__ = [
    "BlockLoop",
    "Chaos",
    "CorruptPayload",
    "EmptyResults",
    "Error",
    "Fault",
    "FaultContext",
    "FaultHandle",
    "FaultInjected",
    "FaultProxy",
    "Hang",
    "HoldConnections",
    "Latency",
    "PartialResults",
    "ProxyStats",
    "RedisServer",
    "RedisServerUnavailable",
    "Schedule",
    "StaleResults",
    "Timeout",
    "batch_size",
    "corrupt_bytes",
    "make_error",
]
