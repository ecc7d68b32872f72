"""The adaptive concurrency limit: a gradient of the dependency's latency against its baseline.

Our own algorithm, after Envoy's adaptive concurrency filter and Netflix's Gradient2 (no code is
shared), with TCP's slow start and multiplicative decrease. Latency samples of finished calls are
gathered in windows of ``window_s`` seconds (at least ``min_samples`` each); at the end of a window,
with ``rtt`` the window's ``percentile`` latency, ``min_rtt`` the baseline and ``used`` the most
calls in flight during the window::

    gradient = min_rtt * (1 + tolerance) / rtt                       # Envoy's (minRTT + buffer) / RTT
    cap      = max(limit, growth * used)                             # failsafe-go: grow only while used
    if the percentile falls on a call that ran out of time:          # (see below)
        limit = min(limit, used) / 2                                 #   halve what was in use, at once
    elif rtt <= min_rtt * (1 + min(tolerance / 2, 0.25)):            # no queue to speak of
        limit = min(2 * limit, cap)                                  #   slow start: double
    elif gradient >= 1:                                              # within tolerance
        limit += smoothing * (min(limit + sqrt(limit), cap) - limit) #   grow gently
    elif gradient <= 0.5:                                            # a queue of twice the tolerance
        limit = min(limit, used) / 2                                 #   halve what was in use, at once
    else:                                                            # past the tolerance
        limit = min(limit + smoothing * (limit * gradient - limit),  #   shrink in proportion,
                    used)                                            #   to at most what was in use
    limit = clamp(limit, min_limit, max_limit)

so the limit settles where the dependency's latency is its baseline plus the tolerance: for a
dependency of K parallel workers, about K x (1 + tolerance), and gets there from any start within a
few windows (a limit far below it doubles each window; one far above it halves). "No queue to speak
of" is within half the tolerance and at most 25% of the baseline: a generous tolerance does not widen
it (slow start under load would double the limit on a lucky window). Unlike Envoy's and
Gradient2's ``gradient x limit + headroom``, the sqrt(limit) headroom is added only while the
latency is within tolerance: at the small limits of a nearly serial dependency a standing headroom
would keep a queue of several calls (and twice the latency) for good. The limit grows only while
the calls in flight use it (a limit nobody reaches does not drift up to the ceiling and then let a
burst through), and past the tolerance the limit is at most what was in use (a limit above the
calls in flight protected nothing: grown to twice them while the latency was low, it would let the
calls in flight double into a dependency that just slowed down, before the slower answers come back
to say so); a large excess halves what was in use. Admission compares the calls in flight with the
float limit: a limit of 1.5 admits two calls (:func:`admits`).

A call that ran out of time (its attempt timer or its request's deadline cut it after more than the
baseline) is a sample too, censored: its latency is unknown, only that it was longer than its caller
allowed. It ranks above every measured latency of its window, and a window whose ``percentile`` falls on
such a call halves the limit from what was in use (as a queue of twice the tolerance does); a window
with any such call never raises the limit. Counted at
the moment it was cut, as a latency like any other, it could never pass a tolerance wider than the
timeout: with a baseline learnt under load, ``min_rtt * (1 + tolerance)`` can lie beyond the timeout,
and a limit at its ceiling would then never shrink while every call timed out.

The baseline is re-measured every ``probe_interval_s`` seconds, the start of each probe delayed by
a random share (up to ``probe_jitter``) of the interval drawn from the Guard's seeded rng, so that
replicas do not probe together (Envoy's minRTT window): for ``probe_samples`` calls the limit is
pinned to ``probe_limit`` (within ``min_limit`` and ``max_limit``), and the probe's ``percentile``
latency becomes ``min_rtt``. Only calls admitted after the probe began count (given their admission
time, ``admitted_at``): the calls already in flight when it begins were admitted under the old limit
and waited in the queue it built, so under load they would make the queue the baseline, which is what
the probe exists to remove. A call that ran out of time says nothing of the baseline and does not
count either. A probe also starts when the limit has sat at its floor for 5 windows (the baseline may
be stale). Two windows in a row whose latency is below the baseline lower it to the larger of the two
(one window may be a lucky few samples: the baseline must not ratchet down to noise).

Pressure from outside (event-loop lag, a starved Redis pool, out-of-memory) multiplies the limit
by ``backoff``, at most once per window.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["GradientLimit", "LimitSettings", "admits"]


def admits(limit: float) -> int:
    """How many calls a (float) limit admits at once: calls in flight < limit, so ceil(limit), at
    least 1 (a hair over an integer, from float arithmetic, does not count)."""
    return max(1, math.ceil(limit - 1e-9))


@dataclass(frozen=True, slots=True)
class LimitSettings:
    """The limit's options (see :class:`ragguard.AdaptivePolicy` for units and ranges)."""

    min_limit: int = 1
    max_limit: int = 256
    initial_limit: int = 16
    tolerance: float = 0.5
    percentile: float = 0.5
    window_s: float = 0.25
    min_samples: int = 8
    smoothing: float = 0.5
    growth: float = 2.0
    probe_interval_s: float = 30.0
    probe_jitter: float = 0.15
    probe_samples: int = 25
    probe_limit: int = 3
    backoff: float = 0.8


