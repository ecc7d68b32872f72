"""The kinds of a call's outcome and the :class:`Outcome` record every layer reads.

::

    Outcome
     kind            one of Kind (below)
     reached         the request may already have reached the dependency (False: it cannot have:
                     a refused connection, a local refusal); a non-idempotent stage retries only
                     when this is False
     retry_after_s   the wait the dependency stated (Retry-After, retry-after-ms, rate-limit
                     resets, gRPC pushback), in seconds, clamped to [0, MAX_STATED_WAIT_S]; None
                     when it stated none
     reason          a finer word within the kind (see REASONS): among the caller's errors,
                     ``context_length`` (the request is longer than the model's context window)
                     and ``content_policy`` (the provider's content policy refused it) say what
                     a stage's routed fallbacks and the generation preset's shrink act on
     status          the HTTP status (or 0) the outcome was read from, when there was one
     retry           the dependency's own word on retrying this request (an ``x-should-retry:
                     true|false`` header, read as the OpenAI and Anthropic SDKs read it), which
                     the retry layer follows over what the kind and the status say; None when it
                     said nothing
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .._waits import MAX_STATED_WAIT_S, clamp_wait

__all__ = [
    "CONTENT_POLICY",
    "CONTEXT_LENGTH",
    "MAX_STATED_WAIT_S",
    "REASONS",
    "Kind",
    "Outcome",
    "clamp_wait",
]



class Kind(enum.Enum):
    """What one call's end says about its dependency (values are the names used in events/docs).

    - ``SUCCESS``: it answered.
    - ``FAILURE``: the dependency failed: connection refused or reset, unreachable, a 5xx,
      gRPC ``UNAVAILABLE``/``INTERNAL``, out of memory. Counted by every breaker kind.
    - ``REJECTION``: the dependency refused the call for lack of capacity (429, 529,
      ``RESOURCE_EXHAUSTED``, an overload event inside a stream), often stating a wait.
    - ``TIMEOUT``: the dependency was too slow (a timeout, 408, 504, ``DEADLINE_EXCEEDED``, the
      stage's own ``timeout_s``). Counted by every breaker kind.
    - ``CALLER_ERROR``: the request was wrong (4xx other than 408/429, bad input, auth, not found,
      context length, content policy): never counted against the dependency, never retried,
      passed on as it is (unless the stage routes its reason: ``on_context_length=``,
      ``on_content_policy=``).
    - ``CANCELLED``: the call was cancelled (not an ``Exception``): no outcome at all.
    - ``REFUSED``: ragguard itself refused the call before it could reach the dependency (an open
      breaker, the tenant's quota, an adaptive limit or throttle shedding it).
    - ``DEADLINE``: the request's own time budget ran out (the caller's, not the dependency's).
    - ``UNKNOWN``: no classifier recognises the error (most likely a bug in the calling code):
      only the generic breaker counts it, and a front door leaves it to the application.
    """

    __hash__ = object.__hash__  # a member is its own identity (Enum's hashes its name, in Python)

    SUCCESS = "success"
    FAILURE = "failure"
    REJECTION = "rejection"
    TIMEOUT = "timeout"
    CALLER_ERROR = "caller_error"
    CANCELLED = "cancelled"
    REFUSED = "refused"
    DEADLINE = "deadline"
    UNKNOWN = "unknown"


CONTEXT_LENGTH = "context_length"
"""The ``reason`` of a caller's error that says the request is longer than the model's context
window (OpenAI's ``context_length_exceeded``, Anthropic's "prompt is too long", vLLM's and TGI's
validation errors): a larger model, or fewer passages, may answer it."""
CONTENT_POLICY = "content_policy"
"""The ``reason`` of a caller's error that says the provider's content policy refused the request
or its answer (OpenAI's ``content_filter``/``content_policy_violation``/``invalid_prompt``,
Anthropic's "Output blocked by content filtering policy")."""

REASONS = {
    Kind.FAILURE: ("connection", "status", "protocol", "out_of_memory", "stream"),
    Kind.REJECTION: ("status", "stream"),
    Kind.TIMEOUT: ("timeout", "status", "stage"),
    Kind.CALLER_ERROR: (
        "input", "request", "auth", "not_found", "conflict", "status", "context_length", "content_policy",
    ),
    Kind.REFUSED: ("breaker", "quota", "overloaded"),
}
"""The ``reason`` words each kind uses (a user's classifier may use others)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One call's outcome as every layer and front door reads it (see the module docstring).

    Build one with :meth:`of` to have ``retry_after_s`` clamped."""

    kind: Kind
    reached: bool = True
    retry_after_s: float | None = None
    reason: str = ""
    status: int = 0
    retry: bool | None = None

    @classmethod
    def of(
        cls,
        kind: Kind,
        *,
        reached: bool = True,
        retry_after_s: object = None,
        reason: str = "",
        status: int = 0,
    ) -> Outcome:
        """An outcome with ``retry_after_s`` clamped by :func:`clamp_wait` (never raises)."""
        return cls(kind, bool(reached), clamp_wait(retry_after_s), reason, status)

    @property
    def counts_as_outage(self) -> bool:
        """True for a dependency failure or timeout: what every breaker kind counts."""
        return self.kind is _FAILURE or self.kind is _TIMEOUT

    @property
    def from_dependency(self) -> bool:
        """True when the dependency itself said something bad (failure, rejection, timeout)."""
        return self.kind in _FROM_DEPENDENCY

    @property
    def out_of_memory(self) -> bool:
        """True for a failure that ran out of (host or accelerator) memory."""
        return self.kind is _FAILURE and self.reason == "out_of_memory"


_FAILURE, _TIMEOUT = Kind.FAILURE, Kind.TIMEOUT  # (a look-up of ``Kind.FAILURE`` costs a descriptor call)
_FROM_DEPENDENCY = frozenset({Kind.FAILURE, Kind.REJECTION, Kind.TIMEOUT})
