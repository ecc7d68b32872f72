"""BatchLimiter: halve on out-of-memory down to a floor, grow back slowly (AIMD) on the clock."""

from __future__ import annotations

import pytest

from ragguard import ConfigError, FakeClock
from ragguard.rag._rerank import BatchLimiter


def test_unlimited_until_the_first_out_of_memory_then_halving_to_the_floor() -> None:
    limiter = BatchLimiter(floor=4, clock=FakeClock())
    assert limiter.allowed(50) == 50
    assert limiter.shrink(20) == 10
    assert limiter.allowed(50) == 10 and limiter.allowed(7) == 7
    assert limiter.shrink(10) == 5
    assert limiter.shrink(5) == 4  # never below the floor
    assert limiter.shrink(4) is None  # at the floor: nothing smaller to try
    assert limiter.limit == 4


def test_it_grows_by_a_quarter_after_a_run_of_successes_at_the_limit() -> None:
    limiter = BatchLimiter(floor=2, grow_after=3, grow_after_s=1000, clock=FakeClock())
    limiter.shrink(32)
    assert limiter.limit == 16
    limiter.succeeded(8)  # below the limit: says nothing about the limit
    limiter.succeeded(16)
    limiter.succeeded(16)
    assert limiter.limit == 16
    limiter.succeeded(16)
    assert limiter.limit == 20
    limiter.shrink(20)
    assert limiter.limit == 10  # a new OOM resets the run


def test_it_grows_after_grow_after_s_of_the_clock_with_a_success() -> None:
    clock = FakeClock()
    limiter = BatchLimiter(floor=1, grow_after=100, grow_after_s=30, clock=clock)
    limiter.shrink(8)
    clock.advance(29)
    limiter.succeeded(4)
    assert limiter.limit == 4
    clock.advance(1)
    limiter.succeeded(4)
    assert limiter.limit == 5  # at least one more


def test_a_limit_learnt_by_one_call_is_not_raised_by_a_larger_shrink() -> None:
    limiter = BatchLimiter(floor=1, clock=FakeClock())
    limiter.shrink(8)
    limiter.shrink(40)  # a concurrent call that started before the limit was learnt
    assert limiter.limit == 4


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"floor": 0}, "floor"),
        ({"floor": True}, "floor"),
        ({"grow_after": 0}, "grow_after"),
        ({"grow_after_s": 0}, "grow_after_s"),
        ({"grow_after_s": float("nan")}, "grow_after_s"),
    ],
)
def test_bad_options_are_config_errors_naming_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        BatchLimiter(clock=FakeClock(), **options)  # type: ignore[arg-type]
