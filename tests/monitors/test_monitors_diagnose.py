"""diagnose() and `ragguard doctor`: the correlation rules, the event file, and two real incidents."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from monitors_helpers import Collected

from ragguard import BreakerOpen, ConfigError, FakeClock, InvalidInput, events
from ragguard.monitors import (
    ConnectionLeak,
    LoopStall,
    MonitoredBlockingConnectionPool,
    PoolExhausted,
    StallDetector,
)
from ragguard.monitors._record import EventRecorder, load_records
from ragguard_tools.doctor import diagnose, doctor_main


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


def test_breaker_opening_after_a_stall_without_latencies_is_a_possible_cause_within_grace() -> None:
    stall = _stall(3.0, 3.4)
    soon = events.BreakerTransition("vector_store", "closed", "open", 3.6)
    late = events.BreakerTransition("embedding", "closed", "open", 9.0)
    result = diagnose([stall, soon, late], grace_s=1.0)
    assert _kinds(result) == ["breaker_opened_during_stall", "breaker_open", "breaker_open"]
    f = result.findings[0]
    assert "'vector_store' opened 200 ms after a 400 ms loop stall in app.py:12 in handler" in f.summary
    assert "the latency may have been ours" in f.summary and "latencies were not recorded" in f.summary
    assert f.severity == "warning" and f.data["weighed"] is False  # a coincidence, not a weighed cause
    assert _kinds(diagnose([stall, soon], grace_s=0.1)) == ["breaker_open", "loop_stall"]


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
    assert [r["type"] for r in records] == ["LoopStall", "PoolExhausted", "Tally"]  # the call: counted
    assert records[0]["stack"] == ["app.py:12 in handler", "app.py:40 in main"]
    assert records[2]["calls"] == {"b": {"success": 1}}

    assert doctor_main(["--events", str(path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["healthy"] is False
    assert [f["kind"] for f in out["findings"]] == ["stall_delayed_pool"]

    assert doctor_main(["--events", str(path)]) == 1
    assert "[critical] the loop was blocked in app.py:12 in handler" in capsys.readouterr().out

    assert doctor_main(["--events", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read events file" in capsys.readouterr().err

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert doctor_main(["--events", str(empty)]) == 0
    not_json = tmp_path / "not-json.jsonl"
    not_json.write_text("not json\n")
    assert doctor_main(["--events", str(not_json)]) == 2
    assert "line 1: not a JSON record: 'not json'" in capsys.readouterr().err


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


# -- a stall is blamed only for trips by slow calls or timeouts (user report item 8) ------------------


def _opened(reason: str, **recorded: Any) -> dict[str, Any]:
    return {"type": "BreakerTransition", "t": 3.5, "at": 3.5, "wall": 0.0, "breaker": "vector_store",
            "old": "closed", "new": "open", "reason": reason, **recorded}  # fmt: skip


@pytest.mark.parametrize(
    ("opened", "blamed"),
    [
        (_opened("failure rate 100.0% >= 50.0%", causes={"connection": 7},
                 errors={"ConnectionRefusedError": 7}), False),
        (_opened("failure rate 100.0% >= 50.0%", causes={"timeout": 5, "connection": 1},
                 errors={"TimeoutError": 5, "ConnectionRefusedError": 1}), True),
        (_opened("slow-call rate 60.0% >= 50.0%"), True),
        (_opened("3 of 3 trial calls were slow"), True),
        (_opened("shared: ConnectionError: Connection refused"), False),
        (_opened("shared: TimeoutError"), True),
        (_opened(""), True),  # no cause recorded (an older file): the stall is the likelier story
    ],
    ids=["refused", "timeouts", "slow-rate", "slow-trials", "reason-connection", "reason-timeout", "unknown"],
)
def test_a_stall_is_blamed_only_for_a_trip_by_slowness_or_timeouts(
    opened: dict[str, Any], blamed: bool
) -> None:
    stall = {"type": "LoopStall", "t": 3.4, "wall": 0.0, "duration_s": 0.196, "started_at": 3.204, "at": 3.4,
             "frame": "app.py:1 in f"}  # fmt: skip
    result = diagnose([stall, opened])
    kinds = _kinds(result)
    assert ("breaker_opened_during_stall" in kinds) is blamed, result.to_text()
    assert ("loop_stall" in kinds) is not blamed  # an unblamed stall is still reported, on its own
    if "errors" in opened:
        (breaker,) = [f for f in result.findings if f.kind == "breaker_open"]
        assert f"closed -> open: {opened['reason']} ({_counted(opened['errors'])})" in breaker.details[0]


def _counted(errors: dict[str, int]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(errors.items(), key=lambda kv: -kv[1]))


@pytest.mark.timeout(30)
def test_a_breaker_opened_on_refused_connections_after_a_real_stall_is_not_blamed_on_it(
    tmp_path: Path,
) -> None:
    """The user's report: the vector-store breaker opened on ConnectionRefusedError 0.1 s after a
    196 ms stall, and doctor said the latency was ours."""
    breakers = pytest.importorskip("ragguard.breakers")
    path = tmp_path / "events.jsonl"
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def search() -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", port)  # refused
        writer.close()

    async def main() -> None:
        breaker = breakers.CircuitBreaker("vector_store", minimum_calls=3, window_size=3)
        with EventRecorder(path=path):
            async with StallDetector(threshold_s=0.05):
                await asyncio.sleep(0.05)
                time.sleep(0.2)  # the loop stalls
                await asyncio.sleep(0.01)
                for _ in range(3):
                    with pytest.raises(ConnectionRefusedError):
                        await breaker.call(search)
                await asyncio.sleep(0.01)
        assert breaker.state.value == "open"

    asyncio.run(main())
    records = load_records(path)
    (opened,) = [r for r in records if r["type"] == "BreakerTransition"]
    assert opened["causes"] == {"connection": 3} and opened["errors"] == {"ConnectionRefusedError": 3}
    result = diagnose(records)
    assert "breaker_opened_during_stall" not in _kinds(result), result.to_text()
    assert set(_kinds(result)) == {"breaker_open", "loop_stall"}
    assert "(ConnectionRefusedError 3)" in result.findings[0].details[0]


@pytest.mark.timeout(30)
def test_a_breaker_opened_on_timeouts_after_a_real_stall_is_blamed_on_it(tmp_path: Path) -> None:
    breakers = pytest.importorskip("ragguard.breakers")

    async def search() -> None:  # a healthy dependency: 10 ms, well inside its 50 ms timeout
        async with asyncio.timeout(0.05):
            await asyncio.sleep(0.01)

    recorder = EventRecorder()

    async def main() -> None:
        breaker = breakers.CircuitBreaker("vector_store", minimum_calls=3, window_size=3)
        with recorder:
            async with StallDetector(threshold_s=0.05):
                await asyncio.sleep(0.05)
                calls = [asyncio.create_task(breaker.call(search)) for _ in range(3)]
                await asyncio.sleep(0)  # the three calls are in flight
                time.sleep(0.2)  # the loop stalls: both the sleeps and the timeouts are due after it
                for call in calls:
                    with pytest.raises(TimeoutError):
                        await call
                await asyncio.sleep(0.01)

    asyncio.run(main())
    (opened,) = [r for r in recorder.records() if r["type"] == "BreakerTransition"]
    assert opened["causes"] == {"timeout": 3} and len(opened["latencies"]) == 3
    result = diagnose(recorder.records())
    assert _kinds(result)[0] == "breaker_opened_during_stall", result.to_text()
    f = result.findings[0]
    assert "opened on slow calls or timeouts while the loop was stalled: 3 of its 3" in f.summary
    assert f.severity == "critical" and f.data["weighed"] is True


# -- malformed input is exit status 2 naming the line (issue 13 item 12) ------------------------------

GOOD = json.dumps({"type": "QuotaRejected", "t": 1.0, "wall": 0.0, "tenant": "a", "reason": "rate",
                   "retry_after_s": 0.1})  # fmt: skip


def _doctor_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ragguard_tools.cli", "doctor", *args], capture_output=True, text=True,
        timeout=60,
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("third_line", "says"),
    [
        (b"\xff\xfe not utf-8\n", "line 3: not UTF-8 (byte 1 of the line is 0xff)"),
        (
            b'{"type": "LoopStall", "t": 2.0, "duration_s": 0.5}\n',
            "line 3: a LoopStall record without its 'started_at'",
        ),
        (b'{"type": "QuotaRejected", "t": 2.0, "tenant": "a", "reason": "rate", "retry_after_s": "soon"}\n',
         "line 3: a QuotaRejected record whose 'retry_after_s' is not a number: 'soon'"),
        (b"[1, 2]\n", "line 3: not a JSON object but list"),
        (b'{"t": 2.0}\n', 'line 3: no "type" string'),
    ],
    ids=["not-utf8", "missing-field", "wrong-type", "not-an-object", "no-type"],
)
def test_a_malformed_line_is_status_2_naming_the_line(tmp_path: Path, third_line: bytes, says: str) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(GOOD.encode() + b"\n\n" + third_line + GOOD.encode() + b"\n")
    assert doctor_main(["--events", str(path)]) == 2  # the in-process entry point
    done = _doctor_cli("--events", str(path))  # and the installed command (typer)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and f"{path}, line 3" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_an_unfinished_last_line_is_being_written_and_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + GOOD.encode()[:20])  # no newline yet
    assert [r["tenant"] for r in load_records(path)] == ["a"]


def test_diagnose_names_a_bad_record_it_is_given() -> None:
    with pytest.raises(InvalidInput, match="record 1: a BreakerTransition record without its 'new' field"):
        diagnose([json.loads(GOOD), {"type": "BreakerTransition", "t": 1.0, "breaker": "b", "old": "closed"}])


# -- findings that explain breakers, quotas and fallbacks, with a timeline (issue 13 item 13) ---------

DEMO_EVENTS = Path(__file__).parent / "data" / "demo-events.jsonl"
"""``ragguard demo --quick``'s own event log, every 4th refusal and fallback kept (and every
breaker transition, and the last tally)."""


def test_the_demo_log_is_explained() -> None:
    result = diagnose(load_records(DEMO_EVENTS))
    by_kind: dict[str, list[Any]] = {}
    for f in result.findings:
        by_kind.setdefault(f.kind, []).append(f)
    assert set(by_kind) == {"breaker_open", "quota_rejections", "fallbacks_served"}  # was: no finding

    embedding, vector_store = by_kind["breaker_open"]
    assert (embedding.data["breaker"], vector_store.data["breaker"]) == ("embedding", "vector_store")
    assert embedding.data["episodes"] == 1 and embedding.data["reopened"] == 1
    assert not embedding.data["still_open"] and 2.0 < embedding.data["open_s"] < 3.5
    assert "first at +" in embedding.summary and "slow-call rate" in embedding.summary
    assert "it refused 66 call(s)" in embedding.summary
    assert any(d.startswith("+") and "closed -> open" in d for d in embedding.details)

    (hoarder,) = by_kind["quota_rejections"]
    assert hoarder.data["tenant"] == "hoarder" and hoarder.data["reasons"] == {"rate": 29}
    assert "faster than its rate_per_s" in hoarder.summary

    shares = {f.data["stage"]: f.data for f in by_kind["fallbacks_served"]}
    assert set(shares) == {"embedding", "vector_store", "rerank"}
    kept = [json.loads(line) for line in DEMO_EVENTS.read_text().splitlines()]
    served = sum(1 for r in kept if r["type"] == "FallbackServed" and r["stage"] == "embedding")
    assert shares["embedding"]["fallbacks"] == {"embedding_cache": served}
    assert shares["embedding"]["share"] == pytest.approx(50 / 239)  # from the recorder's tally
    assert "20.9% of its 239 answers" in next(f.summary for f in by_kind["fallbacks_served"]
                                              if f.data["stage"] == "embedding")  # fmt: skip

    times = [m.at_s for m in result.timeline]
    assert times == sorted(times) and times[0] == 0.0
    whats = [m.what for m in result.timeline]
    assert "breaker 'embedding' closed -> open: slow-call rate 30.0% >= 30.0%" in whats
    assert any(w.startswith("tenant 'hoarder' refused") for w in whats)
    text = result.to_text()
    assert "timeline (from " in text and "UTC)" in text
    assert result.to_dict()["timeline"][0]["at_s"] == 0.0 and result.calls == 239 + 216 + 239


@pytest.mark.timeout(30)
def test_a_breaker_stuck_open_is_explained(tmp_path: Path) -> None:
    breakers = pytest.importorskip("ragguard.breakers")
    path = tmp_path / "events.jsonl"
    clock = FakeClock(500.0)

    async def refused() -> None:
        raise AssertionError("an open breaker must not call its dependency")

    async def main() -> None:
        recorder = EventRecorder(path=path, clock=clock)
        with recorder:
            breaker = breakers.CircuitBreaker("search", minimum_calls=2, window_size=2, open_for_s=3600,
                                              clock=clock)  # fmt: skip
            for _ in range(2):
                with pytest.raises(ConnectionRefusedError):
                    await breaker.call(_refuse)
            for _ in range(1_122):
                clock.advance(0.01)
                with pytest.raises(BreakerOpen):
                    await breaker.call(refused)
            await asyncio.sleep(0)  # the bus delivers on the next iteration

    asyncio.run(main())
    result = diagnose(load_records(path))
    (f,) = result.findings  # was: "0 finding(s)"
    assert f.kind == "breaker_open" and f.severity == "critical"
    assert f.data["still_open"] and f.data["rejected"] == 1_122
    assert "breaker 'search' opened 1 time(s)" in f.summary and "failure rate 100.0% >= 50.0%" in f.summary
    assert "still not closed when the log ends (11.2 s after it opened)" in f.summary
    assert "it refused 1122 call(s)" in f.summary


async def _refuse() -> None:
    raise ConnectionRefusedError("down")


def test_a_stall_in_asyncios_own_dispatch_says_what_it_means() -> None:
    frame = "/usr/lib/python3.11/asyncio/selector_events.py:231 in _process_events"
    stall = LoopStall(0.08, 1.0, 1.08, frame, "/usr/lib/python3.11/asyncio/selector_events.py", 231,
                      "_process_events", (frame,), 4)  # fmt: skip
    (f,) = diagnose([stall]).findings
    assert f.kind == "loop_stall" and f.data["asyncio_own"]
    assert "asyncio's own code, not a callback of yours" in f.summary
    assert "move that work off the loop" not in f.summary
    (mine,) = diagnose([_stall(1.0, 1.08)]).findings
    assert "move that work off the loop" in mine.summary


def test_many_tenants_refused_are_ranked_and_capped() -> None:
    rejections = [
        events.QuotaRejected(f"t{i:02d}", "concurrency", 0.1) for i in range(30) for _ in range(i + 1)
    ]
    result = diagnose(rejections)
    tenants = [f.data.get("tenant") for f in result.findings]
    assert tenants[:3] == ["t29", "t28", "t27"] and len(result.findings) == 11
    assert result.findings[-1].summary == "20 more tenant(s) were refused 210 time(s) in all"
    assert "had max_concurrency requests in flight" in result.findings[0].summary


# -- the documented options exist (issue 13 item 14) ---------------------------------------------------


@pytest.mark.timeout(60)
def test_doctor_cli_takes_grace_s(tmp_path: Path) -> None:
    helped = _doctor_cli("--help")
    assert helped.returncode == 0 and "--grace-s" in helped.stdout
    path = tmp_path / "events.jsonl"
    stall = {"type": "LoopStall", "t": 3.4, "wall": 0.0, "duration_s": 0.4, "started_at": 3.0, "at": 3.4,
             "frame": "app.py:1 in f", "filename": "app.py", "lineno": 1, "function": "f"}  # fmt: skip
    opened = {"type": "BreakerTransition", "t": 3.9, "wall": 0.0, "breaker": "db", "old": "closed",
              "new": "open", "at": 3.9}  # fmt: skip
    path.write_text(json.dumps(stall) + "\n" + json.dumps(opened) + "\n")
    blamed = _doctor_cli("--events", str(path), "--json", "--grace-s", "1.0")
    kinds = [f["kind"] for f in json.loads(blamed.stdout)["findings"]]
    assert blamed.returncode == 1 and "breaker_opened_during_stall" in kinds
    not_blamed = _doctor_cli("--events", str(path), "--json", "--grace-s", "0.1")
    assert "breaker_opened_during_stall" not in [f["kind"] for f in json.loads(not_blamed.stdout)["findings"]]
    bad = _doctor_cli("--events", str(path), "--grace-s", "-1")
    assert bad.returncode == 2 and "grace_s must be" in bad.stderr


# -- `ragguard doctor` with no arguments after `ragguard demo` (user report item 14) -----------------


@pytest.mark.timeout(60)
def test_doctor_without_arguments_reads_the_demos_events_and_says_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAGGUARD_EVENTS_FILE"}
    nothing = _doctor_cli_in(tmp_path, env)
    assert nothing.returncode == 2 and "ragguard-report/events.jsonl" in nothing.stderr  # named in the error

    (tmp_path / "ragguard-report").mkdir()
    (tmp_path / "ragguard-report" / "events.jsonl").write_text(GOOD + "\n")
    found = _doctor_cli_in(tmp_path, env)
    assert found.returncode == 1, found.stderr  # was 2: "cannot read events file 'ragguard-events.jsonl'"
    assert "reading ./ragguard-report/events.jsonl" in found.stderr
    assert "tenant 'a' was refused 1 time(s)" in found.stdout

    (tmp_path / "ragguard-events.jsonl").write_text("")  # the default file, when there, wins
    assert _doctor_cli_in(tmp_path, env).returncode == 0
    chosen = _doctor_cli_in(tmp_path, {**env, "RAGGUARD_EVENTS_FILE": "ragguard-report/events.jsonl"})
    assert chosen.returncode == 1 and "reading" not in chosen.stderr


def _doctor_cli_in(cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ragguard_tools.cli", "doctor"], capture_output=True,
                          text=True, timeout=60, cwd=cwd, env=env)  # fmt: skip


# -- a stall with only Python's own code on the stack (user report: doctor blamed _weakrefset) ------


@pytest.mark.timeout(60)
def test_a_stall_in_the_stdlib_alone_is_worded_as_starvation_not_code_to_move(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "events.jsonl"

    async def main() -> None:
        with EventRecorder(path=path):
            async with StallDetector():
                await asyncio.sleep(0.06)
                asyncio.get_running_loop().call_soon(threading.Event().wait, 0.15)  # nothing of ours runs
                for _ in range(4):
                    await asyncio.sleep(0.01)

    asyncio.run(main())
    (stall,) = [r for r in load_records(path) if r["type"] == "LoopStall"]
    assert stall["origin"] == "runtime" and stall["frame"].startswith(threading.__file__), stall
    done = _doctor_cli("--events", str(path))
    assert done.returncode == 1, done.stderr
    text = " ".join(done.stdout.split())
    ms = f"{stall['duration_s'] * 1000:.0f} ms"
    if stall["waited_s"] is not None:  # measured (Linux): the thread slept in the wait, it was not starved
        assert stall["ran_s"] + stall["waited_s"] < stall["duration_s"] / 2, stall
        assert f"the loop thread was blocked for {ms} inside {stall['frame']}, neither running nor waiting " \
               "for a CPU: a blocking call" in text, text
    assert "move that work off the loop" not in text
    unmeasured = {**stall, "ran_s": None, "waited_s": None}  # a log written before the measure, or elsewhere
    (f,) = diagnose([unmeasured]).findings
    assert f"the loop thread did not run for {ms} inside {stall['frame']}: the process may have been " \
           "starved of CPU or paused by GC" in f.summary, f.summary

    # the same stall in a frame of the application keeps the advice to move it
    (f,) = diagnose([_stall(1.0, 1.08)]).findings
    assert "move that work off the loop" in f.summary and f.data["origin"] == ""
    mine = {**stall, "origin": "app", "frame": "app.py:3 in handler", "filename": "app.py"}
    (f,) = diagnose([mine]).findings
    assert "move that work off the loop" in f.summary


# -- user report: `ragguard doctor` after `scripts/demo` on a loaded 2-core machine -------------------


def _record(r: Any) -> dict[str, Any]:
    if isinstance(r, dict):
        return r
    from ragguard.monitors._record import to_record

    return to_record(r, t=0.0, wall=0.0)


def _opened_by_latency(at: float, latencies: list[list[float]], breaker: str = "embedding") -> dict[str, Any]:
    return {"type": "BreakerTransition", "t": at, "at": at, "wall": 0.0, "breaker": breaker, "old": "closed",
            "new": "open", "reason": "slow-call rate 30.0% >= 30.0%", "causes": {"timeout": len(latencies)},
            "errors": {"StageTimeout": len(latencies)}, "latencies": latencies}  # fmt: skip


def test_a_short_stall_does_not_explain_calls_that_took_seconds() -> None:
    """The report: a 29 ms stall was blamed for an embedding breaker whose calls took 3 s."""
    stall = _record(_stall(10.0, 10.029, "/usr/lib/python3.11/asyncio/events.py:80 in _run"))
    slow = [[10.05 + i * 0.01, 3.2] for i in range(6)]  # six calls of 3.2 s, each across the stall
    result = diagnose([stall, _opened_by_latency(10.1, slow)], grace_s=1.0)
    assert "breaker_opened_during_stall" not in _kinds(result), result.to_text()
    assert set(_kinds(result)) == {"breaker_open", "loop_stall"}


def test_stalls_that_took_most_of_the_slow_calls_time_are_blamed() -> None:
    stalls = [_record(_stall(10.0, 10.3)), _record(_stall(10.35, 10.5))]
    slow = [[10.5, 0.55], [10.52, 0.6], [10.55, 0.6], [12.0, 0.6]]  # three across the stalls, one well after
    result = diagnose([*stalls, _opened_by_latency(12.0, slow)], grace_s=0.0)
    assert _kinds(result)[0] == "breaker_opened_during_stall", result.to_text()
    f = result.findings[0]
    assert f.severity == "critical" and f.data["explained_calls"] == 3 and f.data["latency_calls"] == 4
    assert "3 of its 4 slow or timed-out call(s) spent at least half their time in loop stalls" in f.summary
    assert "loop_stall" not in _kinds(result)  # both stalls are explained by the finding


@pytest.mark.timeout(30)
def test_timeouts_after_a_real_stall_has_ended_are_not_blamed_on_it() -> None:
    """The old rule blamed any opening within grace_s of a stall, even for calls made after it."""
    breakers = pytest.importorskip("ragguard.breakers")

    async def search() -> None:  # a dependency that really is too slow for its 20 ms timeout
        async with asyncio.timeout(0.02):
            await asyncio.sleep(1.0)

    recorder = EventRecorder()

    async def main() -> None:
        breaker = breakers.CircuitBreaker("vector_store", minimum_calls=3, window_size=3)
        with recorder:
            async with StallDetector(threshold_s=0.05):
                await asyncio.sleep(0.05)
                time.sleep(0.2)  # a stall, over before the calls start
                await asyncio.sleep(0.01)
                for _ in range(3):
                    with pytest.raises(TimeoutError):
                        await breaker.call(search)
                await asyncio.sleep(0.01)

    asyncio.run(main())
    result = diagnose(recorder.records(), grace_s=1.0)
    assert "breaker_opened_during_stall" not in _kinds(result), result.to_text()
    assert "loop_stall" in _kinds(result) or "loop_starved" in _kinds(result)
    (opened,) = [r for r in recorder.records() if r["type"] == "BreakerTransition"]
    assert opened["causes"] == {"timeout": 3} and len(opened["latencies"]) == 3
    assert all(0.015 < took < 0.2 for _, took in opened["latencies"]), opened  # each call's own 20 ms


def test_a_stall_without_a_sample_says_why_in_words() -> None:
    empty = {"type": "LoopStall", "t": 5.561, "wall": 0.0, "duration_s": 0.041, "started_at": 5.52,
             "at": 5.561, "frame": "", "filename": "", "lineno": 0, "function": "", "stack": [], "samples": 0,
             "origin": ""}  # fmt: skip
    result = diagnose([empty, {**empty, "t": 7.0, "started_at": 6.95, "at": 7.0, "duration_s": 0.05}])
    (f,) = result.findings
    assert "blocked 2 time(s) (91 ms in all, longest 50 ms) and no stack sample was caught" in f.summary
    assert "the watchdog thread got no CPU or GIL before each stall ended" in f.summary
    assert " in  (" not in result.to_text()
    assert result.timeline[0].what == "the loop blocked 41 ms in (no stack sample caught)"


def test_ragguards_own_frames_are_never_the_users_to_move() -> None:
    from ragguard.monitors import _stall

    assert _stall._origin(events.__file__) == "ragguard"
    assert _stall._origin(_stall.__file__) == "ragguard"
    import ragguard_tools.cli
    import ragguard_tools.demo.keyword

    assert _stall._origin(ragguard_tools.cli.__file__) == "ragguard"  # the tools, installed beside it
    assert _stall._origin(ragguard_tools.demo.keyword.__file__) == "app"  # an application of ragguard
    # a log of an installed ragguard, written before the detector told ragguard's frames apart
    for origin, path in (("library", "/venv/lib/python3.11/site-packages/ragguard/quotas/_local.py"),
                         ("runtime", "/venv/lib/python3.11/site-packages/ragguard/monitors/_stall.py")):
        frame = f"{path}:535 in _wait_for_slot"
        old = {**_record(LoopStall(0.04, 1.0, 1.04, frame, path, 535, "_wait_for_slot", (frame,), 2)),
               "origin": origin}  # fmt: skip
        (f,) = diagnose([old]).findings
        assert "ragguard's own code, not yours to move off the loop" in f.summary, f.summary
        assert "move that work off the loop (asyncio.to_thread)" not in f.summary
        # was: "the loop thread did not run ... inside .../_stall.py ... Only Python's own code ..."
        assert "Only Python's own code" not in f.summary
        assert f.data["origin"] == "ragguard"


def test_the_detectors_own_beat_is_never_a_sample() -> None:
    detector = StallDetector()
    detector._loop_tid = threading.get_ident()  # "the loop" is this thread, now inside the detector's code
    assert detector._sample() is None


@pytest.mark.timeout(30)
def test_a_real_stall_in_ragguards_own_dispatch_is_not_the_users(tmp_path: Path) -> None:
    """A listener that blocks (here threading.Event.wait, Python's own) runs under ragguard's
    event bus: the frame caught is ragguard's ``_drain``, which the old detector called the
    application's (a source checkout) or a library's, and doctor said to move it off the loop."""
    watched = Collected()
    path = tmp_path / "events.jsonl"
    bus = events.EventBus()
    bus.subscribe(threading.Event().wait)  # the "event" emitted is the wait's timeout, in seconds

    async def main() -> None:
        with EventRecorder(path=path, bus=watched.bus):
            async with StallDetector(bus=watched.bus):
                await asyncio.sleep(0.06)
                bus.emit(0.15)
                for _ in range(4):
                    await asyncio.sleep(0.01)

    asyncio.run(main())
    (stall,) = watched.of(LoopStall)
    assert stall.origin == "ragguard" and stall.function == "_drain", stall
    text = " ".join(diagnose(load_records(path)).to_text().split())
    assert "ragguard's own code, not yours to move off the loop" in text, text
    assert "move that work off the loop (asyncio.to_thread)" not in text


def test_starved_stalls_are_said_as_cpu_starvation_not_code() -> None:
    def starved(start: float, frame: str, waited: float) -> dict[str, Any]:
        return {**_record(_stall(start, start + 0.03, frame)), "ran_s": 0.004, "waited_s": waited}

    stalls = [starved(1.0 + i * 0.2, f"app.py:{i % 3} in handler", 0.025) for i in range(20)]
    mine = {**_record(_stall(9.0, 9.2)), "ran_s": 0.19, "waited_s": 0.005}  # this one ran: the app's work
    result = diagnose([*stalls, mine])
    assert _kinds(result) == ["loop_starved", "loop_stall"]
    starvation, own = result.findings
    assert "the loop thread was starved of CPU: 20 stall(s), 600 ms in all" in starvation.summary
    assert "move that work off the loop" not in starvation.summary
    assert starvation.data["waited_s"] == pytest.approx(0.5)
    assert "move that work off the loop" in own.summary
    first = result.timeline[0].what  # one line, not twenty
    assert first == "the loop thread was starved of CPU 20 time(s) (600 ms in all) until +3.8 s"


@pytest.mark.timeout(60)
def test_a_real_loop_starved_of_cpu_is_measured_as_waiting(tmp_path: Path) -> None:
    """Two busy processes pinned to the loop's CPU: the loop thread's stall is mostly spent
    waiting, runnable, for that CPU, and doctor says so instead of naming the frame."""
    if not hasattr(os, "sched_setaffinity") or not os.path.exists("/proc/thread-self/schedstat"):
        pytest.skip("needs Linux's sched_setaffinity and schedstat")
    cpu = min(os.sched_getaffinity(0))
    spin = f"import os, time; os.sched_setaffinity(0, {{{cpu}}}); end = time.monotonic() + 20\n" \
           "while time.monotonic() < end: pass"  # fmt: skip
    burners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    before = os.sched_getaffinity(0)
    watched = Collected()
    path = tmp_path / "events.jsonl"

    def work(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    async def main() -> None:
        with EventRecorder(path=path, bus=watched.bus):
            async with StallDetector(threshold_s=0.05, bus=watched.bus):
                await asyncio.sleep(0.3)
                work(0.1)  # 100 ms of CPU on a CPU shared three ways: about 300 ms of stall
                for _ in range(5):
                    await asyncio.sleep(0.02)

    try:
        time.sleep(0.3)  # the burners are pinned and spinning
        os.sched_setaffinity(0, {cpu})  # this thread, the loop's (the watchdog started later inherits it)
        asyncio.run(main())
    finally:
        os.sched_setaffinity(0, before)
        for b in burners:
            b.kill()
            b.wait()
    stall = max(watched.of(LoopStall), key=lambda s: s.duration_s)
    assert stall.waited_s is not None and stall.ran_s is not None
    assert stall.waited_s >= stall.duration_s / 2, stall
    assert stall.ran_s >= 0.05, stall  # it ran its 100 ms of work, give or take the window's edges
    kinds = _kinds(diagnose(load_records(path)))
    assert "loop_starved" in kinds, kinds


def test_each_run_of_the_demo_is_reported_apart(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "events.jsonl"
    bus = events.EventBus()
    recorder = EventRecorder(path=path, bus=bus, clock=clock).start()
    with pytest.raises(ConfigError):
        recorder.mark_run("")
    recorder.mark_run("unguarded")
    recorder.record(LoopStall(0.4, 1.0, 1.4, "app.py:3 in slow", "app.py", 3, "slow", (), 3))
    recorder.record(events.StageCompleted("embedding", "t", "success", 0.01))
    clock.advance(10.0)
    recorder.record(events.StageCompleted("embedding", "t", "success", 0.01))
    recorder.mark_run("guarded")
    clock.advance(1.0)
    recorder.record(events.BreakerTransition("embedding", "closed", "open", clock()))
    recorder.record(events.FallbackServed("embedding", "cache", "t", "EmbeddingUnavailable"))
    recorder.record(events.StageCompleted("embedding", "t", "fallback", 0.01))
    clock.advance(2.0)
    recorder.close()
    records = load_records(path)
    assert [r["run"] for r in records if r["type"] == "RunStarted"] == ["unguarded", "guarded"]
    result = diagnose(records)
    assert [r.name for r in result.runs] == ["unguarded", "guarded"]
    by_run = {f.kind: f.run for f in result.findings}
    assert by_run == {"loop_stall": "unguarded", "breaker_open": "guarded", "fallbacks_served": "guarded"}
    fallback = next(f for f in result.findings if f.kind == "fallbacks_served")
    assert fallback.data["share"] == pytest.approx(1 / 2), fallback  # the guarded run's counts only
    text = result.to_text()
    assert "== run 'unguarded'" in text and "== run 'guarded'" in text
    assert text.index("== run 'unguarded'") < text.index("app.py:3 in slow") < text.index("== run 'guarded'")
    assert [m.what for m in result.timeline if m.what.startswith("run ")] == [
        "run 'unguarded' begins", "run 'guarded' begins"]  # fmt: skip
    assert result.to_dict()["findings"][0]["run"] in ("unguarded", "guarded")


def test_the_timelines_last_line_has_a_time() -> None:
    result = diagnose([_stall(1.0 + i, 1.05 + i) for i in range(75)])
    last = result.timeline[-1]
    assert last.what == "... and 15 more moments, until +74.00 s" and last.at_s == pytest.approx(60.0)
    assert "+? s" not in result.to_text()


def test_stalls_in_many_places_are_capped_the_costliest_first() -> None:
    stalls = [_stall(1.0 + i, 1.0 + i + 0.02 + i / 1000, f"app.py:{i} in f{i}") for i in range(20)]
    result = diagnose(stalls)
    assert _kinds(result) == ["loop_stall"] * 8  # was one finding per place: 20
    assert [f.data["frame"] for f in result.findings[:3]] == ["app.py:19 in f19", "app.py:18 in f18",
                                                              "app.py:17 in f17"]  # fmt: skip
    last = result.findings[-1]
    assert last.summary == "13 more stall(s) of the loop (338 ms in all) in 13 other places, the longest " \
                           "32 ms in app.py:12 in f12"  # fmt: skip
