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
from ._redis_server import RedisClusterServers, RedisServer, RedisServerUnavailable
from ._scenario import (
    Phase,
    Scenario,
    ScenarioError,
    ScenarioRunner,
    default_scenario,
    load_scenario,
    parse_scenario,
)

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
    "Phase",
    "ProxyStats",
    "RedisClusterServers",
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
    "make_error",
    "parse_scenario",
]
