"""Helpers shared by the distributed tests (a module of its own: ``conftest`` names clash across folders)."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff


def make_client(host: str, port: int, **kw: Any) -> aredis.Redis:
    """A client as docs/distributed.md recommends: short socket timeouts, no retries of its own."""
    kw.setdefault("socket_timeout", 0.5)
    kw.setdefault("socket_connect_timeout", 0.5)
    return aredis.Redis(host=host, port=port, retry=Retry(NoBackoff(), 0), **kw)