_FLOOR_WINDOWS_BEFORE_PROBE = 5


class GradientLimit:
    """The limit of one stage (see the module docstring). ``now`` values are the Guard clock's
    seconds; ``rng`` (a seeded :class:`random.Random`) draws the probes' jitter.

    ``limit`` is the current limit (a float; the admission compares in-flight calls with it, so
    it admits :func:`admits` (``ceil``) calls at once);
    ``min_rtt`` the baseline in seconds (None until the first probe ends); ``probing`` whether a
    baseline probe is under way."""

    __slots__ = (
        "_below",
        "_cut",
        "_floor_windows",
        "_max_in_flight",
        "_pressed_at",
        "_probe",
        "_probe_began",
        "_samples",
        "_saved_limit",
        "_window_start",
        "changes",
        "last_rtt",
        "limit",
        "min_rtt",
        "next_probe",
        "probing",
        "rng",
        "settings",
    )

    def __init__(self, settings: LimitSettings, *, now: float, rng: random.Random) -> None:
        self.settings = settings
        self.rng = rng
        self.limit = float(min(max(settings.initial_limit, settings.min_limit), settings.max_limit))
        self.min_rtt: float | None = None
        self.last_rtt: float | None = None
        self._samples: list[float] = []
        self._cut: list[float] = []  # the window's calls that ran out of time: how long they had
        self._window_start = now
        self._max_in_flight = 0
        self._floor_windows = 0
        self._below: float | None = None  # the last window's latency, when it was under the baseline
        self._pressed_at = -math.inf
        self.changes = 0
        # the first baseline is measured at once: start in a probe
        self.probing = True
        self._saved_limit = self.limit
        self.limit = _probe_limit(settings)
        self._probe: list[float] = []
        self._probe_began = now
        self.next_probe = math.inf

    # -- samples -----------------------------------------------------------------------------------

    def sample(
        self, now: float, rtt_s: float, in_flight: int, *, admitted_at: float | None = None, cut: bool = False
    ) -> bool:
        """Record one finished call that took ``rtt_s`` seconds with ``in_flight`` calls (itself
        included) in flight when it was admitted at clock time ``admitted_at`` (None: unknown, taken
        as admitted now); ``cut``: the call ran out of time after ``rtt_s`` seconds, its latency
        unknown but longer than its caller allowed (a censored sample, see the module docstring).
        True when the limit changed."""
        if self.probing:
            if cut or (admitted_at is not None and admitted_at < self._probe_began):
                return False  # out of time, or admitted under the old limit: not the baseline
            self._probe.append(rtt_s)
            if len(self._probe) >= self.settings.probe_samples:
                self._end_probe(now)
                return True
            return False
        (self._cut if cut else self._samples).append(rtt_s)
        if in_flight > self._max_in_flight:
            self._max_in_flight = in_flight
        s = self.settings
        if now - self._window_start >= s.window_s and len(self._samples) + len(self._cut) >= s.min_samples:
            return self._update(now)
        if now >= self.next_probe:
            self._start_probe(now)
            return True
        return False

    @property
    def saved_limit(self) -> float:
        """The limit a probe under way will give back when it ends (the limit itself otherwise)."""
        return self._saved_limit if self.probing else self.limit

    def press(self, now: float) -> bool:
        """Outside pressure (loop lag, pool wait, out-of-memory): multiply the limit by
        ``backoff``, at most once per window; True when it changed."""
        s = self.settings
        if now - self._pressed_at < s.window_s:
            return False
        self._pressed_at = now
        if self.probing:
            self._saved_limit = max(float(s.min_limit), self._saved_limit * s.backoff)
            return False
        new = max(float(s.min_limit), self.limit * s.backoff)
        changed = new != self.limit
        self.limit = new
        self.changes += changed
        return changed

    # -- internals ---------------------------------------------------------------------------------

    def _update(self, now: float) -> bool:
        s = self.settings
        rtt, out_of_time = _censored_percentile(self._samples, self._cut, s.percentile)
        any_cut = bool(self._cut)
        self.last_rtt = rtt
        used = self._max_in_flight
        self._samples = []
        self._cut = []
        self._max_in_flight = 0
        self._window_start = now
        base = self.min_rtt
        if base is None:
            self.min_rtt = base = rtt
        elif out_of_time:  # rtt is only a lower bound: no baseline to learn from it
            self._below = None
        elif rtt < base:  # two windows in a row under the baseline lower it (one may be noise)
            if self._below is not None:
                self.min_rtt = base = max(rtt, self._below)
                self._below = None
            else:
                self._below = rtt
        else:
            self._below = None
        limit = self.limit
        gradient = base * (1.0 + s.tolerance) / rtt if rtt > 0 else 2.0
        if out_of_time:  # most calls ran out of time: halve what was in use, whatever the tolerance
            new = 0.5 * min(limit, max(float(used), 1.0))
        elif rtt <= base * (1.0 + min(s.tolerance / 2, 0.25)):  # no queue to speak of: slow start
            new = min(2.0 * limit, max(limit, s.growth * used))
        elif gradient >= 1.0:
            target = min(limit + math.sqrt(limit), max(limit, s.growth * used))
            new = limit + s.smoothing * (target - limit)
        elif gradient <= 0.5:  # a queue of twice the tolerance: halve what was in use, at once
            new = 0.5 * min(limit, max(float(used), 1.0))  # (a limit above it protected nothing)
        else:  # past the tolerance: shrink in proportion, and no higher than what was in use
            new = min(limit + s.smoothing * (limit * gradient - limit), max(float(used), 1.0))
        if any_cut and new > limit:  # calls ran out of time: no more of them
            new = limit
        new = min(float(s.max_limit), max(float(s.min_limit), new))
        changed = admits(new) != admits(limit)
        self.limit = new
        self.changes += changed
        if new <= s.min_limit:
            self._floor_windows += 1
            if self._floor_windows >= _FLOOR_WINDOWS_BEFORE_PROBE:
                self._start_probe(now)
                return True
        else:
            self._floor_windows = 0
        if now >= self.next_probe:
            self._start_probe(now)
            return True
        return changed

    def _start_probe(self, now: float) -> None:
        s = self.settings
        self.probing = True
        self._saved_limit = self.limit
        self.limit = _probe_limit(s)
        self._probe = []
        self._probe_began = now
        self._floor_windows = 0
        self.changes += 1

    def _end_probe(self, now: float) -> None:
        s = self.settings
        self.min_rtt = _percentile(self._probe, s.percentile)
        self._probe = []
        self.probing = False
        self.limit = self._saved_limit
        self._samples = []
        self._cut = []
        self._max_in_flight = 0
        self._window_start = now
        self.next_probe = now + s.probe_interval_s * (1.0 + self.rng.uniform(0.0, s.probe_jitter))
        self.changes += 1


def _probe_limit(s: LimitSettings) -> float:
    """The limit during a baseline probe: ``probe_limit``, within the floor and the ceiling."""
    return float(min(max(s.probe_limit, s.min_limit), s.max_limit))


def _censored_percentile(measured: list[float], cut: list[float], q: float) -> tuple[float, bool]:
    """The ``q`` quantile (0..1, nearest rank) of a window whose ``cut`` calls ran out of time (each
    longer than any measured one: censored), and whether it falls on one of them (then the value is
    how long that call had, a lower bound). Not both empty."""
    n = len(measured) + len(cut)
    rank = min(n - 1, max(0, math.ceil(q * n) - 1))
    if rank < len(measured):
        return sorted(measured)[rank], False
    return sorted(cut)[rank - len(measured)], True


def _percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` (nearest rank; not empty)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
