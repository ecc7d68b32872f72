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
    Hang,
    HoldConnections,
    Latency,
    PartialResults,
    Schedule,
    StaleResults,
    Timeout,
    batch_size,
    corrupt_bytes,
)
from ._proxy import FaultProxy
from ._redis_server import RedisServer, RedisServerUnavailable
from ._scenario import Scenario, ScenarioError, ScenarioRunner, default_scenario, load_scenario

__all__ = [
    "BlockLoop",
    "Chaos",
    "CorruptPayload",
    "EmptyResults",
    "Error",
    "FaultHandle",
    "FaultInjected",
    "FaultProxy",
    "Hang",
    "HoldConnections",
    "Latency",
    "PartialResults",
    "RedisServer",
    "RedisServerUnavailable",
    "Scenario",
    "ScenarioError",
    "ScenarioRunner",
    "Schedule",
    "StaleResults",
    "Timeout",
    "batch_size",
    "corrupt_bytes",
    "default_scenario",
    "load_scenario",
]
