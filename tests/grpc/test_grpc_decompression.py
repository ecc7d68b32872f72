"""Snappy requests are decompressed after the tenant is admitted: a call its quota refuses is never
decompressed. A real grpc.aio server (GuardServerInterceptor, then SnappyServerInterceptor) and a
stock grpcio client sending marked Snappy blocks, as snappy_channel(compress_requests=True) does."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
import snappy
from grpc import aio
from grpc_helpers import Behaviors, method, requests_of, serving

import ragguard
from ragguard import Policy, TenantQuota
from ragguard.buffers import SnappyCodec
from ragguard.grpc import GuardServerInterceptor, SnappyServerInterceptor, SnappyWire
from ragguard.grpc._compression import ENCODING_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

HERE = Path(__file__).resolve().parent
LIMIT = 4 * 1024 * 1024  # SnappyCodec's default max_message_bytes
BOMB = b"\x01" + snappy.compress(b"a" * LIMIT)  # a marked block of about 197 KB expanding to 4 MiB
HOLD = b"\x01" + snappy.compress(b"hold")
ACME = (("x-tenant-id", "acme"), (ENCODING_KEY, "snappy"))


class CountingCodec(SnappyCodec):
    """The real codec, counting the blocks it is asked to decompress (a large block's
    ``decompress`` goes through ``decompressed``: counted once)."""

    def __init__(self) -> None:
        super().__init__()
        self.decompressions = 0
        self._inside = False

    def decompress(self, block: Any) -> bytes:
        self.decompressions += 1
        self._inside = True
        try:
            return super().decompress(block)
        finally:
            self._inside = False

    def decompressed(self, block: Any) -> Any:
        self.decompressions += not self._inside
        return super().decompressed(block)


async def _call(channel: aio.Channel, kind: str, payload: bytes) -> grpc.StatusCode:
    stub = method(channel, kind)
    try:
        if kind == "Unary":
            await stub(payload, metadata=ACME, timeout=20)
        elif kind == "ClientStream":
            await stub(requests_of(payload), metadata=ACME, timeout=20)
        else:
            [
                m
                async for m in stub(
                    requests_of(payload) if kind.startswith("Bidi") else payload, metadata=ACME, timeout=20
                )
            ]
    except aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("borrow", [False, True])
@pytest.mark.parametrize("kind", ["Unary", "StreamGen", "ClientStream", "BidiGen"])
async def test_a_call_its_quota_refuses_is_never_decompressed(kind: str, borrow: bool) -> None:
    codec = CountingCodec()
    guard = ragguard.Guard(Policy(tenants={"acme": TenantQuota(max_concurrency=1)}))
    behaviors = Behaviors()
    interceptors = [
        GuardServerInterceptor(guard=guard),
        SnappyServerInterceptor(wire=SnappyWire(codec=codec, borrow=borrow)),
    ]
    unlimited = [("grpc.max_receive_message_length", -1)]  # the handlers echo the 4 MiB request
    async with (
        serving(behaviors, interceptors) as target,
        aio.insecure_channel(target, options=unlimited) as channel,
    ):
        held = asyncio.create_task(_call(channel, "Unary", HOLD))  # takes acme's one slot
        await asyncio.wait_for(behaviors.entered.wait(), 10)
        assert codec.decompressions == 1  # the admitted call's request
        refused = await asyncio.gather(*(_call(channel, kind, BOMB) for _ in range(10)))
        assert codec.decompressions == 1
        behaviors.release.set()
        assert await held == grpc.StatusCode.OK
        big = await _call(channel, kind, BOMB)  # admitted now: decompressed in full, within the limit
    assert refused == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 10
    assert big == grpc.StatusCode.OK and codec.decompressions == 2


@pytest.mark.parametrize("kind", ["Unary", "StreamGen"])
async def test_a_corrupt_request_is_still_invalid_argument_once_admitted(kind: str) -> None:
    guard = ragguard.Guard(Policy())
    behaviors = Behaviors()
    async with serving(behaviors, [GuardServerInterceptor(guard=guard), SnappyServerInterceptor()]) as target:
        async with aio.insecure_channel(target) as channel:
            codes = [await _call(channel, kind, bad) for bad in (b"\x01garbage", b"\x07x", b"")]
            over = await _call(channel, kind, b"\x01" + snappy.compress(b"a" * (LIMIT + 1)))
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 3 and over == grpc.StatusCode.INVALID_ARGUMENT
    assert behaviors.calls == 0


async def test_the_wrong_interceptor_order_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    guard = ragguard.Guard(Policy())
    snappy_first = [SnappyServerInterceptor(), GuardServerInterceptor(guard=guard)]
    with caplog.at_level(logging.WARNING, logger="ragguard.grpc"):
        async with serving(Behaviors(), snappy_first) as target, aio.insecure_channel(target) as channel:
            assert await _call(channel, "Unary", b"\x01" + snappy.compress(b"hi")) == grpc.StatusCode.OK
            assert await _call(channel, "Unary", b"\x01" + snappy.compress(b"hi")) == grpc.StatusCode.OK
    warnings = [r for r in caplog.records if "list GuardServerInterceptor first" in r.getMessage()]
    assert len(warnings) == 1


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc status")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads peak RSS from /proc")
async def test_refused_snappy_bombs_do_not_grow_the_server() -> None:
    """The issue's measurement: 100 concurrent calls, each a ~197 KB block expanding to exactly the
    4 MiB limit, from one tenant allowed 2 at once: the server's peak RSS grows by the wire
    buffers and the two admitted requests (+36 to +45 MiB measured), not by 98 refused requests
    decompressed first (+113 to +153 MiB measured before the fix)."""
    env = {**os.environ, "GRPC_VERBOSITY": "ERROR"}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "snappy_server.py"), "2", "1.0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port = int(proc.stdout.readline())
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            rpc = channel.unary_unary("/t.Ingest/Put")
            assert await rpc(b"\x01" + snappy.compress(b"warm"), metadata=ACME, timeout=10) == b"4"
            before = _peak_rss_mib(proc.pid)

            async def one() -> grpc.StatusCode:
                try:
                    await rpc(BOMB, metadata=ACME, timeout=30)
                except aio.AioRpcError as exc:
                    return exc.code()
                return grpc.StatusCode.OK

            codes = await asyncio.gather(*(one() for _ in range(100)))
            after = _peak_rss_mib(proc.pid)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(10)
    growth = after - before
    print(
        f"\nserver peak RSS {before:.0f} MiB -> {after:.0f} MiB (+{growth:.0f} MiB) for 100 x {len(BOMB)} B"
    )
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) >= 95
    assert growth < 75, f"the server's peak RSS grew by {growth:.0f} MiB"
