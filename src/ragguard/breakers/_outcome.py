"""What one call's end means to a breaker: :func:`classify_outcome` and the outcome codes.

The in-memory breaker and the Redis-shared one classify with this one function, so a call counts
the same way whichever breaker records it; the classifiers it asks (``config.classifier``: every
breaker kind's default is a question about :func:`ragguard.outcomes.classify`) are the same
answer every other layer reads. A code is the ``FAILED | SLOW`` bits of the sliding
windows (see ``_window``), :data:`REJECTION` (the dependency turned the call away with a wait, a
rate limit aside: counted by a breaker with a ``rejection_rate_threshold``), or :data:`IGNORED`::

    SUCCESS 0, FAILURE 1, SLOW_SUCCESS 2, SLOW_FAILURE 3, REJECTION 4, IGNORED -1
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import events
from ._classify import judge
from ._window import FAILED, REJECTED, SLOW

if TYPE_CHECKING:
    from ._options import BreakerConfig

__all__ = [
    "FAILURE",
    "IGNORED",
    "OUTCOMES",
    "REJECTION",
    "SLOW_FAILURE",
    "SLOW_SUCCESS",
    "SUCCESS",
    "BreakerCallOutcome",
    "classify_outcome",
    "outcome_name",
]

log = logging.getLogger("ragguard.breakers")

SUCCESS = 0
FAILURE = FAILED
SLOW_SUCCESS = SLOW
SLOW_FAILURE = FAILED | SLOW
REJECTION = REJECTED
IGNORED = -1
OUTCOMES = ("success", "failure", "slow_success", "slow_failure", "rejection")
"""Outcome names indexed by code (the ``outcome`` of :class:`ragguard.events.CallOutcome`)."""


@events.quick_init
@dataclass(frozen=True, slots=True)
class BreakerCallOutcome(events.CallOutcome):
    """A :class:`ragguard.events.CallOutcome` that also carries the exception (None on success)."""

    exception: BaseException | None = field(default=None, repr=False, compare=False)


def outcome_name(code: int) -> str:
    """The event name of outcome ``code``: ``success`` ... ``slow_failure``, or ``ignored``."""
    return "ignored" if code < 0 else OUTCOMES[code]


def classify_outcome(
    config: BreakerConfig, exc: BaseException | None, duration_s: float, *, breaker: str = ""
) -> int:
    """The outcome code of a call that ran ``duration_s`` seconds and raised ``exc`` (None: it
    returned).

    A return is slow when it took longer than ``config.slow_call_duration_s``. An error counts
    (FAILURE) when ``config.classifier(exc)`` is True, and is then slow when it took too long or
    ``config.slow_classifier(exc)`` is True (a timeout was slow whatever its measured duration).
    REJECTION: the classifier said no, the config has a ``rejection_rate_threshold`` and
    :func:`~ragguard.breakers.counts_overloads` says the dependency turned the call away.
    IGNORED: the classifier said no (and it was no such rejection), ``exc`` is a cancellation (not
    an ``Exception``), or a classifier raised (logged, naming ``breaker``): a broken classifier
    never trips a breaker.
    """
    if exc is None:
        return SLOW if duration_s > config.slow_call_duration_s else SUCCESS
    if not isinstance(exc, Exception):
        return IGNORED
    try:
        counted, rejected = judge(config.classifier, exc, config.rejection_rate_threshold is not None)
        if not counted:
            return REJECTION if rejected else IGNORED
        slow_classifier = config.slow_classifier
        slow = duration_s > config.slow_call_duration_s or (
            slow_classifier is not None and bool(slow_classifier(exc))
        )
    except Exception:
        log.exception("classifier of breaker %r raised on %r; the error is not counted", breaker, exc)
        return IGNORED
    return SLOW_FAILURE if slow else FAILURE
