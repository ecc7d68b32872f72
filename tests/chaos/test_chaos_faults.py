"""Each fault kind at the injection point, shown on a real component where one applies."""

from __future__ import annotations

import asyncio
import errno
import random
import socket
import statistics
import time

import cramjam
import grpc
import pytest
import redis
import redis.asyncio as aredis

from ragguard import ConfigError, FakeClock, _inject
from ragguard.breakers import is_connection_error, is_out_of_memory, is_timeout
from ragguard.chaos import (
    BlockLoop,
    Chaos,
    CorruptPayload,
    EmptyResults,
    Error,
    FaultInjected,
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
from ragguard.chaos._faults import make_error
from ragguard.events import bus

pytestmark = pytest.mark.timeout(30)
anyio = pytest.mark.anyio


async def _through(stage: str, call, tenant: str = "default"):
    """What a guarded call does: hand the attempt to the installed injector."""
    injector = _inject.active
    if injector is None:
        return await call()
    return await injector(stage, tenant, call)


def _counter():
    calls = []

    async def call():
        calls.append(1)
        return ["a", "b", "c", "d"]

    return calls, call


# -- the chaos fixture and the injector protocol ------------------------------------------------


def test_chaos_fixture_installs_the_injector(chaos) -> None:
    assert _inject.active is chaos
    chaos.disable()
    assert _inject.active is None  # disabled: guarded calls check `active is None` and pay nothing
    chaos.enable()
    assert _inject.active is chaos


def test_close_uninstalls_and_removes_faults() -> None:
    c = Chaos(rng=random.Random(1)).install()
    c.inject(Latency(0.1), stage="embed")
    c.close()
    assert _inject.active is None
    assert c.faults == ()


@anyio
async def test_handle_remove_and_context_manager(chaos) -> None:
    calls, call = _counter()
    with chaos.inject(Error(kind="connection_refused"), stage="search") as handle:
        with pytest.raises(ConnectionRefusedError):
            await _through("search", call)
        assert handle.injected == 1
    assert not handle.active
    assert await _through("search", call) == ["a", "b", "c", "d"]
    assert calls == [1]


@anyio
async def test_targets_stage_and_tenant(chaos) -> None:
    _, call = _counter()
    chaos.inject(Error(kind="connection_reset"), stage="search", tenant="acme")
    assert await _through("search", call, tenant="globex") == ["a", "b", "c", "d"]
    assert await _through("embed", call, tenant="acme") == ["a", "b", "c", "d"]
    with pytest.raises(ConnectionResetError):
        await _through("search", call, tenant="acme")
    chaos.inject(Latency(0.0), stage=["embed", "rerank"])
    assert chaos.faults[-1].matches("rerank", "x") and not chaos.faults[-1].matches("search", "x")


def test_injection_rate_is_seeded_and_close_to_the_rate() -> None:
    def hits(seed: int) -> list[int]:
        c = Chaos(rng=random.Random(seed))
        h = c.inject(Error(kind="timeout", injection_rate=0.3))
        out = []

        async def run() -> None:
            async def ok() -> int:
                return 1

            for i in range(1000):
                try:
                    await c("s", "t", ok)
                except TimeoutError:
                    out.append(i)

        asyncio.run(run())
        assert h.injected == len(out)
        return out

    first, again, other = hits(42), hits(42), hits(43)
    assert first == again
    assert first != other
    assert 240 <= len(first) <= 360


@anyio
async def test_enabled_switch_and_rate_zero(chaos) -> None:
    calls, call = _counter()
    fault = Error(kind="memory")
    chaos.inject(fault, stage="rerank")
    fault.enabled = False
    assert await _through("rerank", call)
    fault.enabled = True
    fault.injection_rate = 0.0
    assert await _through("rerank", call)
    assert len(calls) == 2


@anyio
async def test_schedule_windows_follow_the_injected_clock(chaos) -> None:
    clock = FakeClock()
    _, call = _counter()
    chaos.inject(Error(kind="connection_refused", schedule=Schedule([(10, 20)], clock=clock)))
    assert await _through("search", call)
    clock.advance(10)
    with pytest.raises(ConnectionRefusedError):
        await _through("search", call)
    clock.advance(10)
    assert await _through("search", call)

    flapping = Schedule([(0, 1)], clock=clock, period_s=5)
    assert [flapping.active(clock() + t) for t in (0, 0.5, 1, 4.9, 5, 5.5, 6)] == [
        True, True, False, False, True, True, False]


def test_bad_options_name_the_field() -> None:
    with pytest.raises(ConfigError, match="injection_rate"):
        Latency(1.0, injection_rate=1.5)
    with pytest.raises(ConfigError, match="exactly one"):
        Latency()
    with pytest.raises(ConfigError, match="unknown error kind 'nope'"):
        Error(kind="nope")
    with pytest.raises(ConfigError, match="to_s"):
        Schedule([(5, 1)])
    with pytest.raises(ConfigError, match="median_s"):
        Latency.long_tail(median_s=2, p99_s=1)
    with pytest.raises(ConfigError, match="stage"):
        Chaos().inject(Latency(0), stage="")
    with pytest.raises(ConfigError, match="fault"):
        Chaos().inject("latency")  # type: ignore[arg-type]


# -- latency, hang, timeout ---------------------------------------------------------------------


@anyio
async def test_latency_delays_a_real_redis_call(chaos, redis_server) -> None:
    client = aredis.Redis.from_url(redis_server.url)
    await client.ping()
    chaos.inject(Latency(0.15), stage="embed")
    t0 = time.perf_counter()
    assert await _through("embed", client.ping)
    slowed = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert await _through("search", client.ping)
    plain = time.perf_counter() - t0
    await client.aclose()
    assert slowed >= 0.15
    assert plain < 0.1


def test_long_tail_distribution_has_the_median_and_tail_asked_for() -> None:
    fault = Latency.long_tail(median_s=0.05, p99_s=3.0)
    rng = random.Random(5)
    draws = sorted(fault.delay_s(rng) for _ in range(20_000))
    assert 0.045 <= statistics.median(draws) <= 0.055
    p99 = draws[int(0.99 * len(draws))]
    assert 2.4 <= p99 <= 3.6
    assert max(draws) <= 30.0


@anyio
async def test_hang_waits_until_cancelled_and_never_runs_the_call(chaos) -> None:
    calls, call = _counter()
    chaos.inject(Hang(), stage="embed")
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(_through("embed", call), 0.1)
    assert 0.09 <= time.perf_counter() - t0 < 1.0
    assert calls == []


@anyio
async def test_timeout_raises_a_timeout_the_breakers_classify(chaos) -> None:
    calls, call = _counter()
    chaos.inject(Timeout(after_s=0.05), stage="embed")
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError) as info:
        await _through("embed", call)
    assert time.perf_counter() - t0 >= 0.05
    assert is_timeout(info.value)
    assert calls == []


