"""Helpers of the overload tests (imported as ``overload_helpers``)."""

from __future__ import annotations

import asyncio


async def settle(rounds: int = 8) -> None:
    """Let every ready task run (a few loop iterations)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
