"""Scenario files: validation with field and line, phases applied on a fake clock."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ragguard import ConfigError, FakeClock, _inject
from ragguard.breakers import is_connection_error
from ragguard.chaos import (
    Chaos,
    Error,
    Latency,
    ScenarioError,
    ScenarioRunner,
    default_scenario,
    load_scenario,
)
from ragguard.chaos._scenario import parse_scenario

GOOD = textwrap.dedent(
    """\
    name: outage
    duration_s: 10
    phases:
      - name: calm
        start: 0.0
        end: 0.2
      - name: store down
        start: 0.2
        end: 0.6
        faults:
          - {kind: error, error: connection_refused, stage: search}
          - {kind: latency, stage: embed, tenant: acme, rate: 0.5, median_s: 0.01, p99_s: 0.5}
      - name: slow tail
        start: 0.5
        end: 1.0
        faults:
          - kind: latency
            stage: [embed, rerank]
            seconds: 0.2
    """
)


def test_a_good_file_parses_into_phases() -> None:
    scenario = parse_scenario(GOOD)
    assert scenario.name == "outage"
    assert [p.name for p in scenario.phases] == ["calm", "store down", "slow tail"]
    assert [p.name for p in scenario.phases_at(0.55)] == ["store down", "slow tail"]
    fault = scenario.phases[1].faults[1].build()
    assert isinstance(fault, Latency) and fault.injection_rate == 0.5


@pytest.mark.parametrize(
    ("old", "new", "field", "line"),
    [
        ("rate: 0.5, median_s", "rate: 1.5, median_s", "phases[1].faults[1].rate", 12),
        ("error: connection_refused", "error: on_fire", "phases[1].faults[0].error", 11),
        ("    seconds: 0.2", "    secnds: 0.2", "phases[2].faults[0].secnds", 19),
        ("    end: 0.6", "    end: 0.1", "phases[1]", 7),
        ("duration_s: 10", "duration_s: -1", "duration_s", 2),
        ("kind: latency\n", "kind: earthquake\n", "phases[2].faults[0]", 17),
    ],
)
def test_errors_name_the_field_and_the_line(old: str, new: str, field: str, line: int) -> None:
    assert old in GOOD
    with pytest.raises(ScenarioError) as info:
        parse_scenario(GOOD.replace(old, new, 1), source="bad.yaml")
    problems = info.value.problems
    assert any(f == field and ln == line for f, ln, _ in problems), problems
    assert f"line {line}: {field}" in str(info.value)
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)


def test_missing_field_points_at_its_parent() -> None:
    text = GOOD.replace("  - name: calm\n", "  - nme: calm\n")
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text)
    fields = {(f, ln) for f, ln, _ in info.value.problems}
    assert ("phases[0].name", 4) in fields  # missing: the line of the phase
    assert ("phases[0].nme", 4) in fields  # unknown key: its own line


def test_yaml_syntax_error_has_a_line() -> None:
    with pytest.raises(ScenarioError, match=r"line \d+: <root>: not valid YAML"):
        parse_scenario("name: x\nphases:\n  - {name: a, start: 0\n")


def test_load_from_file_and_default_scenario(tmp_path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(GOOD)
    assert load_scenario(path).phases[1].name == "store down"
    default = default_scenario()
    names = [p.name for p in default.phases]
    assert names[0] == "warm-up" and names[-1] == "recovery"
    assert default.phases_at(0.05)[0].faults == []
    spiky = default.phases_at(0.2)[0].faults
    assert any(getattr(f, "seconds", 0) and f.seconds > 3.0 for f in spiky)


@pytest.mark.anyio
async def test_runner_applies_phases_as_the_clock_moves() -> None:
    clock = FakeClock()
    chaos = Chaos(rng=random.Random(0))
    runner = ScenarioRunner(parse_scenario(GOOD), chaos, duration_s=100, clock=clock)

    async def ok() -> str:
        return "ok"

    assert runner.update() == ("calm",)
    assert await chaos("search", "t", ok) == "ok"
    clock.advance(25)
    assert runner.update() == ("store down",)
    with pytest.raises(ConnectionRefusedError):
        await chaos("search", "t", ok)
    clock.advance(30)  # 55 %: two phases overlap
    assert set(runner.update()) == {"store down", "slow tail"}
    assert len(chaos.faults) == 3
    clock.advance(10)
    assert runner.update() == ("slow tail",)
    assert await chaos("search", "t", ok) == "ok"
    clock.advance(40)
    assert runner.finished and runner.update() == ()
    assert chaos.faults == ()


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_runner_drives_a_real_proxy_and_falls_back_in_process(redis_server, fault_proxy) -> None:
    proxy = fault_proxy(redis_server)
    text = textwrap.dedent(
        """\
        name: proxy
        phases:
          - {name: down, start: 0.0, end: 0.5, faults: [{kind: proxy, target: store, action: refuse}]}
          - {name: up, start: 0.5, end: 1.0}
        """
    )
    clock = FakeClock()
    with Chaos(rng=random.Random(0)) as chaos:
        runner = ScenarioRunner(parse_scenario(text), chaos, duration_s=10, clock=clock,
                                proxies={"store": proxy})
        runner.update()
        client = aredis.Redis(host=proxy.host, port=proxy.port, socket_timeout=1, retry=Retry(NoBackoff(), 0))
        with pytest.raises(redis.ConnectionError) as info:
            await client.ping()
        assert is_connection_error(info.value)
        assert "111" in str(info.value)  # ECONNREFUSED from the kernel
        clock.advance(6)
        runner.update()
        assert await client.ping()
        await client.aclose()

        # No proxy of that name: the same phase refuses in-process at stage "store".
        clock2 = FakeClock()
        runner2 = ScenarioRunner(parse_scenario(text), chaos, duration_s=10, clock=clock2)
        runner2.update()
        assert isinstance(chaos.faults[0].fault, Error)
        assert _inject.active is chaos
        with pytest.raises(ConnectionRefusedError):
            await _inject.active("store", "t", client.ping)
        runner2.stop()
        assert chaos.faults == ()


@pytest.mark.anyio
@pytest.mark.timeout(10)
async def test_run_is_bounded_and_cleans_up() -> None:
    chaos = Chaos(rng=random.Random(0))
    runner = ScenarioRunner(parse_scenario(GOOD), chaos, duration_s=0.2)
    await runner.run(tick_s=0.02)
    assert runner.finished and chaos.faults == ()
    with pytest.raises(ConfigError, match="duration_s"):
        ScenarioRunner(parse_scenario(GOOD), chaos, duration_s=0)


def test_errors_show_the_value_given_and_suggest_a_known_field() -> None:
    # user report: `rate: 2.5` said only "Input should be less than or equal to 1"
    bad = GOOD.replace("rate: 0.5, median_s", "rate: 2.5, median_s")
    bad = bad.replace("    seconds: 0.2", "    secnds: 0.2")
    with pytest.raises(ScenarioError) as info:
        parse_scenario(bad, source="bad.yaml")
    text = str(info.value)
    lines = [line.strip() for line in text.splitlines()]
    rate = "line 12: phases[1].faults[1].rate: Input should be less than or equal to 1 (got 2.5)"
    assert rate in lines, text
    assert ("line 19: phases[2].faults[0].secnds: Extra inputs are not permitted (got 0.2); "
            "did you mean seconds?") in lines, text
    huge = GOOD.replace("name: calm", "name: calm\n    bogus_phase_key: " + "z" * 5000)
    with pytest.raises(ScenarioError) as info:
        parse_scenario(huge)
    (line,) = [ln for ln in str(info.value).splitlines() if "bogus_phase_key" in ln]
    assert len(line) < 200 and "..." in line, line  # the value shown, bounded
    assert "did you mean" not in line  # nothing near it


def test_the_cli_shows_the_scenario_error_with_the_value(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ragguard_tools.cli import app

    path = tmp_path / "mine.yaml"
    path.write_text(GOOD.replace("rate: 0.5, median_s", "rate: 2.5, median_s"))
    result = CliRunner().invoke(app, ["demo", "--scenario", str(path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    assert "rate: Input should be less than or equal to 1 (got 2.5)" in result.output, result.output