# -- errors ---------------------------------------------------------------------------------------


def test_typed_errors_are_what_real_code_raises_and_the_breakers_classify_them() -> None:
    with socket.socket() as s:  # a real refused connection, for its errno
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionRefusedError) as real:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    refused = make_error("connection_refused")
    assert type(refused) is type(real.value) and refused.errno == real.value.errno == errno.ECONNREFUSED
    assert make_error("connection_reset").errno == errno.ECONNRESET

    unavailable = make_error("grpc_unavailable")
    assert isinstance(unavailable, grpc.aio.AioRpcError)
    assert unavailable.code() == grpc.StatusCode.UNAVAILABLE
    assert make_error("grpc_deadline_exceeded").code() == grpc.StatusCode.DEADLINE_EXCEEDED

    for kind in ("connection_refused", "connection_reset", "grpc_unavailable"):
        assert is_connection_error(make_error(kind)), kind
    for kind in ("grpc_deadline_exceeded", "timeout"):
        assert is_timeout(make_error(kind)), kind
    for kind in ("memory", "cuda_oom"):
        assert is_out_of_memory(make_error(kind)), kind
    assert isinstance(make_error("memory"), MemoryError)
    assert "CUDA out of memory" in str(make_error("cuda_oom"))


@anyio
async def test_given_exception_class_instance_and_factory(chaos) -> None:
    calls, call = _counter()
    h = chaos.inject(Error(KeyError), stage="a")
    with pytest.raises(KeyError):
        await _through("a", call)
    h.remove()
    original = ValueError("bad")
    h = chaos.inject(Error(original), stage="a")
    with pytest.raises(ValueError, match="bad") as info:
        await _through("a", call)
    assert info.value is not original  # a fresh copy each time
    h.remove()
    chaos.inject(Error(lambda: redis.ConnectionError("gone")), stage="a")
    with pytest.raises(redis.ConnectionError):
        await _through("a", call)
    assert calls == []


