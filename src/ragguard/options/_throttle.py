"""The throttle layer's options (:mod:`ragguard.layers._throttle`): client-side adaptive throttling.
"""

from __future__ import annotations

from pydantic import Field

from ._base import Options

__all__ = ["ThrottlePolicy"]


class ThrottlePolicy(Options):
    """Client-side adaptive throttling of a stage whose dependency rejects calls (Google SRE book,
    "Handling Overload"): a call is refused locally with probability
    ``min(max_reject, max(0, (requests - k * accepts) / (requests + 1)))`` over the last
    ``window_s`` seconds of the Guard's clock.

    - ``k``: how many times the accepted calls the client may send, >= 1 (the book's 2).
    - ``window_s``: seconds of history, (0, 3600] (the book's two minutes; default 60).
    - ``max_reject``: the highest refusal probability, [0, 1): a trickle always probes.
    """

    k: float = Field(default=2.0, ge=1, le=100)
    window_s: float = Field(default=60.0, gt=0, le=3600)
    max_reject: float = Field(default=0.9, ge=0, lt=1)
