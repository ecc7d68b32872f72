"""`ragguard <command> --help`: flags read as flags, and every option says its default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragguard_tools.cli import app

COMMANDS = ("demo", "bench", "doctor", "top", "version")


def help_text(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def option_entries(text: str) -> dict[str, tuple[str, str]]:
    """Long option name -> (its column as printed, e.g. ``-e, --events FILE``; its help text with
    the wrapping undone)."""
    entries: dict[str, tuple[str, str]] = {}
    name = ""
    for line in text.split("Options:", 1)[1].splitlines():
        head = re.match(r"  (-\S.*?)(?:\s{2,}(.*))?$", line)
        if head:
            column = head.group(1)
            name = next(word for word in column.replace(",", " ").split() if word.startswith("--"))
            entries[name] = (column, head.group(2) or "")
        elif name and line.strip():
            column, words = entries[name]
            entries[name] = (column, f"{words} {line.strip()}".strip())
    return entries


@pytest.mark.parametrize("command", [(), *((c,) for c in COMMANDS)], ids=["ragguard", *COMMANDS])
def test_no_flag_is_shown_with_a_type(command: tuple[str, ...]) -> None:
    text = help_text(*command)
    assert "--help" in text
    assert "<bool>" not in text and not re.search(r"/ ?--no-", text), text


def test_demo_flags_and_defaults_are_shown() -> None:
    text = " ".join(help_text("demo").split())  # undo the wrapping
    assert "--quick A short run" in text, "--quick takes no value"
    for shown in ("--duration SECONDS", "[default: (40, or 9 with --quick)]", "--concurrency N",
                  "[default: 64]", "--out DIR", "[default: ragguard-report]", "--seed N", "[default: 7]"):
        assert shown in text, shown


FLAGS = {"--help", "--quick", "--json", "--print-scenario", "--no-halving", "--changes-only"}
PLACEHOLDER = re.compile(r"<(str|int|float|path|bool)>")


def test_every_command_is_listed_by_name_with_its_whole_summary() -> None:
    result = CliRunner().invoke(app, ["--help"], terminal_width=80)  # a plain terminal's width
    assert result.exit_code == 0, result.output
    text = result.output
    listed = dict(re.findall(r"^  (\w+) +(.+)$", text.split("Commands:", 1)[1], re.MULTILINE))
    assert set(listed) == set(COMMANDS)
    for command, summary in listed.items():
        assert not summary.endswith("..."), f"{command}'s summary is cut: {summary!r}"


@pytest.mark.parametrize("command", ["demo", "bench", "doctor"])
def test_every_option_shows_its_default(command: str) -> None:
    entries = option_entries(help_text(command))
    assert len(entries) >= 4
    for name, (column, words) in entries.items():
        shown = column.split(", ")[-1]  # "--events FILE" of "-e, --events FILE"
        if name in FLAGS:
            assert shown == name, f"a flag is shown taking a value: {column!r}"
        else:
            assert shown.startswith(f"{name} "), f"{name} is shown without its value: {column!r}"
        if name != "--help":
            assert "default:" in words, f"{name} shows no default: {words!r}"
        assert not PLACEHOLDER.search(column), f"{name} shows a type, not a name for its value: {column!r}"


@pytest.mark.parametrize("command", [(), *((c,) for c in COMMANDS)], ids=["ragguard", *COMMANDS])
def test_h_is_help_everywhere(command: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*command, "-h"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert result.output == help_text(*command)
    assert "-h, --help" in result.output


@pytest.mark.parametrize("command", ["demo", "bench", "doctor"])
def test_every_running_command_says_its_exit_status(command: str) -> None:
    assert re.search(r"Exit status: 0 [^\n]+, 2 ", help_text(command)), command


def test_version_flag_prints_the_version() -> None:
    from ragguard import __version__

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output == f"ragguard {__version__}\n"
    assert CliRunner().invoke(app, ["version"]).output == f"{__version__}\n"


def test_bench_help_states_the_defaults_the_bench_uses() -> None:
    from ragguard_tools.bench import BenchOptions

    text = " ".join(help_text("bench").split())
    steps, _, steady, rounds, _ = BenchOptions().plan()
    q_steps, _, q_steady, q_rounds, _ = BenchOptions(quick=True).plan()
    shown = ",".join(f"{x:g}" for x in steps)
    assert f"[default: ({shown}; with --quick {','.join(f'{x:g}' for x in q_steps)})]" in text
    assert f"[default: ({steady:g}, or {q_steady:g} with --quick)]" in text
    assert f"[default: ({rounds}, or {q_rounds} with --quick)]" in text


def test_print_scenario_writes_the_built_in_yaml_to_start_from(tmp_path: Path) -> None:
    from importlib import resources

    from ragguard.chaos import default_scenario, load_scenario

    result = CliRunner().invoke(app, ["demo", "--print-scenario"])
    assert result.exit_code == 0, result.output
    built_in = resources.files("ragguard.chaos").joinpath("scenarios/default.yaml").read_text()
    assert result.output == built_in  # comments included: they explain each fault
    copy = tmp_path / "my.yaml"
    copy.write_text(result.output)
    assert load_scenario(copy) == default_scenario()  # what --scenario my.yaml reads
    # the file says the demo scales it, rather than a run length the demo ignores without a word
    assert "`ragguard demo` does not: --duration sets its run length" in built_in
    assert "--print-scenario" in " ".join(help_text("demo").split())