@anyio
async def test_error_after_call_loses_the_reply_of_a_real_write(chaos, redis_server) -> None:
    client = aredis.Redis.from_url(redis_server.url)
    chaos.inject(Error(kind="connection_reset", after_call=True), stage="store")
    with pytest.raises(ConnectionResetError):
        await _through("store", lambda: client.set("written", "yes"))
    chaos.clear()
    assert await client.get("written") == b"yes"  # the side effect happened
    await client.aclose()


@anyio
async def test_min_batch_targets_big_batches_only(chaos) -> None:
    _, call = _counter()
    chaos.inject(Error(kind="cuda_oom", min_batch=32), stage="rerank")
    with batch_size(8):
        assert await _through("rerank", call)
    assert await _through("rerank", call)  # size unknown: not a big batch
    with batch_size(64), pytest.raises(RuntimeError, match="CUDA out of memory"):
        await _through("rerank", call)


# -- outcomes -------------------------------------------------------------------------------------


@anyio
async def test_partial_empty_and_stale_results_from_a_real_store(chaos, redis_server) -> None:
    client = aredis.Redis.from_url(redis_server.url)
    await client.rpush("hits", *[f"doc{i}" for i in range(10)])

    async def search():
        return await client.lrange("hits", 0, -1)

    h = chaos.inject(PartialResults(keep=0.3), stage="search")
    assert await _through("search", search) == [b"doc0", b"doc1", b"doc2"]
    h.remove()
    h = chaos.inject(PartialResults(max_hits=20), stage="search")
    assert len(await _through("search", search)) == 9  # always fewer than the real answer
    h.remove()

    h = chaos.inject(EmptyResults(), stage="search")
    assert await _through("search", search) == []
    h.remove()

    stale = StaleResults(injection_rate=0.0)
    h = chaos.inject(stale, stage="search")
    first = await _through("search", search)  # observed while not firing
    await client.rpush("hits", "doc10")
    stale.injection_rate = 1.0
    assert await _through("search", search) == first  # the old answer, not the new 11 hits
    h.remove()
    assert len(await _through("search", search)) == 11
    await client.aclose()


