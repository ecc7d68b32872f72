"""diagnose() and `ragguard doctor`: the correlation rules, the event file, and two real incidents."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from ragguard import ConfigError, events
from ragguard.monitors import (
    ConnectionLeak,
    EventRecorder,
    LoopStall,
    MonitoredBlockingConnectionPool,
    PoolExhausted,
    StallDetector,
    diagnose,
    doctor_main,
    load_records,
)


def _stall(start: float, end: float, frame: str = "app.py:12 in handler") -> LoopStall:
    return LoopStall(end - start, start, end, frame, "app.py", 12, "handler", (frame, "app.py:40 in main"), 9)


def _pool(reason: str, start: float, end: float, pool: str = "p") -> PoolExhausted:
    return PoolExhausted(pool, reason, 10, 0, 10, 4, end - start, start, end)


def _kinds(result: Any) -> list[str]:
    return [f.kind for f in result.findings]


def test_stall_overlapping_pool_waits_blames_the_loop() -> None:
    result = diagnose([_stall(10.0, 10.2), _pool("slow_acquire", 10.05, 10.25)])
    assert _kinds(result) == ["stall_delayed_pool"]
    (f,) = result.findings
    assert "the loop was blocked in app.py:12 in handler" in f.summary
    assert "pool releases were delayed" in f.summary
    assert f.details[0] == "at app.py:12 in handler"


def test_exhaustion_without_stall_says_pool_too_small_or_leak() -> None:
    result = diagnose([_stall(1.0, 1.1), _pool("headroom", 5.0, 5.0), _pool("timeout", 6.0, 7.0)])
    assert _kinds(result) == ["pool_exhausted", "loop_stall"]
    f = result.findings[0]
    assert "too small for this concurrency, or connections leak" in f.summary
    assert f.data["count"] == 2 and f.data["reasons"] == ["headroom", "timeout"]


def test_leak_shows_the_acquiring_stack() -> None:
    leak = ConnectionLeak("p", 42.0, 1.0, 43.0, ("svc.py:7 in fetch", "svc.py:30 in handle"))
    (f,) = diagnose([leak]).findings
    assert f.kind == "connection_leak"
    assert "acquired at svc.py:7 in fetch" in f.summary
    assert f.details == ("at svc.py:7 in fetch", "at svc.py:30 in handle")


def test_breaker_opening_after_a_stall_blames_our_latency_within_grace() -> None:
    stall = _stall(3.0, 3.4)
    soon = events.BreakerTransition("vector_store", "closed", "open", 3.6)
    late = events.BreakerTransition("embedding", "closed", "open", 9.0)
    result = diagnose([stall, soon, late], grace_s=1.0)
    assert _kinds(result) == ["breaker_opened_during_stall"]
    assert "'vector_store' opened while the loop was stalled" in result.findings[0].summary
    assert "the latency was ours" in result.findings[0].summary
    assert _kinds(diagnose([stall, soon], grace_s=0.1)) == ["loop_stall"]


def test_quiet_events_are_healthy_and_bad_grace_is_rejected() -> None:
    result = diagnose([events.BreakerTransition("b", "open", "closed", 1.0)])
    assert result.healthy and result.to_dict()["findings"] == []
    assert "0 finding(s)" in result.to_text()
    with pytest.raises(ConfigError):
        diagnose([], grace_s=-1)


def test_stalls_are_grouped_by_frame() -> None:
    result = diagnose([_stall(1, 1.1), _stall(2, 2.3), _stall(4, 4.05, "other.py:3 in f")])
    assert [(f.data["frame"], f.data["count"]) for f in result.findings] == [
        ("app.py:12 in handler", 2), ("other.py:3 in f", 1)]  # fmt: skip


@pytest.mark.timeout(30)
def test_event_file_round_trip_and_doctor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "events.jsonl"
    bus = events.EventBus()

    async def main() -> None:
        with EventRecorder(path=path, bus=bus):
            bus.emit(_stall(10.0, 10.2))
            bus.emit(_pool("slow_acquire", 10.1, 10.3))
            bus.emit(events.CallOutcome("b", "success", 0.01))  # not a recorded kind
            await asyncio.sleep(0)

    asyncio.run(main())
    records = load_records(path)
    assert [r["type"] for r in records] == ["LoopStall", "PoolExhausted"]
    assert records[0]["stack"] == ["app.py:12 in handler", "app.py:40 in main"]

    assert doctor_main(["--events", str(path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["healthy"] is False
    assert [f["kind"] for f in out["findings"]] == ["stall_delayed_pool"]

    assert doctor_main(["--events", str(path)]) == 1
    assert "[critical] the loop was blocked in app.py:12 in handler" in capsys.readouterr().out

    assert doctor_main(["--events", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read events file" in capsys.readouterr().err

    empty = tmp_path / "empty.jsonl"
    empty.write_text("not json\n")
    assert doctor_main(["--events", str(empty)]) == 0


def test_recorder_ring_is_bounded_and_rotates_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ev.jsonl"
    rec = EventRecorder(maxlen=3, path=path, max_bytes=1024, kinds=None)
    for i in range(40):
        rec.record(events.QuotaRejected(f"t{i}", "rate", 0.5))
    assert [r["tenant"] for r in rec.records()] == ["t37", "t38", "t39"]
    assert path.with_name("ev.jsonl.1").exists() and path.stat().st_size <= 1024
    assert load_records(path)[-1]["tenant"] == "t39"
    with pytest.raises(ConfigError):
        EventRecorder(maxlen=0)


def _blocking_work_holding_a_connection() -> None:
    time.sleep(0.15)


@pytest.mark.timeout(30)
def test_real_stall_delays_real_pool_waits(redis_server: Any) -> None:
    bus = events.EventBus()
    recorder = EventRecorder(bus=bus).start()

    async def main() -> None:
        pool = MonitoredBlockingConnectionPool(
            host=redis_server.host,
            port=redis_server.port,
            max_connections=1,
            timeout=5,
            wait_threshold_s=0.05,
            bus=bus,
        )
        client = aioredis.Redis(connection_pool=pool)
        await client.ping()
        async with StallDetector(bus=bus):
            await asyncio.sleep(0.05)

            async def holder() -> None:
                conn = await pool.get_connection()
                try:
                    _blocking_work_holding_a_connection()
                finally:
                    await pool.release(conn)

            await asyncio.gather(holder(), client.set("k", "v"))
            for _ in range(3):
                await asyncio.sleep(0.01)
        await client.aclose()

    asyncio.run(main())
    result = diagnose(recorder.records())
    assert _kinds(result)[0] == "stall_delayed_pool", result.to_text()
    assert "_blocking_work_holding_a_connection" in result.findings[0].summary


@pytest.mark.timeout(30)
def test_real_breaker_opened_by_our_own_stall() -> None:
    breakers = pytest.importorskip("ragguard.breakers")
    recorder = EventRecorder()  # the breaker's bus forwards to the global bus

    def _hog_the_loop() -> None:
        time.sleep(0.12)

    async def main() -> None:
        breaker = breakers.CircuitBreaker(
            "vector_store",
            slow_call_rate_threshold=50.0,
            slow_call_duration_s=0.05,
            minimum_calls=1,
            window_size=1,
        )

        async def healthy_dependency() -> str:
            await asyncio.sleep(0.01)
            return "ok"

        with recorder:
            async with StallDetector():
                await asyncio.sleep(0.05)
                call = asyncio.create_task(breaker.call(healthy_dependency))
                await asyncio.sleep(0)
                _hog_the_loop()
                assert await call == "ok"
                for _ in range(3):
                    await asyncio.sleep(0.01)
        assert breaker.state.value == "open"

    asyncio.run(main())
    result = diagnose(recorder.records())
    assert "breaker_opened_during_stall" in _kinds(result), result.to_text()
    f = next(f for f in result.findings if f.kind == "breaker_opened_during_stall")
    assert "_hog_the_loop" in f.summary and "'vector_store'" in f.summary
