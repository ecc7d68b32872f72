"""The errors ragguard raises.

Every rejection ragguard makes on a caller's behalf derives from one root::

    RagguardError
     +-- BreakerOpen                  fast-failed: the stage's breaker is open, no fallback left
     |    +-- EmbeddingUnavailable     the embedding breaker (slow calls, timeouts)
     |    +-- VectorStoreUnavailable   the vector-store breaker (connection-class errors)
     |    +-- RerankOutOfMemory        the rerank breaker (out-of-memory)
     |    +-- NoDeploymentAvailable    every deployment of a model group is out (open, spent, failed)
     +-- QuotaExceeded                 the tenant is over its concurrency or rate quota
     +-- Overloaded                    shed: the stage's adaptive limit, queue or throttle refused
     +-- DeadlineExceeded              the request's time budget is spent
     +-- StageTimeout (TimeoutError)   one attempt ran past the stage's own ``timeout_s``
     |    +-- StreamTimeout            a stream's first-item, idle or total budget ran out
     +-- Unauthenticated               a front door's tenant resolver could not say who is calling
     +-- PermissionDenied              the caller is known but may not use this service
     +-- InvalidInput (ValueError)     the caller's mistake: bad tenant id, bad option
     |    +-- ConfigError              a policy value out of range, named by field
     |    +-- CorruptPayload           a compressed message that does not decode

What each error answers at the front doors (its HTTP status and gRPC code) is one table,
``ragguard.outcomes._doors.ANSWERS``, read by both the ASGI middleware and the gRPC interceptor.

A cancelled call is not an error of ragguard's: it releases what it holds and re-raises the
cancellation. The exception that caused a rejection, where there is one, stays reachable as
``__cause__``. An error that ends a stream after items were handed to the caller (the commit
point: no fallback or retry any more) says how many: ``items`` on :class:`DeadlineExceeded`,
:class:`StageTimeout` and :class:`StreamTimeout`, and a note (PEP 678) on any error.
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = [
    "BreakerOpen",
    "ConfigError",
    "CorruptPayload",
    "DeadlineExceeded",
    "EmbeddingUnavailable",
    "InvalidInput",
    "NoDeploymentAvailable",
    "Overloaded",
    "PermissionDenied",
    "QuotaExceeded",
    "RagguardError",
    "RerankOutOfMemory",
    "StageTimeout",
    "StreamBudget",
    "StreamTimeout",
    "Unauthenticated",
    "VectorStoreUnavailable",
]


class RagguardError(Exception):
    """Root of every error ragguard raises."""


class BreakerOpen(RagguardError):
    """The breaker named ``breaker`` rejected the call without running it.

    ``retry_after_s`` is the true time left, in seconds, until the breaker lets a trial call
    through (0.0 while half-open with every trial permit taken, or forced open: None).
    """

    # The fields live in ``args`` (``(breaker, retry_after_s)``, as BaseException.__new__ stores
    # them), so a breaker rejecting a call while open builds one with BaseException.__new__ alone,
    # without a Python __init__ or an instance dict (CircuitBreaker: a third of a rejection's
    # cost); ``state`` is a class default until a rejection in another state sets its own.
    state: str = "open"

    def __init__(self, breaker: str, retry_after_s: float | None, *, state: str = "open") -> None:
        # No super().__init__ and no message formatting here: the message is built by __str__
        # when someone reads it.
        self.args = (breaker, retry_after_s)
        if state != "open":
            self.state = state

    @property
    def breaker(self) -> str:
        """The name of the breaker that rejected the call."""
        return self.args[0]  # type: ignore[no-any-return]

    @breaker.setter
    def breaker(self, value: str) -> None:
        self.args = (value, self.args[1])

    @property
    def retry_after_s(self) -> float | None:
        """Seconds until a trial call may pass (see the class docstring)."""
        return self.args[1]  # type: ignore[no-any-return]

    @retry_after_s.setter
    def retry_after_s(self, value: float | None) -> None:
        self.args = (self.args[0], value)

    def __reduce__(self) -> tuple[Any, ...]:
        fields = (type(self), self.breaker, self.retry_after_s, self.state)
        return (_rebuild_breaker_open, fields, self.__dict__)

    def __str__(self) -> str:
        after = "" if self.retry_after_s is None else f"; retry after {self.retry_after_s:.3f}s"
        return f"circuit breaker {self.breaker!r} is {self.state}{after}"


def _rebuild_breaker_open(
    cls: type[BreakerOpen], breaker: str, retry_after_s: float | None, state: str
) -> BreakerOpen:
    return cls(breaker, retry_after_s, state=state)


class EmbeddingUnavailable(BreakerOpen):
    """The embedding breaker is open (embedding calls were slow or timed out)."""


class VectorStoreUnavailable(BreakerOpen):
    """The vector-store breaker is open (the store refused or dropped connections)."""


class RerankOutOfMemory(BreakerOpen):
    """The rerank breaker is open (the reranker ran out of memory repeatedly)."""


class NoDeploymentAvailable(BreakerOpen):
    """No deployment of model group ``group`` answered: each was out (its breaker open, its limits
    spent) or failed over to the next, within the request's deadline.

    ``retry_after_s``: the soonest time, in seconds, one of them comes back (its breaker's time
    left open, its limits' wait, a rejection's stated wait); None when none said (they failed
    with their breakers still closed). ``out``: deployment name -> why it was left (``open``,
    ``limits``, ``failure``, ``rejection``, ``timeout``, ``overloaded``, ``context_length``...).
    A :class:`BreakerOpen`: the front doors answer 503 / UNAVAILABLE with ``Retry-After``, and a
    stage's fallback serves it. The last deployment's error is ``__cause__``.
    """

    def __init__(
        self,
        group: str,
        retry_after_s: float | None,
        *,
        state: str = "open",
        out: dict[str, str] | None = None,
    ) -> None:
        super().__init__(group, retry_after_s, state=state)
        self.out: dict[str, str] = dict(out or {})

    @property
    def group(self) -> str:
        """The model group's name."""
        return self.breaker

    def __str__(self) -> str:
        why = ", ".join(f"{name}: {reason}" for name, reason in list(self.out.items())[:8])
        after = "" if self.retry_after_s is None else f"; retry after {self.retry_after_s:.3f}s"
        return f"no deployment of model group {self.group!r} is available ({why or 'none'}){after}"


