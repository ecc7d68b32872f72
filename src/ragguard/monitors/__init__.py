"""Monitors (placeholder while building)."""
from ._stall import StallDetector
MonitoredBlockingConnectionPool = None
