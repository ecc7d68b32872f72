"""The adaptive limit's algorithm on a simulated dependency, on fake time (no sleeping)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from ragguard.overload._gradient import GradientLimit, LimitSettings


def _saturated(limit: GradientLimit, capacity: list[float], base_s: float, until_s: float, t: float,
               trace: list[tuple[float, float]]) -> float:
    """Drive ``limit`` with a dependency of ``capacity[0]`` parallel workers (latency ``base_s``
    while the calls in flight fit, growing in proportion past them) and more demand than any
    limit: every slot is always used. Returns the time reached."""
    rng = random.Random(3)
    while t < until_s:
        n = max(1, int(limit.limit))
        rtt = base_s * max(1.0, n / capacity[0]) * rng.uniform(0.95, 1.05)
        t += rtt
        for i in range(n):
            limit.sample(t + i * 1e-6, rtt, n)
        trace.append((t, limit.limit))
    return t


def _steady(trace: list[tuple[float, float]], start: float, end: float) -> float:
    values = [v for at, v in trace if start <= at < end]
    return sum(values) / len(values)


def test_the_limit_follows_a_capacity_halving_within_a_few_seconds() -> None:
    settings = LimitSettings(min_limit=1, max_limit=500, initial_limit=10, probe_interval_s=600.0)
    limit = GradientLimit(settings, now=0.0, rng=random.Random(1))
    capacity = [40.0]
    trace: list[tuple[float, float]] = []
    t = _saturated(limit, capacity, 0.02, 10.0, 0.0, trace)
    before = _steady(trace, 8.0, 10.0)
    assert limit.min_rtt == pytest.approx(0.02, rel=0.1)
    # the limit settles above the capacity (a small queue: sqrt(limit)), not at the ceiling
    assert 40 <= before <= 120

    capacity[0] = 20.0  # the dependency loses half its workers
    changed_at = t
    t = _saturated(limit, capacity, 0.02, changed_at + 10.0, t, trace)
    after = _steady(trace, changed_at + 8.0, changed_at + 10.0)
    assert 0.35 <= after / before <= 0.7

    # converged: from some point within 3 s of the change on, the limit stays within 25% of its new level
    settled_at = next(
        at for at, _ in trace
        if at >= changed_at and all(abs(v - after) <= 0.25 * after for a2, v in trace if a2 >= at)
    )
    assert settled_at - changed_at <= 3.0, settled_at - changed_at

    # and it follows the capacity back up
    capacity[0] = 40.0
    back = t
    _saturated(limit, capacity, 0.02, back + 10.0, t, trace)
    assert _steady(trace, back + 8.0, back + 10.0) == pytest.approx(before, rel=0.3)


def test_a_limit_nobody_uses_does_not_climb() -> None:
    limit = GradientLimit(LimitSettings(initial_limit=10, max_limit=1000, probe_samples=5), now=0.0,
                          rng=random.Random(1))
    t = 0.0
    for _ in range(5):  # the first baseline probe
        t += 0.01
        limit.sample(t, 0.01, 1)
    start = limit.limit
    for _ in range(2000):  # fast answers, but never more than 3 calls in flight
        t += 0.01
        limit.sample(t, 0.01, 3)
    assert limit.limit <= max(start, 2.0 * 3)


def test_the_baseline_is_re_measured_periodically_with_seeded_jitter() -> None:
    s = LimitSettings(initial_limit=20, probe_interval_s=10.0, probe_jitter=0.2, probe_samples=10,
                      probe_limit=3, max_limit=100)

    def run(seed: int, change_at: float = 1e9) -> tuple[list[float], GradientLimit]:
        limit = GradientLimit(s, now=0.0, rng=random.Random(seed))
        probes: list[float] = []
        t, was_probing = 0.0, limit.probing
        while t < 70.0:
            t += 0.005
            rtt = 0.03 if t > change_at else 0.01  # the dependency's own latency rises for good
            if limit.probing and not was_probing:
                probes.append(t)
            was_probing = limit.probing
            limit.sample(t, rtt, max(1, int(limit.limit)))
        return probes, limit

    probes, limit = run(5)
    assert len(probes) >= 5
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    for gap in gaps:  # every interval, plus up to 20% of it
        assert 10.0 <= gap <= 10.0 * 1.2 + 0.1, gaps
    assert len({round(g, 3) for g in gaps}) > 1  # jittered, not a fixed period
    assert probes == run(5)[0]  # the Guard's seeded rng: reproducible
    assert probes != run(6)[0]
    assert limit.min_rtt == pytest.approx(0.01)

    # a slower baseline for good: the limit falls to its floor, which starts a probe at once
    # (Envoy's rule), and the probe measures the new baseline
    probes, limit = run(5, change_at=25.0)
    after = [p for p in probes if p > 25.0]
    assert after and after[0] - 25.0 < 8.0
    assert limit.min_rtt == pytest.approx(0.03)


def test_outside_pressure_backs_the_limit_off_once_per_window() -> None:
    limit = GradientLimit(LimitSettings(initial_limit=40, probe_samples=1, backoff=0.5, window_s=1.0),
                          now=0.0, rng=random.Random(1))
    limit.sample(0.0, 0.01, 1)  # ends the first probe: the limit is back at 40
    assert limit.limit == 40
    assert limit.press(1.0)
    assert limit.limit == 20
    assert not limit.press(1.5)  # same window
    assert limit.press(2.1)
    assert limit.limit == 10
    for now in range(3, 40):
        limit.press(float(now))
    assert limit.limit == 1  # never below the floor
    assert not math.isnan(limit.limit)


def test_the_start_up_probe_never_goes_below_min_limit() -> None:
    limit = GradientLimit(LimitSettings(min_limit=4, initial_limit=8), now=0.0, rng=random.Random(1))
    assert limit.probing and limit.limit == 4  # probe_limit 3 is below the floor
    high = GradientLimit(LimitSettings(max_limit=2, initial_limit=2), now=0.0, rng=random.Random(1))
    assert high.probing and high.limit == 2  # nor above the ceiling


def test_a_limit_between_1_and_2_admits_a_second_call() -> None:
    """Admission compares the calls in flight with the float limit: 1.5 admits two."""
    from ragguard import FakeClock
    from ragguard.overload._limiter import AdaptiveLimiter, QueueSettings

    clock = FakeClock(auto_advance=False)
    lim = AdaptiveLimiter(
        "s",
        LimitSettings(min_limit=1, initial_limit=1, max_limit=8, probe_limit=1, probe_samples=1, window_s=0.1,
                      min_samples=1),
        QueueSettings(), clock=clock, rng=random.Random(1), timers=clock,
    )
    permit = lim.try_acquire("a")
    assert permit is not None
    lim.release(permit, 0.01)  # ends the start-up probe: the baseline is 10 ms
    clock.advance(0.2)
    permit = lim.try_acquire("a")
    assert permit is not None
    lim.release(permit, 0.014)  # within tolerance, above the slow-start band: 1 + (2 - 1) / 2
    assert lim.gradient.limit == pytest.approx(1.5)
    assert lim.limit == 2
    assert lim.try_acquire("a") is not None and lim.try_acquire("b") is not None
    assert lim.try_acquire("c") is None


def test_a_limit_far_below_the_dependencys_level_doubles_per_window() -> None:
    """Slow start: while a window's latency is within half the tolerance of the baseline (no queue
    to speak of) and the calls in flight use the limit, the limit doubles per window."""
    limit = GradientLimit(LimitSettings(min_limit=1, initial_limit=1, max_limit=1000, probe_limit=1,
                                        probe_samples=1, window_s=0.1, min_samples=1), now=0.0,
                          rng=random.Random(1))
    limit.sample(0.0, 0.01, 1)  # the probe
    seen = []
    t = 0.0
    for _ in range(6):
        t += 0.11
        n = math.ceil(limit.limit)
        limit.sample(t, 0.01, n)
        seen.append(limit.limit)
    assert seen == [2, 4, 8, 16, 32, 64]


def test_a_window_far_over_the_tolerance_halves_the_limit_from_what_was_in_use() -> None:
    limit = GradientLimit(LimitSettings(initial_limit=200, max_limit=256, probe_samples=1, window_s=0.1,
                                        min_samples=1), now=0.0, rng=random.Random(1))
    limit.sample(0.0, 0.01, 1)  # the probe: baseline 10 ms; the limit is back at 200
    assert limit.limit == 200
    limit.sample(0.1, 0.1, 40)  # ten times the baseline, 40 in flight: the limit above 40 protected nothing
    assert limit.limit == 20


def test_a_probe_counts_only_the_calls_admitted_after_it_began() -> None:
    """Calls in flight when a probe begins were admitted under the old limit and waited in the queue
    it built: their latency is not the baseline (under load it would be the queue)."""
    limit = GradientLimit(LimitSettings(initial_limit=32, max_limit=32, probe_samples=3, probe_limit=2,
                                        probe_interval_s=1.0, probe_jitter=0.0, window_s=0.1, min_samples=1),
                          now=0.0, rng=random.Random(1))
    for i in range(3):
        limit.sample(0.01 * (i + 1), 0.01, 1, admitted_at=0.0)  # the first probe: 10 ms
    assert limit.min_rtt == pytest.approx(0.01) and not limit.probing
    limit.sample(1.1, 0.01, 1, admitted_at=1.09)  # past the interval: the next probe begins
    assert limit.probing
    for i in range(10):  # the queue the old limit built drains: 400 ms each, admitted before the probe
        limit.sample(1.2 + 0.01 * i, 0.4, 30, admitted_at=0.9)
    limit.sample(1.3, 0.5, 1, admitted_at=1.15, cut=True)  # one ran out of time: no baseline either
    assert limit.probing
    for i in range(3):
        limit.sample(1.4 + 0.01 * i, 0.012, 1, admitted_at=1.35)
    assert not limit.probing and limit.min_rtt == pytest.approx(0.012)


def test_calls_cut_by_their_timeout_halve_a_limit_whose_tolerance_reaches_past_the_timeout() -> None:
    """A baseline of 200 ms with a tolerance of 2.5 tolerates 700 ms; calls cut at 500 ms by their
    timeout are censored samples, ranked above every measured latency: a window whose median is
    one of them halves the limit from what was in use."""
    s = LimitSettings(initial_limit=32, max_limit=32, tolerance=2.5, probe_samples=1, window_s=0.1,
                      min_samples=5)
    limit = GradientLimit(s, now=0.0, rng=random.Random(1))
    limit.sample(0.0, 0.2, 1)  # the probe: a 200 ms baseline
    assert limit.limit == 32
    for i in range(2):
        limit.sample(0.05 + 0.01 * i, 0.3, 30)  # two answered (within the tolerance)
    for i in range(3):
        limit.sample(0.1 + 0.01 * i, 0.5, 30, cut=True)  # three cut: the median ran out of time
    assert limit.limit == 15
    assert limit.last_rtt == pytest.approx(0.5)  # how long the median call had: a lower bound
    assert limit.min_rtt == pytest.approx(0.2)  # a censored window teaches no baseline
    for i in range(3):
        limit.sample(0.3 + 0.01 * i, 0.3, 15)  # three answered, two cut: the median was measured
    for i in range(2):
        limit.sample(0.35 + 0.01 * i, 0.5, 15, cut=True)
    assert limit.limit == 15  # 300 ms is within the tolerance, but calls ran out of time: no growth


def test_past_the_tolerance_the_limit_comes_down_to_what_was_in_use() -> None:
    """A limit grown to twice the calls in flight (the headroom for bursts) would let them double
    into a dependency that just slowed down before its slower answers say so: past the tolerance
    the limit is at most what was in use (issue 32: in the bench's halving, the calls in flight
    grew from 8-14 to 17-23 and timed out)."""
    limit = GradientLimit(LimitSettings(initial_limit=30, max_limit=32, tolerance=2.5, probe_samples=1,
                                        window_s=0.1, min_samples=1), now=0.0, rng=random.Random(1))
    limit.sample(0.0, 0.07, 1)  # the probe: 70 ms; the limit back at 30
    assert limit.limit == 30
    limit.sample(0.1, 0.3, 12)  # 300 ms with 12 in flight: past 3.5 x 70 = 245 ms, short of twice it
    assert limit.limit == 12
    limit.sample(0.2, 0.25, 20)  # past the tolerance again, 20 in flight: shrink in proportion from 12
    assert limit.limit == pytest.approx(12 + 0.5 * (12 * 0.245 / 0.25 - 12))
