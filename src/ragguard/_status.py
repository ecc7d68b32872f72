"""What a Guard is doing now, as one JSON-ready snapshot: :func:`snapshot` (behind
:meth:`ragguard.Guard.status`, the ASGI :class:`~ragguard.asgi.StatusEndpoint`,
:func:`ragguard_tools.status.serve` and ``ragguard top``).

Everything is read from live state through public methods, when asked: nothing runs on a guarded
call for it. The counts that only events carry (fallbacks served, calls shed or throttled, per
stage) come from a :class:`StatusCounts` listener, when one is given.

::

    {"ok": bool, "open": [stage | "stage[key]", ...],
     "stages": {stage: {"breaker": {"name", "state", "retry_after_s"} | None,
                        "limit": {"limit", "min_limit", "max_limit", "in_flight", "queued",
                                  "shed": {priority: n}, ...}?,
                        "limits": {"rpm", "tpm", "window_s"}?,
                        "throttle": {"probability", ...}?,
                        "hedge": {"delay_s", "fired", "won", "refused"}?,
                        "keyed": {"max_keys", "kept", "overflowed", "evicted"}?,
                        "keys": {key: {"breaker": {...} | None, "limit": {...}?, "limits": {...}?,
                                       "in_flight", "calls", "latency_s", "declared"}}?}},
     "groups": {group: {"stage", "strategy", "deployments": {name: {"key", "state"}}}}?,
     "quotas": {"backend": "local" | "redis" | <class name>, "shared": bool | None,
                "tenants": {tenant: {"in_flight", "waiting", "max_concurrency", "rate_per_s"}},
                "others": {"in_flight", "waiting"}},
     "links": [{"component": "quotas" | "breaker:<stage>" | "breaker:<stage>[<key>]", "shared": bool,
                "pending": True?}],
     "counts": {"fallbacks": {stage: n}, "shed": {stage: n}, "throttled": {stage: n},
                "rejected": {breaker: n}, "quota_rejected": {tenant: n}, "since_s": float}?}

``ok`` is False while any breaker is open, forced open or half-open (``open`` names those
stages, and a keyed stage's keys by their breakers' names, ``stage[key]``): fallbacks or a model
group's other deployments may still be serving them. A keyed stage (one keyed function ran it)
lists each key it keeps now under ``keys`` (its own breaker, adaptive limit, limits, calls in
flight and made, the average latency of its successes while timed, and whether it is declared:
named in the policy or by a model group, kept always), at most ``max_keys`` besides the declared
ones, so no caller's keys grow the snapshot; ``keyed`` counts them, the calls that ran on the
stage's own instance for want of room (``overflowed``: the stage's own entry is that overflow
instance) and the keys forgotten (``evicted``). ``groups``: each model group bound on the Guard
(:meth:`ragguard.Guard.group`), its deployments with their keys and their breakers' states.
``links``: each link to Redis (the shared quotas, each shared breaker: a stage's and each key's
the stage keeps, bounded as ``keys``), on Redis (``shared``) or on its local fallback;
``pending`` marks a breaker no call has used yet (so it has not read Redis: not a lost link).
``tenants`` lists the tenants the policy names;
``others`` adds up every other tenant (so a leaked slot shows as an ``in_flight`` that does not
come back to 0). ``in_flight`` and ``waiting`` are this process's requests (for shared quotas too:
Redis counts every replica's); ``waiting`` is None where the backend cannot tell.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from . import events
from ._errors import ConfigError
from .options import Policy
from .overload import status as overload_status

__all__ = [
    "StatusCounts", "breaker_entry", "configured_tenants", "group_entry", "key_counts", "key_entry",
    "limit_entry", "limits_entry", "links", "overload", "quotas", "snapshot",
]  # fmt: skip

_NOT_CLOSED_OK = ("closed", "disabled")


class Guard(Protocol):
    """What a snapshot reads of a :class:`ragguard.Guard`: its policy, quota backend and stages."""

    @property
    def policy(self) -> Policy: ...

    @property
    def quotas(self) -> Any: ...

    def stage_names(self) -> tuple[str, ...]: ...

    def stage(self, name: str) -> Any: ...

    def breaker(self, stage: str) -> Any: ...

    def breakers(self) -> dict[str, Any]: ...


def snapshot(guard: Guard, counts: StatusCounts | None = None) -> dict[str, Any]:
    """``guard``'s status now (see the module docstring); ``counts`` adds its ``counts``."""
    stages: dict[str, Any] = {}
    not_closed: list[str] = []
    parts = overload(guard)
    for name in guard.stage_names():
        st = guard.stage(name)
        entry = {"breaker": breaker_entry(guard.breaker(name), not_closed, name)}
        entry.update(parts.get(name, {}))
        limits = limits_entry(st)
        if limits is not None:
            entry["limits"] = limits
        held = getattr(st, "keys", None)
        if held is not None:
            entry["keyed"] = key_counts(held)
            entry["keys"] = {key: key_entry(runtime, not_closed) for key, runtime in held.items()}
        stages[name] = entry
    out: dict[str, Any] = {"ok": not not_closed, "open": not_closed, "stages": stages}
    bound = getattr(guard, "groups", None)
    if callable(bound) and bound():
        out["groups"] = {name: group_entry(group) for name, group in bound().items()}
    out["quotas"] = quotas(guard)
    out["links"] = links(guard)
    if counts is not None:
        out["counts"] = counts.snapshot()
    return out