class TellsDeadline:
    """What an error says of the request's deadline it ran into (:class:`DeadlineExceeded`, a
    :class:`QuotaExceeded` of reason ``"deadline"``): ``deadline_s``, its whole budget in seconds,
    and ``set_by``, what set it (a key of :data:`SET_BY`); None when not known. The one way both
    phrase it in their message, are told it by a front door, and keep it through pickling."""

    deadline_s: float | None
    set_by: str | None
    args: tuple[Any, ...]

    def _message(self) -> str:
        raise NotImplementedError

    def _told(self, budget_s: float | None) -> str:
        """`` (the request's 0.300s, set by the client)``, or as much of it as is known ("" for
        nothing); the seconds are left out when they equal ``budget_s`` (said already)."""
        deadline_s = self.deadline_s
        told = SET_BY.get(self.set_by) if isinstance(self.set_by, str) else None
        by = f", set by {told}" if told else ""
        if deadline_s is not None and deadline_s != budget_s:
            return f" (the request's {deadline_s:.3f}s{by})"
        return f" (the request's deadline{by})" if told else ""

    def told_by(self, deadline_s: float | None, set_by: str | None) -> None:
        """Fill in the request's budget and what set it, when the error did not know them (a
        front door knows its request's deadline)."""
        if self.set_by is None and set_by is not None:
            self.set_by = set_by
            if self.deadline_s is None:
                self.deadline_s = deadline_s
            self.args = (self._message(),)

    def __setstate__(self, state: dict[str, Any] | None) -> None:
        self.__dict__.update(state or {})
        self.args = (self._message(),)  # with what the keyword-only fields add


class QuotaExceeded(TellsDeadline, RagguardError):
    """Tenant ``tenant`` is over its quota.

    ``reason`` is ``"concurrency"``, ``"rate"``, ``"tokens"`` (the tenant's token quota, for a
    stream of the generation stage) or ``"deadline"`` (the wait would outlast the
    request's deadline); ``retry_after_s`` is an honest estimate, in seconds, of when a retry
    could be admitted. For reason ``"deadline"``, ``deadline_s`` and ``set_by`` tell that
    deadline as :class:`DeadlineExceeded` does (its budget in seconds, and what set it); None
    when not known (ragguard tells them for this reason only).
    """

    def __init__(
        self,
        tenant: str,
        retry_after_s: float,
        reason: str,
        *,
        deadline_s: float | None = None,
        set_by: str | None = None,
    ) -> None:
        self.tenant = tenant
        self.retry_after_s = retry_after_s
        self.reason = reason
        self.deadline_s = deadline_s
        self.set_by = set_by
        super().__init__(self._message())

    def _message(self) -> str:
        msg = f"tenant {self.tenant!r} is over its {self.reason} quota; retry after {self.retry_after_s:.3f}s"
        return msg + self._told(None)

    def told_by(self, deadline_s: float | None, set_by: str | None) -> None:
        if self.reason == "deadline":
            super().told_by(deadline_s, set_by)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.tenant, self.retry_after_s, self.reason), self.__dict__)


