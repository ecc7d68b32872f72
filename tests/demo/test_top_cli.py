"""`ragguard top`: its options, frames of a real status server and the rates between two polls
(--once, pipes, signals and an endpoint that does not answer: tests/metrics/test_top.py)."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from ragguard import Guard, Policy, TenantQuota
from ragguard_tools import status
from ragguard_tools.cli import app
from ragguard_tools.top import Top


def test_bad_options_exit_2_naming_them() -> None:
    runner = CliRunner()
    bad_url = runner.invoke(app, ["top", "127.0.0.1:8000"])
    assert bad_url.exit_code == 2 and "URL must start with http://" in bad_url.output
    bad_interval = runner.invoke(app, ["top", "http://127.0.0.1:1/", "--interval", "0"])
    assert bad_interval.exit_code == 2 and "--interval" in bad_interval.output


def _row(frame: str, stage: str) -> list[str]:
    return next(line.split() for line in frame.splitlines() if line.startswith(stage))


def _frame(top: Top) -> str:
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(top.frame())
    return out.getvalue()


@pytest.mark.anyio
async def test_one_frame_of_a_real_status_server_fits_80_columns() -> None:
    g = Guard(Policy(tenants={"acme": TenantQuota(max_concurrency=2)}))

    async def cached(texts: list[str]) -> list[float]:
        return [0.0]

    @g.guard("embedding", fallback=cached)
    async def embed(texts: list[str]) -> list[float]:
        raise ConnectionRefusedError

    server = status.serve(0, g)
    now = [100.0]
    top = Top(server.url, clock=lambda: now[0])
    try:
        first = await asyncio.to_thread(_frame, top)
        for _ in range(10):
            assert await embed(["x"]) == [0.0]
        g.breaker("embedding").force_open()
        await asyncio.sleep(0.01)
        now[0] += 2.0  # two seconds between the polls, on the clock top is given
        second = await asyncio.to_thread(_frame, top)
    finally:
        server.close()
    assert "embedding" in first and "OK" in first
    assert _row(first, "embedding")[2] == "-", "no rate from one poll"
    assert all(len(line) <= 80 for line in second.splitlines())
    row = _row(second, "embedding")
    assert row[:2] == ["embedding", "forced_open"]
    assert "5.0" in row, f"10 fallbacks in 2 s: {row!r}"
    assert "DEGRADED" in second
    tenants = [line.split() for line in second.splitlines() if line.startswith(("acme", "(others)"))]
    assert tenants == [["acme", "0", "0", "2", "0.0"], ["(others)", "0", "0", "-", "0.0"]]


def test_a_status_without_counts_shows_dashes_and_says_why() -> None:
    snapshot: dict[str, Any] = {"ok": True, "open": [], "stages": {"embed": {"breaker": None}}}
    top = Top("http://x/status", fetcher=lambda url: snapshot)
    text = _frame(top)
    assert "no counts" in text and "embed" in text