def breaker_entry(
    breaker: Any, not_closed: list[str] | None = None, label: str = ""
) -> dict[str, Any] | None:
    """A breaker's ``{"name", "state", "retry_after_s"}`` (None for none); ``label`` (what it
    guards: a stage, ``stage[key]``) added to ``not_closed`` when it is open, forced open or
    half-open."""
    if breaker is None:
        return None
    state = _state_name(breaker.state)
    if not_closed is not None and state not in _NOT_CLOSED_OK:
        not_closed.append(label or str(breaker.name))
    return {"name": breaker.name, "state": state, "retry_after_s": getattr(breaker, "retry_after_s", None)}


def key_counts(keys: Any) -> dict[str, int]:
    """A keyed stage's map: ``max_keys``, the keys ``kept`` now, the calls ``overflowed`` onto the
    stage's own instance, the keys ``evicted``."""
    return {"max_keys": keys.max_keys, "kept": len(keys), "overflowed": keys.overflowed,
            "evicted": keys.evicted}  # fmt: skip


def key_entry(runtime: Any, not_closed: list[str] | None = None) -> dict[str, Any]:
    """One key's runtime: its breaker, adaptive limit (with its policy's bounds), limits, calls in
    flight and made, average latency while timed, and whether it is declared."""
    entry: dict[str, Any] = {"breaker": breaker_entry(runtime.breaker, not_closed, runtime.label)}
    limit = limit_entry(runtime)
    if limit is not None:
        entry["limit"] = limit
    limits = limits_entry(runtime)
    if limits is not None:
        entry["limits"] = limits
    entry.update(in_flight=runtime.in_flight, calls=runtime.calls, latency_s=runtime.latency_s,
                 declared=bool(runtime.declared))  # fmt: skip
    return entry


def limit_entry(runtime: Any) -> dict[str, Any] | None:
    """A runtime's adaptive limit (:meth:`ragguard.overload.AdaptiveLimiter.status`, with its
    policy's ``min_limit`` and ``max_limit``), None when it has built none."""
    limiter = runtime.parts().get("limiter")
    if limiter is None:
        return None
    out: dict[str, Any] = limiter.status()
    adaptive = runtime.policy.adaptive
    if adaptive is not None:
        out["min_limit"] = adaptive.min_limit
        out["max_limit"] = adaptive.max_limit
    return out


def limits_entry(runtime: Any) -> dict[str, Any] | None:
    """A runtime's limits (``rpm``, ``tpm`` per ``window_s``), None when it sets none."""
    limits = runtime.policy.limits
    if limits is None or not limits.limits_anything:
        return None
    return {"rpm": limits.rpm, "tpm": limits.tpm, "window_s": limits.window_s}


def group_entry(group: Any) -> dict[str, Any]:
    """A model group: its stage, strategy and deployments (each its key and its breaker's state)."""
    deployments: dict[str, Any] = {}
    for name, runtime in group.deployments():
        breaker = runtime.breaker
        state = None if breaker is None else _state_name(breaker.state)
        deployments[name] = {"key": runtime.key, "state": state}
    return {"stage": group.stage, "strategy": group.policy.strategy, "deployments": deployments}


def overload(guard: Guard) -> dict[str, Any]:
    """Stage -> its overload layers' state (:func:`ragguard.overload.status`), each adaptive
    limit with its policy's bounds (``min_limit``, ``max_limit``: a limit at its floor is pinned)."""
    out = overload_status(guard)
    for name, parts in out.items():
        limit = parts.get("limit")
        adaptive = guard.policy.stage(name).adaptive
        if limit is not None and adaptive is not None:
            limit["min_limit"] = adaptive.min_limit
            limit["max_limit"] = adaptive.max_limit
    return out