class Overloaded(RagguardError):
    """Stage ``stage`` shed the call to protect its dependency (or the service) from overload.

    ``reason`` says when it was shed:

    - ``"limit"``: on arrival, the adaptive concurrency limit full and no place to queue: the
      queue was full (``max_queue`` x limit, or 0), its gradual rejection chose this call, or
      ``max_wait_s`` is 0;
    - ``"queue"``: it queued, then was shed to make room for a more important arrival (a higher
      priority, a lighter tenant), or waited out ``max_wait_s`` without a slot;
    - ``"deadline"``: the request's deadline set its wait: it left no time to queue (less than the
      stage's ``min_attempt_s``), or the wait it allowed ran out before a slot freed;
    - ``"throttled"``: client-side adaptive throttling refused it before it was sent (the
      dependency has been rejecting most recent calls).

    ``priority`` is the call's priority name and ``tenant`` its tenant; ``retry_after_s`` an
    estimate, in seconds, of when a retry could be admitted (about one round trip of the dependency
    while shedding). Front doors answer it with UNAVAILABLE / 503 and ``Retry-After``.
    """

    def __init__(
        self, stage: str, retry_after_s: float, reason: str, *, priority: str = "", tenant: str = ""
    ) -> None:
        # Built by the thousand while shedding: no message formatting until someone reads it.
        self.stage = stage
        self.retry_after_s = retry_after_s
        self.reason = reason
        self.priority = priority
        self.tenant = tenant

    def __str__(self) -> str:
        who = f" ({self.priority} call of tenant {self.tenant!r})" if self.tenant else ""
        return (
            f"stage {self.stage!r} is overloaded: shed by {self.reason}{who}; "
            f"retry after {self.retry_after_s:.3f}s"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_overloaded,
            (self.stage, self.retry_after_s, self.reason, self.priority, self.tenant),
        )


def _rebuild_overloaded(
    stage: str, retry_after_s: float, reason: str, priority: str, tenant: str
) -> Overloaded:
    return Overloaded(stage, retry_after_s, reason, priority=priority, tenant=tenant)


_MAX_DETAIL = 200


class Unauthenticated(RagguardError):
    """The request carries no credentials a front door's tenant resolver accepts: a missing,
    unknown or unverifiable key or token. HTTP 401 with ``WWW-Authenticate: <challenge>``
    (RFC 9110 ``challenge``, default ``Bearer``); gRPC UNAUTHENTICATED. ``detail`` is the message
    (cut to 200 characters); never put the credential itself in it.
    """

    def __init__(self, detail: str = "the request's credentials are missing or invalid", *,
                 challenge: str = "Bearer") -> None:
        self.detail = _cut(detail)
        self.challenge = challenge
        super().__init__(self.detail)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_unauthenticated, (self.detail, self.challenge))


def _rebuild_unauthenticated(detail: str, challenge: str) -> Unauthenticated:
    return Unauthenticated(detail, challenge=challenge)


class PermissionDenied(RagguardError):
    """The caller is known but may not use this service (or this tenant): HTTP 403; gRPC
    PERMISSION_DENIED. ``detail`` is the message (cut to 200 characters)."""

    def __init__(self, detail: str = "the caller may not use this service") -> None:
        self.detail = _cut(detail)
        super().__init__(self.detail)


def _cut(detail: object) -> str:
    text = str(detail)
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 3] + "..."


