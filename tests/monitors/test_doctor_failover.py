"""`ragguard doctor` explains a model group's failover episode from a recorded event log: which
deployment was left and why (its errors, or its breaker open: skipped without a call), which took
over, the calls none could answer, and what the left deployment's breaker did meanwhile (opened,
its cooldown, closed again). The group runs on a FakeClock; the recorder writes the file the
doctor reads."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ragguard import FakeClock, NoDeploymentAvailable, Policy
from ragguard.monitors._record import EventRecorder, load_records
from ragguard.testing import fresh_guard
from ragguard_tools.doctor import diagnose, doctor_main

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]

BREAKER = {"minimum_calls": 2, "window_size": 2, "failure_rate_threshold": 50, "open_for_s": 30,
           "half_open_permits": 1}  # fmt: skip


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _settle() -> None:
    for _ in range(3):  # events reach listeners on a later loop iteration
        await asyncio.sleep(0)


async def _episode(path: Path, clock: FakeClock) -> None:
    """``primary`` down for four calls a second apart (two fail, then its breaker is open and two
    skip it), ``backup`` answering; 31 s later ``primary`` is back and answers the next call; then
    both down for one call."""
    policy = Policy.parse({
        "stages": {"chat": {"breaker": BREAKER, "retry": {"attempts": 1}}},
        "groups": {"chat": {"deployments": [{"name": "primary"}, {"name": "backup", "priority": 1}]}},
    })  # fmt: skip
    guard = fresh_guard(policy, clock=clock)
    down = {"primary"}

    def deployment(name: str):  # type: ignore[no-untyped-def]
        async def call(question: str) -> str:
            if name in down:
                raise ConnectionRefusedError(f"{name} is down")
            return f"from {name}"

        return call

    chat = guard.group("chat", {name: deployment(name) for name in ("primary", "backup")})
    with EventRecorder(path=path, clock=clock):
        for i in range(4):
            assert await chat(str(i)) == "from backup"
            await _settle()  # recorded when they happen, as a serving loop would deliver them
            clock.advance(1.0)
        clock.advance(31.0)
        down.clear()
        assert await chat("back") == "from primary"  # its half-open trial answered: closed again
        await _settle()
        clock.advance(10.0)
        down.update(("primary", "backup"))
        with pytest.raises(NoDeploymentAvailable):
            await chat("none")
        await _settle()


async def test_the_doctor_explains_who_was_left_why_who_took_over_and_the_breaker_meanwhile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = FakeClock(auto_advance=False)
    path = tmp_path / "events.jsonl"
    await _episode(path, clock)
    found = [f for f in diagnose(load_records(path)).findings if f.kind == "failover"]
    first, *later = found
    assert first.severity == "warning"
    assert first.data == {
        "group": "chat", "deployment": "primary", "count": 4, "reasons": {"failure": 2, "open": 2},
        "errors": {"ConnectionRefusedError": 2, "BreakerOpen": 2}, "to": {"backup": 4}, "unanswered": 0,
        "breaker": "chat[primary]",
    }  # fmt: skip  (the first deployment is asked first: its open breaker refuses, BreakerOpen)
    assert "left deployment 'primary' 4 time(s)" in first.summary
    assert "failed 2" in first.summary and "its breaker open (skipped without a call) 2" in first.summary
    assert "backup" in first.summary and "took over" in first.summary
    meanwhile = "\n".join(first.details)
    assert "'chat[primary]' closed -> open" in meanwhile
    assert "open -> half_open" in meanwhile and "half_open -> closed" in meanwhile
    assert "it took calls again once its breaker closed" in meanwhile
    # the last call: both down, none answered
    unanswered = [f for f in later if f.data["unanswered"]]
    assert unanswered and all(f.severity == "critical" for f in unanswered)
    assert {f.data["deployment"] for f in unanswered} == {"primary", "backup"}
    assert all("no other deployment answered" in f.summary for f in unanswered)

    assert doctor_main(["--events", str(path), "--json"]) == 1
    printed = json.loads(capsys.readouterr().out)
    kinds = [f["kind"] for f in printed["findings"]]
    assert "failover" in kinds
