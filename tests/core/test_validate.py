"""The one module of option validators: ranges, types, units and bounded messages."""

from __future__ import annotations

import math
import re
from datetime import timedelta

import pytest

from ragguard import ConfigError, _validate


@pytest.mark.parametrize(
    ("value", "allow_zero", "max_s", "expected"),
    [
        (1, False, None, 1.0),
        (0, True, None, 0.0),
        (timedelta(milliseconds=250), False, None, 0.25),
        (3600, False, 3600, 3600.0),
    ],
)
def test_seconds_accepts_numbers_and_timedeltas(
    value: object, allow_zero: bool, max_s: float | None, expected: float
) -> None:
    got = _validate.seconds("wait_s", value, allow_zero=allow_zero, max_s=max_s)
    assert got == expected and type(got) is float


@pytest.mark.parametrize(
    "bad", [0, -1, True, math.nan, math.inf, -math.inf, 10**400, -(10**400), "1", None, timedelta(0), 3601]
)
def test_seconds_refuses_with_the_option_named(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        _validate.seconds("wait_s", bad, max_s=3600)
    assert info.value.field == "wait_s" and str(info.value).startswith("wait_s must be")


def test_counts_sizes_fractions_and_percentages() -> None:
    assert _validate.count("n", 3, 1, 5) == 3
    assert _validate.size("buf", 2**20) == 2**20
    assert _validate.fraction("f", 1) == 1.0 and _validate.percent("p", 100) == 100.0
    for call in (
        lambda: _validate.count("n", True, 0),  # a bool is not a count
        lambda: _validate.count("n", 6, 1, 5),
        lambda: _validate.count("n", 2.0, 1, 5),
        lambda: _validate.size("buf", 0),
        lambda: _validate.size("buf", 2**63),
        lambda: _validate.fraction("f", 1.0, below_one=True),
        lambda: _validate.fraction("f", -0.1),
        lambda: _validate.percent("p", 0),
        lambda: _validate.number("m", math.nan),
        lambda: _validate.function("fn", 42, "exc -> bool"),
    ):
        with pytest.raises(ConfigError):
            call()


@pytest.mark.parametrize(
    "huge",
    [10**5000, "x" * 10**6, list(range(10**5)), {str(i): i for i in range(10**4)}, b"\xff" * 10**5],
    ids=["int of 5001 digits", "1 MB str", "100k list", "10k dict", "100 kB bytes"],
)
def test_messages_show_a_bounded_excerpt_of_any_value(huge: object) -> None:
    with pytest.raises(ConfigError) as info:
        _validate.seconds("s", huge)
    rule = "s must be a finite number of seconds > 0, got "
    assert len(str(info.value)) <= len(rule) + _validate.SHOWN_CHARS


def test_shown_survives_a_broken_repr() -> None:
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    text = _validate.shown(Hostile())
    assert "Hostile" in text and len(text) <= _validate.SHOWN_CHARS


# -- a value cut to fit a message ends with an ellipsis, never mid-word (user report: ": u") --------


def _long_value_refusals() -> list[tuple[str, str]]:
    """(message, the long value's first characters) of each message that echoes a caller's value."""
    from ragguard import InvalidInput, Policy
    from ragguard._context import validate_tenant_id
    from ragguard._http import parse_timeout_ms
    from ragguard.layers import layer_policy_model
    from ragguard.overload._priority import parse_priority

    out = []
    for call, head in (
        (lambda: validate_tenant_id("bad id " + "t" * 500), "bad id tttt"),
        (lambda: parse_priority("p" * 500), "pppp"),
        (lambda: parse_timeout_ms("9" * 500), "9999"),
        (lambda: layer_policy_model("n" * 500), "nnnn"),
        (lambda: Policy.parse({"stages": {"embedding": {"preset": "s" * 500}}}), "ssss"),
    ):
        with pytest.raises((InvalidInput, ValueError)) as info:
            call()
        out.append((str(info.value), head))
    return out


def test_values_cut_to_fit_a_message_end_with_an_ellipsis() -> None:
    for message, head in _long_value_refusals():
        assert head in message and len(message) < 600, message
        run = re.search(re.escape(head) + re.escape(head[-1]) + "*", message)  # the value as shown
        assert run is not None, message
        assert message[run.end() :].startswith("..."), f"cut without an ellipsis: {message!r}"
