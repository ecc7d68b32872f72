"""Snappy codec and wire benchmark: every figure beside a baseline measured in the same run.

    .venv/bin/python benchmarks/codec.py [--quick]

1. Throughput per payload: the pooled codec against the bare cramjam ``*_raw_into`` calls it
   wraps (target: within 1.15x), against python-snappy, and against zlib level 6 (gRPC's gzip;
   target: snappy at least 10x faster on the JSON hits). Decompression into a pooled buffer
   against a fresh one.
2. tracemalloc: Python allocations per message in steady state for the leased API (target: no
   payload-sized allocation), beside the bytes-returning API as the baseline.
3. Loopback gRPC server streaming of the JSON hits: none vs gzip vs snappy, in messages/s and
   bytes on the wire (counted by a byte-counting TCP relay between client and server).

Bounded: each timing loop stops after a fixed time, the gRPC runs after a message count or
a time limit; the whole script takes about a minute (``--quick``: about 25 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import cramjam
import grpc
import numpy as np
import snappy
from grpc import aio
from rich.console import Console
from rich.table import Table

from ragguard.buffers import BufferPool, SnappyCodec
from ragguard.grpc import SnappyServerInterceptor, snappy_channel

console = Console(width=120)
WORDS = (
    "retrieval augmented generation vector store embedding rerank tenant quota breaker deadline "
    "latency document chunk passage query answer index cosine similarity dense sparse hybrid model "
    "context window token score relevance the of and to in is for that with on as by this from"
).split()


def text(rng: random.Random, n_bytes: int) -> str:
    out: list[str] = []
    size = 0
    while size < n_bytes:
        word = rng.choice(WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:n_bytes]


def payloads() -> dict[str, bytes]:
    rng = random.Random(42)
    hits = [
        {
            "id": f"doc-{rng.randrange(10**6):06d}#{i}",
            "score": round(rng.random(), 6),
            "source": f"s3://corpus/{rng.randrange(1000)}.md",
            "text": text(rng, 1500),
        }
        for i in range(20)
    ]
    emb = np.random.default_rng(42).standard_normal((32, 768)).astype(np.float32)
    return {
        "json hits (20x1.5KB)": json.dumps({"hits": hits}).encode(),
        "float32 emb 32x768": emb.tobytes(),
        "token chunk ~130B": text(rng, 130).encode(),
        "1 MB text": text(rng, 1 << 20).encode(),
    }


def _calls_per_round(fn: Callable[[], object], round_s: float) -> int:
    n = 1
    while True:  # doubles until a round lasts round_s (bounded by 2**20 calls)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t0 >= round_s or n >= 1 << 20:
            return n
        n *= 2


def per_call_s(*fns: Callable[[], object], budget_s: float) -> list[float]:
    """Best mean seconds per call of each of ``fns``, measured in interleaved rounds.

    Interleaving matters on a shared machine: a load spike then hits every contender of the
    same row, not just the one that happened to be running, so the ratios stay honest.
    """
    sizes = [_calls_per_round(fn, budget_s / 12) for fn in fns]
    best = [float("inf")] * len(fns)
    for _ in range(5):
        for i, (fn, n) in enumerate(zip(fns, sizes, strict=True)):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t0) / n)
    return best


def throughput(budget_s: float) -> None:
    codec = SnappyCodec(pool=BufferPool(), max_message_bytes=8 << 20)
    raw: Any = cramjam.snappy
    table = Table(title="1. throughput, MB/s of uncompressed bytes (ratio in brackets)")
    for col in (
        "payload",
        "size",
        "bare cramjam into",
        "pooled codec",
        "python-snappy",
        "zlib-6 (gzip)",
        "snappy/zlib",
        "ratio snappy / zlib",
    ):
        table.add_column(col, justify="right")
    dtable = Table(title="   decompression, MB/s")
    for col in (
        "payload",
        "bare into reused",
        "pooled codec",
        "into fresh buffer",
        "python-snappy",
        "zlib",
        "pooled/fresh",
    ):
        dtable.add_column(col, justify="right")
    for name, data in payloads().items():
        n = len(data)
        out = bytearray(raw.compress_raw_max_len(data))
        block = snappy.compress(data)
        dst = bytearray(n)
        zblock = zlib.compress(data, 6)

        def pooled_compress(data: bytes = data) -> None:
            with codec.compressed(data):
                pass

        def pooled_decompress(block: bytes = block) -> None:
            with codec.decompressed(block):
                pass

        def fresh_decompress(block: bytes = block, n: int = n) -> None:
            raw.decompress_raw_into(block, bytearray(n))

        c_bare, c_pool, c_snappy, c_zlib = per_call_s(
            lambda data=data, out=out: raw.compress_raw_into(data, out),
            pooled_compress,
            lambda data=data: snappy.compress(data),
            lambda data=data: zlib.compress(data, 6),
            budget_s=budget_s * 4,
        )
        d_bare, d_pool, d_fresh, d_snappy, d_zlib = per_call_s(
            lambda block=block, dst=dst: raw.decompress_raw_into(block, dst),
            pooled_decompress,
            fresh_decompress,
            lambda block=block: snappy.decompress(block),
            lambda zblock=zblock: zlib.decompress(zblock),
            budget_s=budget_s * 5,
        )

        def mbs(sec: float, n: int = n) -> str:
            return f"{n / sec / 1e6:,.0f}"

        table.add_row(
            name,
            f"{n:,}",
            mbs(c_bare),
            f"{mbs(c_pool)} [{c_pool / c_bare:.2f}x time, {(c_pool - c_bare) * 1e9:+,.0f} ns]",
            mbs(c_snappy),
            mbs(c_zlib),
            f"{c_zlib / c_pool:.1f}x",
            f"{n / len(block):.2f} / {n / len(zblock):.2f}",
        )
        dtable.add_row(
            name,
            mbs(d_bare),
            f"{mbs(d_pool)} [{d_pool / d_bare:.2f}x time, {(d_pool - d_bare) * 1e9:+,.0f} ns]",
            mbs(d_fresh),
            mbs(d_snappy),
            mbs(d_zlib),
            f"{d_fresh / d_pool:.2f}x faster",
        )
    console.print(table)
    console.print(dtable)
    console.print(
        "   targets: pooled codec within 1.15x of bare cramjam (the [..x time] column; +ns is the "
        "fixed per-call cost of the lease, about 0.7 us even for a bare-minimum Python wrapper, "
        "so small messages cannot meet 1.15x); snappy/zlib >= 10x on the JSON hits"
    )


def steady_state_allocations() -> None:
    data = payloads()["json hits (20x1.5KB)"]
    codec = SnappyCodec(pool=BufferPool())
    rounds = 2000

    def measure(step: Callable[[], object]) -> tuple[float, int]:
        for _ in range(50):  # warm the pool
            step()
        tracemalloc.start()
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        snap_before = tracemalloc.take_snapshot()
        for _ in range(rounds):
            step()
        _, peak = tracemalloc.get_traced_memory()
        snap_after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(s.size_diff for s in snap_after.compare_to(snap_before, "filename") if s.size_diff > 0)
        return grown / rounds, peak - base

    def leased() -> None:
        with codec.compressed(data) as out, codec.decompressed(out):
            pass

    def returning_bytes() -> None:
        codec.decompress(codec.compress(data))

    table = Table(title=f"2. tracemalloc, {rounds} compress+decompress rounds of {len(data):,} B JSON hits")
    for col in ("API", "peak above start, B", "retained per round, B", "payload-sized alloc per msg?"):
        table.add_column(col, justify="right")
    for name, step in (("leased (pooled views)", leased), ("bytes-returning (baseline)", returning_bytes)):
        retained, peak = measure(step)
        table.add_row(name, f"{peak:,}", f"{retained:,.1f}", "yes" if peak >= len(data) // 4 else "no")
    console.print(table)


class CountingRelay:
    """A loopback TCP relay that counts the bytes the server sends to the client."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.down_bytes = 0
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: bool) -> None:
            try:
                while chunk := await src.read(1 << 16):
                    if count:
                        self.down_bytes += len(chunk)
                    dst.write(chunk)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True))

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def grpc_streaming(messages: int, limit_s: float) -> None:
    payload = payloads()["json hits (20x1.5KB)"]

    async def stream(request: bytes, context: aio.ServicerContext[bytes, bytes]) -> Any:
        if request == b"gzip":
            context.set_compression(grpc.Compression.Gzip)
        for _ in range(messages):
            yield payload

    server = aio.server(interceptors=[SnappyServerInterceptor()])
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "bench.S", {"Hits": grpc.unary_stream_rpc_method_handler(stream)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    results: dict[str, tuple[float, int, int]] = {}
    try:
        for mode in ("none", "gzip", "snappy"):
            relay = CountingRelay(port)
            relay_port = await relay.start()
            channel: Any = aio.insecure_channel(f"127.0.0.1:{relay_port}")
            if mode == "snappy":
                channel = snappy_channel(channel)
            try:
                await channel.unary_stream("/bench.S/Hits")(b"warm").read()
                relay.down_bytes = 0
                got = 0
                t0 = time.perf_counter()
                call = channel.unary_stream("/bench.S/Hits")(mode.encode())
                async for message in call:
                    got += 1
                    if len(message) != len(payload):
                        raise AssertionError(f"{mode}: message of {len(message)} bytes")
                    if time.perf_counter() - t0 > limit_s:
                        call.cancel()
                        break
                elapsed = time.perf_counter() - t0
                results[mode] = (got / elapsed, relay.down_bytes, got)
            finally:
                await channel.close()
                await relay.close()
    finally:
        await server.stop(None)

    base_rate, base_bytes, _ = results["none"]
    table = Table(title=f"3. loopback gRPC server streaming, {len(payload):,} B JSON-hits messages")
    for col in ("wire encoding", "messages", "msgs/s", "vs none", "bytes on wire / msg", "vs none"):
        table.add_column(col, justify="right")
    for mode, (rate, wire, got) in results.items():
        table.add_row(
            mode,
            f"{got:,}",
            f"{rate:,.0f}",
            f"{rate / base_rate:.2f}x",
            f"{wire / got:,.0f}",
            f"{(wire / got) / (base_bytes / results['none'][2]):.2f}x",
        )
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter timing loops (about 20 s)")
    args = parser.parse_args()
    budget = 0.12 if args.quick else 0.3
    console.print(
        f"python {sys.version.split()[0]}, cramjam {cramjam.__version__}, grpcio {grpc.__version__}"
    )
    throughput(budget)
    steady_state_allocations()
    asyncio.run(grpc_streaming(messages=2000 if args.quick else 6000, limit_s=2.0 if args.quick else 4.0))


if __name__ == "__main__":
    main()
