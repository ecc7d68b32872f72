"""Snappy codec and wire benchmark: every figure beside its baseline, measured in the same
interleaved run (benchmarks/_bench.py).

    .venv/bin/python benchmarks/codec.py [--quick] [--rounds 9]

1. Time per message, compressing and decompressing four payloads (a 130-byte token chunk, a
   32x768 float32 embedding batch, 20 JSON search hits, 1 MB of text), each API of the codec
   beside the bare cramjam call that does the same work:

   - the leased API (``with codec.compressed(data) as block``: a pooled buffer, or one of its own
     for a small message) beside ``cramjam.snappy.compress_raw_into(data, out)`` into a buffer the
     caller keeps (the floor: no allocation at all). Both sides end with what the leased API hands
     over, a view of exactly the block or message: the bare call returns only a length, so it is
     followed by ``view[:n]`` of the kept buffer, and it decompresses into a kept buffer of the
     codec's ``max_message_bytes`` (a receiver does not know a message's length before reading
     its header; the buffer's length is then cramjam's own guard against a declared length above
     the limit), not into one of exactly the message's length;
   - the bytes API (``codec.compress(data) -> bytes``) beside ``bytes(cramjam.snappy.compress_raw(data))``
     (decompressing, also beside that call behind the least guard a safe receiver needs: the
     declared length read and checked against the limit first; the bare call has none);
   - and python-snappy, zlib level 1 and zlib level 6 (gRPC's gzip) for scale.

   Targets: each codec API at most 1.3x its bare cramjam call, at every size; snappy at least
   10x faster than zlib level 6 and 2x faster than zlib level 1 on the JSON hits (compressing).
2. tracemalloc: Python allocations per message in steady state for the leased API (target: no
   payload-sized allocation), beside the bytes-returning API as the baseline.
3. Loopback gRPC server streaming of the JSON hits: none vs gzip vs snappy, in messages/s and
   bytes on the wire (counted by a byte-counting TCP relay between client and server).

CPU time of this thread per message (median of rounds, spread min-max; ratios are medians of
per-round ratios). Payloads of 4 KiB and more are read from 8 copies whose addresses are spread over
a 4 KiB page, one after the other: a message arrives wherever the allocator put it, and on x86 a
copy whose destination lies a few dozen bytes past its source modulo 4 KiB runs at two thirds of its
speed ("4K aliasing"), so one fixed source address measures the luck of the allocator, not the
code (it made the pooled decompression of the float32 batch look 1.7x the bare call). The whole
script takes about a minute (``--quick``: about 25 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import itertools
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
from rich.table import Table

import _bench
from _bench import Contender, Target
from ragguard.buffers import BufferPool, SnappyCodec
from ragguard.grpc import SnappyServerInterceptor, snappy_channel

console = _bench.console
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
        "token chunk ~130B": text(rng, 130).encode(),
        "float32 emb 32x768": emb.tobytes(),
        "json hits (20x1.5KB)": json.dumps({"hits": hits}).encode(),
        "1 MB text": text(rng, 1 << 20).encode(),
    }


JSON = "json hits (20x1.5KB)"
SPREAD_FROM = 4096  # payloads from this size on are read from copies at spread addresses


def spread(data: bytes, k: int = 8) -> list[bytes]:
    """``k`` equal copies of ``data`` whose contents start at addresses spread over a 4 KiB page
    (one per eighth of it), for payloads of SPREAD_FROM bytes and more; else ``[data]``."""
    if len(data) < SPREAD_FROM:
        return [data]
    chosen: dict[int, bytes] = {}
    made: list[bytes] = []
    for _ in range(256):
        copy = bytes(bytearray(data))  # a new object at wherever the allocator puts it
        made.append(copy)  # (kept alive while choosing, so addresses are not reused)
        slot = (ctypes.cast(ctypes.c_char_p(copy), ctypes.c_void_p).value or 0) % 4096 * k // 4096
        chosen.setdefault(slot, copy)
        if len(chosen) == k:
            break
    return list(chosen.values())


def rotating(copies: list[bytes]) -> Callable[[], bytes]:
    """The copies one after the other, one per call."""
    if len(copies) == 1:
        only = copies[0]
        return lambda: only
    return itertools.cycle(copies).__next__


def _ops(size: int, quick: bool) -> int:
    """Messages per contender per round: about 5 ms of the bare call's work."""
    ops = max(5, min(5000, 4_000_000 // max(size, 1)))
    return max(5, ops // 3) if quick else ops


def throughput(rounds: int, quick: bool) -> list[Target]:
    codec = SnappyCodec(pool=BufferPool(), max_message_bytes=8 << 20)
    raw: Any = cramjam.snappy
    dst = bytearray(codec.max_message_bytes)  # kept: any message the codec accepts fits
    dst_view = memoryview(dst)
    limit = codec.max_message_bytes

    def guarded_decompress(block: bytes) -> bytes:
        # the least a safe receiver does: refuse a declared length above the limit before
        # cramjam allocates it (for scale: the bare bytes call would allocate what a block claims)
        if raw.decompress_raw_len(block) > limit:
            raise ValueError("declared length above the limit")
        return bytes(raw.decompress_raw(block))

    targets: list[Target] = []
    sizes = Table(title="   compressed size (ratio of the payload to it)")
    for col in ("payload", "bytes", "snappy", "zlib level 1", "zlib level 6"):
        sizes.add_column(col, justify="right")
    for name, data in payloads().items():
        n = len(data)
        out = bytearray(raw.compress_raw_max_len(data))
        out_view = memoryview(out)
        block = snappy.compress(data)
        z1, z6 = zlib.compress(data, 1), zlib.compress(data, 6)
        sizes.add_row(name, f"{n:,}", *(f"{n / len(b):.2f}" for b in (block, z1, z6)))
        msg, blk = rotating(spread(data)), rotating(spread(block))
        zb1, zb6 = rotating(spread(z1)), rotating(spread(z6))

        def leased_compress(msg: Callable[[], bytes] = msg) -> None:
            with codec.compressed(msg()):
                pass

        def leased_decompress(blk: Callable[[], bytes] = blk) -> None:
            with codec.decompressed(blk()):
                pass

        compressors = [
            Contender("bare cramjam, into", "view[:compress_raw_into(data, out)]: a buffer the caller keeps",
                      lambda msg=msg, out=out, view=out_view: view[: raw.compress_raw_into(msg(), out)]),
            Contender("codec, leased", "with codec.compressed(data) as block", leased_compress),
            Contender("bare cramjam, bytes", "bytes(compress_raw(data))",
                      lambda msg=msg: bytes(raw.compress_raw(msg()))),
            Contender("codec, bytes", "codec.compress(data)", lambda msg=msg: codec.compress(msg())),
            Contender("python-snappy", "snappy.compress(data)", lambda msg=msg: snappy.compress(msg())),
            Contender("zlib level 1", "zlib.compress(data, 1)", lambda msg=msg: zlib.compress(msg(), 1)),
            Contender("zlib level 6", "zlib.compress(data, 6) (gRPC's gzip)",
                      lambda msg=msg: zlib.compress(msg(), 6)),
        ]  # fmt: skip
        decompressors = [
            Contender("bare cramjam, into", "view[:decompress_raw_into(block, dst)]: a kept max-size buffer",
                      lambda blk=blk: dst_view[: raw.decompress_raw_into(blk(), dst)]),
            Contender("codec, leased", "with codec.decompressed(block) as message", leased_decompress),
            Contender("bare cramjam, bytes", "bytes(decompress_raw(block))",
                      lambda blk=blk: bytes(raw.decompress_raw(blk()))),
            Contender("bare cramjam, bytes, guarded", "the same after decompress_raw_len(block) <= limit",
                      lambda blk=blk: guarded_decompress(blk())),
            Contender("codec, bytes", "codec.decompress(block)", lambda blk=blk: codec.decompress(blk())),
            Contender("python-snappy", "snappy.decompress(block)", lambda blk=blk: snappy.decompress(blk())),
            Contender("zlib level 1", "zlib.decompress of a level-1 stream", lambda zb1=zb1: zlib.decompress(zb1())),
            Contender("zlib level 6", "zlib.decompress of a level-6 stream", lambda zb6=zb6: zlib.decompress(zb6())),
        ]  # fmt: skip
        ops = _ops(n, quick)
        for verb, contenders in (("compress", compressors), ("decompress", decompressors)):
            results = _bench.run_sync(contenders, ops=ops, rounds=rounds)
            _bench.print_table(results, f"1. {verb} {name} ({n:,} B)",
                               against=["bare cramjam, into", "bare cramjam, bytes"], unit="message")  # fmt: skip
            targets.append(_bench.ratio_target(results, f"{verb} {name}: leased codec vs bare cramjam into",
                                               "codec, leased", "bare cramjam, into", 1.3))  # fmt: skip
            targets.append(_bench.ratio_target(results, f"{verb} {name}: codec bytes vs bare cramjam bytes",
                                               "codec, bytes", "bare cramjam, bytes", 1.3))  # fmt: skip
            if name == JSON and verb == "compress":
                for level, at_least in (("zlib level 6", 10.0), ("zlib level 1", 2.0)):
                    targets.append(_bench.ratio_target(
                        results, f"compress {name}: {level} vs the leased codec (snappy faster)", level,
                        "codec, leased", at_least, at_least=True,
                    ))  # fmt: skip
    console.print(sizes)
    return targets


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages per round (about 25 s)")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    _bench.header()
    console.print(f"cramjam {cramjam.__version__}, grpcio {grpc.__version__}", markup=False)
    targets = throughput(args.rounds, args.quick)
    steady_state_allocations()
    asyncio.run(grpc_streaming(messages=2000 if args.quick else 6000, limit_s=2.0 if args.quick else 4.0))
    _bench.print_targets(targets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