@anyio
async def test_corrupt_payload_breaks_a_real_codec(chaos) -> None:
    payload = bytes(cramjam.snappy.compress(b"the quick brown fox " * 200))

    async def fetch() -> bytes:
        return payload

    h = chaos.inject(CorruptPayload(flips=3), stage="fetch")
    flipped = await _through("fetch", fetch)
    assert len(flipped) == len(payload) and flipped != payload
    with pytest.raises(cramjam.DecompressionError):
        cramjam.snappy.decompress(flipped)
    h.remove()
    chaos.inject(CorruptPayload(flips=0, truncate_to=0.5), stage="fetch")
    cut = await _through("fetch", fetch)
    assert cut == payload[: len(payload) // 2]
    with pytest.raises(cramjam.DecompressionError):
        cramjam.snappy.decompress(cut)
    assert bytes(cramjam.snappy.decompress(payload)).startswith(b"the quick")


def test_corrupt_bytes_flips_exactly_n_bits() -> None:
    data = bytes(range(256)) * 4
    out = corrupt_bytes(data, random.Random(3), flips=5)
    diff = sum(bin(a ^ b).count("1") for a, b in zip(data, out, strict=True))
    assert 1 <= diff <= 5 and diff % 2 == 1  # repeated positions cancel in pairs
    assert corrupt_bytes(b"", random.Random(0), flips=3) == b""


# -- behaviour ------------------------------------------------------------------------------------


@anyio
async def test_block_loop_stalls_every_task_on_a_real_loop(chaos) -> None:
    gaps: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        for _ in range(500):  # bounded
            if stop.is_set():
                return
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.03)
    _, call = _counter()
    chaos.inject(BlockLoop(ms=150), stage="rerank")
    t0 = time.perf_counter()
    await _through("rerank", call)
    assert time.perf_counter() - t0 >= 0.15
    await asyncio.sleep(0.03)
    stop.set()
    await task
    assert max(gaps) >= 0.14


@anyio
async def test_hold_connections_exhausts_a_real_redis_pool(chaos, redis_server) -> None:
    pool = aredis.BlockingConnectionPool.from_url(redis_server.url, max_connections=3, timeout=0.2)
    client = aredis.Redis(connection_pool=pool)
    assert await client.ping()
    hold = HoldConnections(pool, 3)
    h = chaos.inject(hold, stage="search")
    _, call = _counter()
    await _through("search", call)  # the first hit takes the three connections
    assert len(hold.held) == 3
    t0 = time.perf_counter()
    with pytest.raises(redis.ConnectionError) as info:
        await client.ping()
    assert time.perf_counter() - t0 >= 0.19
    assert is_connection_error(info.value)
    await hold.release_async()
    h.remove()
    assert await client.ping()
    await client.aclose()
    await pool.aclose()


@anyio
async def test_hold_connections_as_a_context_manager_on_a_plain_pool(redis_server) -> None:
    pool = aredis.ConnectionPool.from_url(redis_server.url, max_connections=2)
    client = aredis.Redis(connection_pool=pool)
    async with HoldConnections(pool, 2):
        with pytest.raises(redis.ConnectionError, match="Too many connections"):
            await client.ping()
    assert await client.ping()
    await client.aclose()
    await pool.aclose()


@anyio
async def test_fault_injected_events_reach_the_bus(chaos) -> None:
    seen: list[FaultInjected] = []
    unsubscribe = bus.subscribe(lambda e: seen.append(e) if isinstance(e, FaultInjected) else None)
    try:
        _, call = _counter()
        chaos.inject(Latency(0.0), stage="embed", tenant="acme")
        await _through("embed", call, tenant="acme")
        await asyncio.sleep(0)  # events are delivered on the next loop iteration
    finally:
        unsubscribe()
    assert seen == [FaultInjected("embed", "acme", "latency")]


@anyio
async def test_min_batch_reads_the_batch_from_a_guarded_call(chaos) -> None:
    """@guard hands the injector functools.partial(fn, *args): the longest list is the batch."""
    import ragguard

    guard = ragguard.Guard(ragguard.Policy())

    @guard.guard("rerank")
    async def rerank(query: str, docs: list[str]) -> list[str]:
        return sorted(docs)

    handle = chaos.inject(Error(kind="cuda_oom", min_batch=16), stage="rerank")
    assert await rerank("q", ["b", "a"]) == ["a", "b"]
    assert handle.injected == 0
    docs = [f"{i:02d}" for i in range(16)]
    # The big batch hits the OOM; the rerank stage's own fallback (a smaller batch) still answers.
    result = await rerank("q", docs)
    assert handle.injected >= 1
    assert result == sorted(result) and set(result) <= set(docs) and len(result) >= 1
    assert ragguard.degraded()  # served by the fallback, and it says so
