"""A bad option is refused naming the option the user typed (``--duration``), not the options
field behind it (``duration_s``), with the value given; exit status 2."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from ragguard_tools.cli import app


def refused(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), terminal_width=200)
    assert result.exit_code == 2, result.output
    return " ".join(result.output.split())


@pytest.mark.parametrize(
    ("args", "said", "field"),
    [
        (("demo", "--duration", "-5"),
         "ragguard demo: --duration must be between 1 and 3600 seconds, got -5.0", "duration_s"),
        (("demo", "--redis", "notaurl"),
         "ragguard demo: --redis must be a redis://, rediss:// or unix:// URL, got 'notaurl'", "redis_url"),
        (("demo", "--concurrency", "0"),
         "ragguard demo: --concurrency must be an int in 1..10000, got 0", "concurrency"),
        (("bench", "--steady", "0"),
         "ragguard bench: --steady must be in (0, 600] seconds, got 0.0", "steady_s"),
        (("bench", "--block-ms", "0.5"),
         "ragguard bench: --block-ms must be in [1, 1000], got 0.5", "block_ms"),
        (("bench", "--steps", "2,1"),
         "ragguard bench: --steps must be at least two rising multiples", "steps"),
    ],
)  # fmt: skip
def test_a_bad_option_names_the_option_typed(args: tuple[str, ...], said: str, field: str) -> None:
    text = refused(*args)
    assert said in text, text
    assert not re.search(rf"(?<![-\w]){field}\b", text), text  # only as the option: --{field}


def test_a_long_bad_value_is_shown_bounded() -> None:
    text = refused("bench", "--steps", "x" * 500)
    assert "--steps must be numbers joined by commas, got 'xxxxxxxx" in text and "x...x" in text, text
    assert len(text) < 200
    text = refused("demo", "--redis", "y" * 500)
    assert "--redis must be" in text and "..." in text and len(text) < 200, text


@pytest.mark.parametrize("url", ["http://:hunter2-pw@127.0.0.1:6379", "redis://:hunter2-pw@127.0.0.1:port/0",
                                 "redis://user:hunter2-pw@[::1", "ftp://h/0?password=hunter2-pw"])
def test_a_bad_redis_url_is_refused_with_its_password_masked(url: str) -> None:
    text = refused("demo", "--redis", url)
    assert "ragguard demo: --redis " in text and "Traceback" not in text, text
    assert "hunter2" not in text and "***" in text, text  # not even the first characters of it