class DeadlineExceeded(TellsDeadline, RagguardError):
    """The request's time budget was spent before or during stage ``stage``.

    ``budget_s`` is the budget the stage was given, in seconds (None when it was already spent
    on arrival): for a stream cut after its first item, the request's (the stream runs under the
    request's deadline, not under what one item had left); ``deadline_s``: the request's whole
    budget, the seconds its deadline was set to (None when not known); ``set_by``: what set that
    deadline, ``"client"`` (the caller's own deadline), ``"tenant"`` (the tenant's
    ``timeout_s``, shorter than the caller's) or ``"handler"`` (a ``deadline(...)`` block of the
    code, shorter still); None when not known. ``items``: for a stream cut by the deadline, how
    many items had been handed to the caller (None for a call).
    """

    def __init__(
        self,
        stage: str,
        budget_s: float | None = None,
        detail: str = "",
        deadline_s: float | None = None,
        *,
        items: int | None = None,
        set_by: str | None = None,
    ) -> None:
        self.stage = stage
        self.budget_s = budget_s
        self.items = items
        self.detail = detail
        self.deadline_s = deadline_s
        self.set_by = set_by
        super().__init__(self._message())

    def _message(self) -> str:
        budget_s = self.budget_s
        msg = f"deadline exceeded in stage {self.stage!r}"
        if budget_s is not None:
            msg += f" after a budget of {budget_s:.3f}s"
        msg += self._told(budget_s)
        if self.detail:
            msg += f": {self.detail}"
        return msg

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.stage, self.budget_s, self.detail, self.deadline_s), self.__dict__)


SET_BY: dict[str, str] = {
    "client": "the client",
    "tenant": "the tenant's timeout_s",
    "handler": "the handler",
}
"""What can set a request's deadline (a :class:`DeadlineExceeded`'s ``set_by``), and how an error
says it: ``client``, the deadline the caller sent (a gRPC deadline, the HTTP timeout field, as a
front door reads it); ``tenant``, the tenant's ``TenantQuota.timeout_s``, when shorter;
``handler``, a ``deadline(...)`` block of the code itself (:func:`ragguard.deadline`,
:meth:`ragguard.Guard.deadline`), when shorter still."""


class StageTimeout(RagguardError, TimeoutError):
    """One attempt of stage ``stage`` ran longer than the stage's ``timeout_s`` (seconds).

    Also a :class:`TimeoutError`, so breakers and retry policies classify it as a timeout: unlike
    :class:`DeadlineExceeded` (the caller's budget ran out), it says the dependency was slow, and
    it counts against the stage's breaker and may be retried (before a stream's first item only).
    ``items``: for a stream, how many items had been handed to the caller (None for a call).
    """

    def __init__(self, stage: str, timeout_s: float, *, items: int | None = None) -> None:
        self.stage = stage
        self.timeout_s = timeout_s
        self.items = items
        super().__init__(f"stage {stage!r} timed out after {timeout_s:.3f}s")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.stage, self.timeout_s), self.__dict__)


StreamBudget = Literal["first_item", "idle", "total"]


class StreamTimeout(StageTimeout):
    """A stream of stage ``stage`` was cut because its ``budget`` ran out (the generation preset).

    ``budget`` is ``"first_item"`` (the wait for the first item), ``"idle"`` (the wait for a later
    item) or ``"total"`` (the time spent waiting for items, summed over the stream);
    ``timeout_s`` the budget's length in seconds; ``items`` how many items had been handed to the
    caller when it was cut: 0 means a fallback or a retry could still serve the stream, more means
    it was committed and the error reached the caller. A :class:`StageTimeout`, so a
    :class:`TimeoutError`: the dependency was slow, and the stage's breaker counts it.
    """

    def __init__(self, stage: str, budget: StreamBudget, timeout_s: float, items: int) -> None:
        self.stage = stage
        self.budget = budget
        self.timeout_s = timeout_s
        self.items = items
        TimeoutError.__init__(
            self,
            f"stage {stage!r} stream cut: its {budget} budget of {timeout_s:.3f}s ran out "
            f"after {items} item{'' if items == 1 else 's'}",
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.stage, self.budget, self.timeout_s, self.items), self.__dict__)


class InvalidInput(RagguardError, ValueError):
    """The caller gave a value ragguard cannot use (also a ``ValueError``)."""


class ConfigError(InvalidInput):
    """A policy or option value is out of range; the message names the field.

    ``field`` is the option or field path the error is about (``"open_jitter"``,
    ``"stages.embedding.breaker.open_jitter"``), or None when it is about no single one.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class CorruptPayload(InvalidInput):
    """A compressed message is not valid, is truncated, or declares too large a size."""
