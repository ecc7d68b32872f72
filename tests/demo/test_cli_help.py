"""`ragguard <command> --help`: flags read as flags, and every option says its default."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from ragguard.cli import app

COMMANDS = ("demo", "doctor", "version")


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
    assert "<bool>" not in text and "/--no-" not in text, text


def test_demo_flags_and_defaults_are_shown() -> None:
    text = " ".join(help_text("demo").split())  # undo the wrapping
    assert "--quick A short run" in text, "--quick takes no value"
    for shown in ("--duration SECONDS", "[default: (40, or 9 with --quick)]", "--concurrency N",
                  "[default: 64]", "--out DIR", "[default: ragguard-report]", "--seed N", "[default: 7]"):
        assert shown in text, shown


FLAGS = {"--help", "--quick", "--json"}


@pytest.mark.parametrize("command", ["demo", "doctor"])
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
