"""The options of a stage keyed by deployment, of a deployment's limits and of a model group.

- :class:`LimitsPolicy`: the ``limits`` layer's options: requests and tokens per window of one
  deployment (a key of a keyed stage, or an unkeyed stage as a whole), shared across replicas.
- :class:`DeploymentPolicy` and :class:`GroupPolicy`: a model group (``Policy.groups``): its
  deployments, each bound to a callable by name in code, and how a call picks one.
- :func:`key_id`: what a caller's key becomes in names (Redis keys, breaker names, metric labels):
  at most :data:`MAX_KEY_ID` characters of ``A-Z a-z 0-9 . _ : / @ + = -``; a key with other
  characters, or longer, is cut and marked with a digest of the whole (``~`` and 12 hex digits), so
  two keys never share a name and no caller's string reaches a name unbounded.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ._base import Options

__all__ = [
    "KEY_CHARS",
    "MAX_KEY_ID",
    "STRATEGIES",
    "DeploymentPolicy",
    "GroupPolicy",
    "LimitsPolicy",
    "check_key_id",
    "key_id",
]

MAX_KEY_ID = 100
"""The longest key id, in characters."""
KEY_CHARS = "A-Z a-z 0-9 . _ : / @ + = -"
"""The characters a key id is made of (a key with others is given a digest: see :func:`key_id`)."""

_KEY_RE = re.compile(rf"[A-Za-z0-9._:/@+=-]{{1,{MAX_KEY_ID}}}")
_UNSAFE_RE = re.compile(r"[^A-Za-z0-9._:/@+=-]")
_KEPT = 60  # characters of an unsafe key kept before its digest


def key_id(raw: str) -> str:
    """``raw`` (a caller's key) as a name that is safe in Redis keys, breaker names and metric
    labels: itself when it is 1 to :data:`MAX_KEY_ID` characters of :data:`KEY_CHARS`, else its
    first 60 characters made safe (others become ``_``) followed by ``~`` and 12 hex digits of a
    BLAKE2b digest of the whole, so distinct keys keep distinct ids."""
    if _KEY_RE.fullmatch(raw) is not None:
        return raw
    digest = hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()
    return f"{_UNSAFE_RE.sub('_', raw[:_KEPT])}~{digest}"


def check_key_id(value: str, what: str) -> str:
    """``value`` when it is a key id as :func:`key_id` leaves it, else ValueError naming ``what``."""
    if not isinstance(value, str) or _KEY_RE.fullmatch(value) is None:
        shown = repr(value)[:60]
        raise ValueError(f"{what} must be 1 to {MAX_KEY_ID} characters of {KEY_CHARS}, got {shown}")
    return value


class LimitsPolicy(Options):
    """A deployment's limits: requests and tokens per ``window_s``, for each key of a keyed stage
    (a key's own in ``keys: {<key>: {limits: ...}}``; the overflow instance has one set for all the
    keys it serves), or for an unkeyed stage as a whole. Shared by every replica through the
    Guard's backend (Redis), else per process. A call over a limit is refused at once, before it
    is sent, with :class:`~ragguard.Overloaded` (``reason`` ``requests`` or ``tokens``, and the
    wait until the limit admits it): a fallback or a model group's next deployment serves it.

    - ``rpm``: calls per window (a GCRA bucket of ``rpm`` calls refilled at ``rpm / window_s``
      per second), >= 1; a call counts once, its retries included.
    - ``tpm``: input + output tokens per window, >= 1, for the generation preset's streams (the
      OpenAI and Anthropic integrations' calls are such streams): each reserves its estimate
      before it is sent (the input text / 4 and its output bound) and settles with the usage the
      provider reports when it ends (a debt the next calls wait for when it used more).
    - ``window_s``: the window, seconds, > 0 (default 60: ``rpm`` and ``tpm`` are per minute).

    What one bucket admits: in any interval of ``T`` seconds at most ``limit x (1 + T /
    window_s)`` (the bucket full at its start, plus what refills), so up to twice the limit in
    one window that starts full, and the limit per window sustained; tokens beyond the estimates
    are charged when they are reported.
    """

    rpm: int | None = Field(default=None, ge=1, le=1_000_000_000)
    tpm: int | None = Field(default=None, ge=1, le=1_000_000_000_000)
    window_s: float = Field(default=60.0, gt=0, le=31 * 86_400)

    @property
    def limits_anything(self) -> bool:
        return self.rpm is not None or self.tpm is not None


STRATEGIES = ("ordered", "weighted", "least_busy", "latency")
"""How a model group orders the deployments of one priority (see :class:`GroupPolicy`)."""


class DeploymentPolicy(Options):
    """One deployment of a model group.

    - ``name``: unique in the group; the code binds it to a callable (``guard.group(name,
      {deployment: callable})``); a plain callable's calls run as the key ``name`` of the group's
      stage. 1 to 100 characters of ``A-Z a-z 0-9 . _ : / @ + = -``.
    - ``model``: passed as ``model=`` to the callable (a wrapped OpenAI or Anthropic client, a
      function that takes ``model``), replacing the caller's; None: the caller's is kept.
    - ``priority``: lower first, >= 0 (default 0): the deployments of the lowest priority are
      tried first, the next priority only when all of those are out.
    - ``weight``: the deployment's share under the ``weighted`` strategy, > 0 (default 1).
    - ``context_window``: the model's context window in tokens (None: unknown); a request a
      deployment refused as too long goes to one with a larger window.
    - ``limits``: its requests and tokens per window (:class:`LimitsPolicy`), shared across
      replicas; a deployment whose limits are spent is skipped.
    """

    name: str
    model: str | None = Field(default=None, min_length=1, max_length=200)
    priority: int = Field(default=0, ge=0, le=1000)
    weight: float = Field(default=1.0, gt=0, le=1e6)
    context_window: int | None = Field(default=None, ge=1, le=100_000_000)
    limits: LimitsPolicy | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_key_id(value, "a deployment's name")


class GroupPolicy(Options):
    """A model group: deployments of one model (or of interchangeable ones) that a call may go to.

    - ``deployments``: 1 to 64 :class:`DeploymentPolicy`, names unique.
    - ``strategy``: how the deployments of one priority are ordered for a call: ``ordered`` (as
      listed), ``weighted`` (a random order drawn by ``weight``), ``least_busy`` (fewest calls in
      flight first) or ``latency`` (lowest recent latency first; a deployment without one yet
      first). Default ``ordered``.
    - ``stage``: the stage a plain callable's calls run as, keyed by the deployment's name (None:
      the group's own name); a wrapped client's run as its own stage (``openai``, ``anthropic``)
      under its own key. Each deployment has its own breaker, budgets and limits there.
    - ``max_tries``: deployments tried at most per call, >= 1 (None: every one).

    A call skips a deployment whose breaker is open (its cooldown) or whose limits are spent and
    goes to the next within the request's deadline; a stream goes to the next only before its
    first item. When none is left the call raises :class:`~ragguard.NoDeploymentAvailable` with
    the soonest time one comes back.
    """

    deployments: list[DeploymentPolicy] = Field(min_length=1, max_length=64)
    strategy: Literal["ordered", "weighted", "least_busy", "latency"] = "ordered"
    stage: str | None = Field(default=None, min_length=1, max_length=200)
    max_tries: int | None = Field(default=None, ge=1, le=64)

    @model_validator(mode="after")
    def _unique(self) -> GroupPolicy:
        seen: set[str] = set()
        for deployment in self.deployments:
            if deployment.name in seen:
                raise ValueError(f"deployment name {deployment.name!r} is given twice")
            seen.add(deployment.name)
        return self

    def deployment(self, name: str) -> DeploymentPolicy | None:
        """The deployment called ``name`` (None: none)."""
        return next((d for d in self.deployments if d.name == name), None)