def quotas(guard: Guard) -> dict[str, Any]:
    """The ``quotas`` part of :func:`snapshot`: the configured tenants one by one, the rest added up."""
    backend = guard.quotas
    # a RedisQuotas counts this replica's requests itself; the ones waiting are queued in Redis
    # (None: not told) or, during an outage, in its local fallback
    local = getattr(backend, "fallback", backend)
    in_flight = getattr(backend, "in_flight", None)
    waiting = getattr(local, "waiting", None)
    tenants: dict[str, Any] = {}
    named_in_flight = named_waiting = 0
    for tenant, quota in guard.policy.tenants.items():
        n = int(in_flight(tenant)) if callable(in_flight) else 0
        w = int(waiting(tenant)) if callable(waiting) else None
        named_in_flight += n
        named_waiting += w or 0
        tenants[tenant] = {
            "in_flight": n,
            "waiting": w,
            "max_concurrency": quota.max_concurrency,
            "rate_per_s": quota.rate_per_s,
        }
    total = getattr(backend, "total_in_flight", None)
    total_waiting = getattr(local, "total_waiting", None)
    others = {
        "in_flight": max(0, int(total()) - named_in_flight) if callable(total) else None,
        "waiting": max(0, int(total_waiting()) - named_waiting) if callable(total_waiting) else None,
    }
    kind = type(backend).__name__
    shared = getattr(backend, "shared", None)
    return {
        "backend": {"LocalQuotas": "local", "RedisQuotas": "redis"}.get(kind, kind),
        "shared": shared if isinstance(shared, bool) else None,
        "tenants": tenants,
        "others": others,
    }


def links(guard: Guard) -> list[dict[str, Any]]:
    """Each Redis link of ``guard`` (its shared quotas, each shared breaker: a stage's, and each
    key's of a keyed stage, ``breaker:stage[key]``, for the keys the stage keeps now, as under
    ``keys``, and the deployments of its model groups): on shared state or not."""
    out: list[dict[str, Any]] = []
    shared = getattr(guard.quotas, "shared", None)
    if isinstance(shared, bool):
        out.append({"component": "quotas", "shared": shared})
    seen: set[str] = set()

    def add(breaker: Any) -> None:
        flag = getattr(breaker, "shared", None)
        if isinstance(flag, bool):
            component = f"breaker:{breaker.name}"
            if component not in seen:
                seen.add(component)
                link = {"component": component, "shared": flag}
                if getattr(breaker, "synced", True) is False:
                    link["pending"] = True  # no call used it yet: not on Redis, not cut off
                out.append(link)

    for breaker in guard.breakers().values():
        add(breaker)
    for name in guard.stage_names():
        held = getattr(guard.stage(name), "keys", None)
        if held is not None:
            for _, runtime in held.items():
                add(runtime.breaker)
    bound = getattr(guard, "groups", None)
    if callable(bound):
        for group in bound().values():
            for _, runtime in group.deployments():
                add(runtime.breaker)
    return out


def configured_tenants(guard: Guard) -> frozenset[str]:
    """The tenant ids ``guard``'s policy names (each keeps its own metric labels)."""
    return frozenset(guard.policy.tenants)


def _state_name(state: Any) -> str:
    return str(getattr(state, "value", state))


class StatusCounts:
    """Counts what only events tell, per stage: fallbacks served, calls shed and throttled; per
    breaker, calls it rejected; per tenant, quota refusals. A listener of ``bus`` (default
    :data:`ragguard.events.bus`) from :meth:`start` on: while it listens, guarded calls build
    their events (as for any listener). At most ``max_keys`` names per count (later ones add to
    ``"other"``). ``clock``: monotonic seconds, for ``since_s``."""

    def __init__(
        self,
        *,
        bus: events.EventBus | None = None,
        max_keys: int = 200,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            raise ConfigError(f"StatusCounts: max_keys must be an int >= 1, got {max_keys!r}")
        self._bus = events.bus if bus is None else bus
        self._max = max_keys
        self._clock = clock
        self._since = clock()
        self._counts: dict[str, dict[str, int]] = {
            "fallbacks": {}, "shed": {}, "throttled": {}, "rejected": {}, "quota_rejected": {},
        }  # fmt: skip
        self._stop: weakref.finalize[..., Any] | None = None

    def start(self) -> StatusCounts:
        """Subscribe (a no-op when already subscribed); returns self. The subscription lasts
        until :meth:`close`, or until these counts are garbage (their endpoint dropped): the bus
        holds them weakly, so a dropped endpoint does not keep every guarded call building
        events."""
        if self._stop is None:
            ref = weakref.ref(self)

            def handle(event: Any) -> None:
                counts = ref()
                if counts is not None:
                    counts.handle(event)

            self._stop = weakref.finalize(self, self._bus.subscribe(handle))
        return self

    def close(self) -> None:
        stop, self._stop = self._stop, None
        if stop is not None:
            stop()

    @property
    def started(self) -> bool:
        return self._stop is not None

    def handle(self, event: Any) -> None:
        kind = type(event).__name__
        if kind == "FallbackServed":
            self._add("fallbacks", event.stage)
        elif kind == "LoadShed":
            self._add("shed", event.stage)
        elif kind == "Throttled":
            self._add("throttled", event.stage)
        elif kind == "CallRejected":
            self._add("rejected", event.breaker)
        elif kind == "QuotaRejected":
            self._add("quota_rejected", event.tenant)

    def _add(self, count: str, key: str) -> None:
        table = self._counts[count]
        if key not in table and len(table) >= self._max:
            key = "other"
        table[key] = table.get(key, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: dict(table) for name, table in self._counts.items()}
        out["since_s"] = round(self._clock() - self._since, 3)
        return out
