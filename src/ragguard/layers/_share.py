"""The deadline share: a stage spends at most its share of the time the request has left.

A gate of item scope, outside the fallback. When a call starts with ``left`` seconds on the
request's deadline, the stage's own deadline is ``deadline_share * left`` from now: every layer
inside (the fallback and its reserve, the deadline check, the retries and their backoff, each
attempt's timer) reads that one, so a slow or hung stage cannot spend the time of the stages after
it. The stage's code sees it too (``ragguard.remaining()``), and so do the guarded calls it makes.

A stream's own deadline is fixed when it opens and made current again while each later item is
read (never while the caller holds an item: the caller's code runs under the request's deadline).
A stage that runs out of its share raises :class:`~ragguard.DeadlineExceeded`, with a note naming
the share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._deadline import current_expiry, restore, shorten
from .._errors import DeadlineExceeded
from ..pipeline import NO_EXIT, Call
from ._earlier import EarlierDeadline

if TYPE_CHECKING:
    from ._shapes import Bound, Stage

__all__ = ["ShareLayer", "build", "note_share"]


class ShareLayer(EarlierDeadline):
    """Gives the layers inside stage ``stage`` at most ``share`` (0 < share < 1) of the time left."""

    __slots__ = ("_rest", "share", "stage")

    def __init__(self, stage: str, share: float) -> None:
        self.stage = stage
        self.share = share
        self._rest = 1.0 - share

    def enter(self, call: Call) -> Any:
        expiry = current_expiry()
        if expiry is None:
            return NO_EXIT
        if call.items:  # a stream's later item: its own deadline, fixed when it opened
            own = call.share_expiry
            if own is None or own.at >= expiry.at:
                return NO_EXIT
            return shorten(own)
        at = expiry.at
        left = at - expiry.clock()
        if left <= 0.0:
            return NO_EXIT  # spent: the layers inside refuse the call themselves
        own = expiry.sooner(at - self._rest * left)
        if call.stream:
            call.share_expiry = own
        return shorten(own)

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        restore(token)
        if exc is not None and isinstance(exc, DeadlineExceeded):
            outer = current_expiry()
            if outer is not None and outer.left() > 0.0:  # the share ran out, not the request
                note_share(exc, self.stage, self.share)
        return None


_NOTE = "ragguard: stage "


def note_share(exc: DeadlineExceeded, stage: str, share: float) -> None:
    """Say on ``exc`` that the stage's share ran out (once: an error that crosses several stages
    names the first share it hit)."""
    notes = getattr(exc, "__notes__", ())
    if len(notes) < 8 and not any(isinstance(n, str) and n.startswith(_NOTE) for n in notes):
        exc.add_note(
            f"{_NOTE}{stage!r:.80} spent its deadline_share ({share:g} of the time the request had "
            "left when the stage started); the request's own deadline had not passed"
        )


def build(stage: Stage, bound: Bound) -> ShareLayer | None:
    """Only for a stage whose ``deadline_share`` is below 1 (1 or None: the whole deadline)."""
    share = stage.policy.deadline_share
    if share is None or share >= 1.0:
        return None
    return ShareLayer(stage.name, share)
