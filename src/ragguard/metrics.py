"""Prometheus and OpenTelemetry export of ragguard's events and state.

Prometheus (prometheus-client, a core dependency)::

    exporter = ragguard.metrics.PrometheusExporter().start()   # subscribes to ragguard.events.bus
    app.add_route("/metrics", exporter.asgi())                  # an ASGI app; or exporter.serve(9464)

Metrics live in a dedicated ``CollectorRegistry`` unless one is passed. Names follow Prometheus
conventions: ``ragguard_`` prefix, ``_seconds`` for durations, ``_total`` for counters, labels
``stage``, ``tenant``, ``outcome``, ``breaker``, ``fallback``. Counters and histograms come from
events; gauges of what is true now (adaptive limits, calls in flight and queued, tenants' slots,
hedges, shared-state links) are read from the Guards' state at scrape time (:mod:`ragguard._status`).
Tenant labels: every tenant the policy names keeps its own; of the others, the first
``max_tenants`` seen keep their id and the rest fold into ``"other"`` (stage and breaker labels are
capped the same way), so generated ids cannot grow a scrape without bound. No ``_created``
series unless ``created=True``.

OpenTelemetry (ragguard's optional ``otel`` extra): :func:`enable_tracing` turns on a span per
guarded stage, current while the stage runs, with a span event per decision (attempt, retry,
fallback, hedge, shed, rejection) and the GenAI semantic conventions' attributes;
:class:`OTelMetrics` records the same events as OpenTelemetry metrics. Without them, or without
opentelemetry-api installed, a guarded call pays one branch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import _inject, events
from . import _validate as v
from ._deadline import remaining
from ._errors import ConfigError
from ._extras import install_hint
from ._guard import Guard, default_guard
from .events import StageCompleted, error_type
from .outcomes import outcome_of

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

__all__ = ["OTelMetrics", "PrometheusExporter", "disable_tracing", "enable_tracing", "otel_span"]

DEFAULT_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip
BREAKER_STATES: tuple[str, ...] = ("closed", "open", "half_open", "forced_open", "disabled")
STALL_BUCKETS_S: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
OTHER = "other"


# -- Prometheus -----------------------------------------------------------------------------------


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise ImportError("ragguard.metrics needs prometheus-client: pip install prometheus-client") from exc
    return prometheus_client


class MetricsApp:
    """The ASGI app of :meth:`PrometheusExporter.asgi`: prometheus-client's, as an object (a
    Starlette or FastAPI route takes an object as an ASGI app, and a plain function as an endpoint
    of a request; so ``app.add_route("/metrics", exporter.asgi())`` works)."""

    __slots__ = ("_app",)

    def __init__(self, app: Callable[..., Any]) -> None:
        self._app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)


class _Capped:
    """Label values kept as seen for the first ``limit`` distinct ones, the rest become ``other``.

    ``named()`` (optional): the values that always keep their own label and do not count against
    ``limit`` (the tenants a policy names), asked only for a value not seen yet."""

    __slots__ = ("_named", "capped", "limit", "seen")

    def __init__(self, limit: int, named: Callable[[], frozenset[str]] | None = None) -> None:
        self.limit = limit
        self.seen: set[str] = set()
        self.capped = 0
        self._named = named

    def __call__(self, value: str) -> str:
        if value in self.seen:
            return value
        named = self._named
        if named is not None and value in named():
            self.seen.add(value)
            return value
        if self.capped < self.limit:
            self.seen.add(value)
            self.capped += 1
            return value
        return OTHER


def _guards_of(guards: Any) -> Callable[[], list[Guard]]:
    """``guards`` (None: the default registry, looked up each time; a Guard; a sequence of them)
    as a function returning the list."""
    if guards is None:

        def default() -> list[Guard]:
            return [default_guard()]

        return default
    given = list(guards) if isinstance(guards, (list, tuple)) else [guards]
    for g in given:
        if not callable(getattr(g, "stage_names", None)):
            raise ConfigError(f"PrometheusExporter: guards must be ragguard.Guard objects, got {g!r:.60}")
    return lambda: given


class _Named:
    """The names the Guards' policies give (``of`` a policy: its tenants by default), recomputed
    when a policy object changes."""

    __slots__ = ("_guards", "_names", "_of", "_policies")

    def __init__(
        self, guards: Callable[[], list[Guard]], of: Callable[[Any], Iterable[str]] | None = None
    ) -> None:
        self._guards = guards
        self._of = of if of is not None else (lambda policy: policy.tenants)
        self._policies: tuple[int, ...] = ()
        self._names: frozenset[str] = frozenset()

    def __call__(self) -> frozenset[str]:
        guards = self._guards()
        policies = tuple(id(g.policy) for g in guards)
        if policies != self._policies:
            self._names = frozenset().union(*(self._of(g.policy) for g in guards))
            self._policies = policies
        return self._names


def _group_names(policy: Any) -> set[str]:
    """The model groups a policy declares and their deployments' names."""
    return {*policy.groups, *(d.name for group in policy.groups.values() for d in group.deployments)}


class PrometheusExporter:
    """Turns every ragguard event on ``bus`` into Prometheus metrics in ``registry``, and reads the
    Guards' live state at scrape time.

    ``registry`` default: a new dedicated ``CollectorRegistry``; ``bus`` default
    :data:`ragguard.events.bus`; ``guards``: the :class:`~ragguard.Guard` (or a sequence of them)
    whose adaptive limits, hedges, throttles, tenants' slots and Redis links are read at scrape
    time and whose policies name the tenants that always keep their own label (default: the
    default registry, looked up at each scrape); ``max_tenants``, ``max_stages``,
    ``max_breakers`` (each >= 1, default 100): distinct tenant ids not named in a policy, stage
    and breaker names before the rest fold into ``"other"`` (a breaker folded into ``"other"``
    has no ``ragguard_breaker_state`` series: one gauge cannot hold the states of many breakers);
    ``latency_buckets_s`` histogram bounds in seconds; ``pools`` also export the gauges and wait
    histograms of every live :class:`ragguard.monitors.MonitoredConnectionPool`; ``created``:
    keep prometheus-client's ``_created`` series (one per labelled counter and histogram; off by
    default). Raises ConfigError for bad options.

    Every metric is listed in docs/monitors.md (a test checks the table against a scrape).
    """

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        bus: events.EventBus | None = None,
        guards: Guard | Sequence[Guard] | None = None,
        max_tenants: int = 100,
        max_stages: int = 100,
        max_breakers: int = 100,
        latency_buckets_s: tuple[float, ...] = DEFAULT_LATENCY_BUCKETS_S,
        pools: bool = True,
        created: bool = False,
    ) -> None:
        v.count("max_tenants", max_tenants, 1)
        v.count("max_stages", max_stages, 1)
        v.count("max_breakers", max_breakers, 1)
        buckets = tuple(float(b) for b in latency_buckets_s)
        if not buckets or any(b <= 0 for b in buckets) or list(buckets) != sorted(set(buckets)):
            raise ConfigError(
                f"PrometheusExporter: latency_buckets_s must be increasing positive seconds, "
                f"got {latency_buckets_s!r}"
            )
        pc = _prometheus()
        self.registry: CollectorRegistry = pc.CollectorRegistry() if registry is None else registry
        self._bus = events.bus if bus is None else bus
        self._guards = _guards_of(guards)
        self._tenant = _Capped(max_tenants, _Named(self._guards))
        self._stage_label = _Capped(max_stages)
        self._breaker = _Capped(max_breakers)
        # group and deployment names: the policies' keep their own label (bounded by the policies)
        self._deployment = _Capped(max_breakers, _Named(self._guards, _group_names))
        self._unsubscribe: Callable[[], None] | None = None
        # the metrics live in an inner registry; the one scraped sees them through _Export, which
        # drops the _created samples unless asked for
        r = self._inner = pc.CollectorRegistry()
        self.registry.register(_Export(r, created))
        self.stage_duration = pc.Histogram(
            "ragguard_stage_duration_seconds", "Guarded stage latency, fallbacks included.",
            ["stage", "tenant", "outcome"], buckets=buckets, registry=r,
        )  # fmt: skip
        self.first_item = pc.Histogram(
            "ragguard_stream_first_item_seconds", "Time to a guarded stream's first item (first chunk).",
            ["stage"], buckets=buckets, registry=r,
        )  # fmt: skip
        self.call_duration = pc.Histogram(
            "ragguard_call_duration_seconds", "Latency of calls through a circuit breaker.",
            ["breaker", "outcome"], buckets=buckets, registry=r,
        )  # fmt: skip
        self.rejected = pc.Counter(
            "ragguard_calls_rejected", "Calls a circuit breaker refused.", ["breaker", "state"], registry=r
        )
        # ragguard_breaker_state is read at scrape time (see _BreakerStateCollector), so a breaker's
        # series exist from its creation, not from its first transition
        self._last_states: dict[str, str] = {}
        r.register(_BreakerStateCollector(self._bus, self._last_states, self._breaker, self._guards))
        self.transitions = pc.Counter(
            "ragguard_breaker_transitions", "Circuit breaker state changes.",
            ["breaker", "from_state", "to_state"], registry=r,
        )  # fmt: skip
        self.fallbacks = pc.Counter(
            "ragguard_fallbacks_served", "Answers served by a fallback.", ["stage", "fallback", "tenant"],
            registry=r,
        )  # fmt: skip
        self.quota_rejections = pc.Counter(
            "ragguard_quota_rejections", "Calls refused by a tenant quota.", ["tenant", "reason"], registry=r
        )
        self.retries = pc.Counter("ragguard_retries", "Retries scheduled.", ["stage", "tenant"], registry=r)
        self.retry_budget = pc.Counter(
            "ragguard_retry_budget_exhausted", "Retries refused because the retry budget was spent.",
            ["stage", "tenant"], registry=r,
        )  # fmt: skip
        self.shed = pc.Counter(
            "ragguard_load_shed", "Calls an adaptive limit shed (reason: limit, queue, deadline).",
            ["stage", "tenant", "priority", "reason"], registry=r,
        )  # fmt: skip
        self.throttled = pc.Counter(
            "ragguard_throttled", "Calls refused locally by client-side throttling.", ["stage", "tenant"],
            registry=r,
        )  # fmt: skip
        self.faults = pc.Counter(
            "ragguard_faults_injected",
            "Chaos faults injected (tests and demos).",
            ["stage", "fault"],
            registry=r,
        )
        self.stream_cuts = pc.Counter(
            "ragguard_streams_cut", "Streams a generation budget cut (first_item, idle, total).",
            ["stage", "budget"], registry=r,
        )  # fmt: skip
        self.stream_endings = pc.Counter(
            "ragguard_stream_endings", "Guarded streams ended: completed, continued or incomplete.",
            ["stage", "ending"], registry=r,
        )  # fmt: skip
        self.stream_tokens = pc.Counter(
            "ragguard_stream_tokens", "Tokens counted in generation streams, per tenant.",
            ["stage", "tenant"], registry=r,
        )  # fmt: skip
        self.stream_usage = pc.Counter(
            "ragguard_stream_usage_tokens",
            "Tokens of generation streams as billed: the provider's report, else the count "
            "(type: input, output; outcome: ok, error, cancelled; a stream that failed part way keeps "
            "what was reported before it failed).",
            ["stage", "type", "outcome"], registry=r,
        )  # fmt: skip
        self.failovers = pc.Counter(
            "ragguard_failovers",
            "Calls a model group took from a deployment to the next (to: empty when none answered).",
            ["group", "deployment", "reason", "to"], registry=r,
        )  # fmt: skip
        self.stream_paced = pc.Counter(
            "ragguard_stream_paced_seconds", "Time generation streams waited for token pacing.",
            ["stage", "tenant"], registry=r,
        )  # fmt: skip
        self.stalls = pc.Counter("ragguard_loop_stalls", "Event-loop stalls over the threshold.", registry=r)
        self.stall_duration = pc.Histogram(
            "ragguard_loop_stall_duration_seconds",
            "Event-loop stall lengths.",
            buckets=STALL_BUCKETS_S,
            registry=r,
        )
        self.pool_events = pc.Counter(
            "ragguard_redis_pool_exhausted", "Redis pool exhaustion events.", ["pool", "reason"], registry=r
        )
        self.pool_leaks = pc.Counter(
            "ragguard_redis_pool_leaks", "Connections held past the leak threshold.", ["pool"], registry=r
        )
        # The series alerts key on exist from the start, so rate() and absent() behave.
        self.stalls.inc(0)
        # SharedStateDegraded / Restored seen, for links no live Guard shows (1 = on local state)
        self._links: dict[str, float] = {}
        r.register(_StateCollector(self._guards, self._stage_label, self._links))
        if pools:
            r.register(_PoolCollector())
        self._handlers: dict[type, Callable[[Any], None] | None] = {}
        self._by_name: dict[str, Callable[[Any], None]] = {
            "StageCompleted": self._stage,
            "CallOutcome": self._call,
            "CallRejected": self._rejected,
            "BreakerTransition": self._transition,
            "FallbackServed": self._fallback,
            "QuotaRejected": self._quota,
            "RetryScheduled": self._retry,
            "RetryBudgetExhausted": self._budget,
            "LoadShed": self._shed,
            "Throttled": self._throttled,
            "SharedStateDegraded": self._degraded,
            "SharedStateRestored": self._restored,
            "FaultInjected": self._fault,
            "StreamCut": self._cut,
            "StreamEnded": self._ended,
            "StreamSettled": self._settled,
            "FailedOver": self._failed_over,
            "LoopStall": self._stall,
            "PoolExhausted": self._pool,
            "ConnectionLeak": self._leak,
        }

    def start(self) -> PrometheusExporter:
        """Subscribe to the bus; returns self. Starting twice is a no-op."""
        if self._unsubscribe is None:
            self._unsubscribe = self._bus.subscribe(self.handle)
        return self

    def close(self) -> None:
        """Unsubscribe; the metrics keep their values."""
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()

    def __enter__(self) -> PrometheusExporter:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def scrape(self) -> bytes:
        """The registry in the Prometheus text format (what a scrape returns)."""
        return bytes(_prometheus().generate_latest(self.registry))

    def asgi(self) -> MetricsApp:
        """An ASGI app answering every request with a scrape of the registry (prometheus-client's
        ``make_asgi_app``): ``app.add_route("/metrics", exporter.asgi())`` in FastAPI or
        Starlette answers ``/metrics`` itself (a Starlette ``Mount`` matches only the paths below
        its own: ``app.mount("/metrics", ...)`` serves ``/metrics/`` and redirects ``/metrics``
        to it with a 307, which a scraper that does not follow redirects reads as empty). Exempt
        its path from the tenant middleware (``/metrics`` is exempt by default)."""
        return MetricsApp(_prometheus().make_asgi_app(registry=self.registry))

    def serve(self, port: int, addr: str = "127.0.0.1") -> Any:
        """Serve ``/metrics`` over HTTP on ``addr:port`` from a daemon thread (prometheus-client's
        server): for a service without an HTTP server of its own, such as a gRPC one (see also
        :func:`ragguard_tools.status.serve`, which serves the status and these metrics together)."""
        if not isinstance(port, int) or not 0 <= port < 65536:
            raise ConfigError(f"PrometheusExporter.serve: port must be 0..65535, got {port!r}")
        return _prometheus().start_http_server(port, addr, registry=self.registry)

    def handle(self, event: Any) -> None:
        """Record one event (the bus listener). Unknown event types are ignored."""
        kind = type(event)
        handler = self._handlers.get(kind, _MISSING)
        if handler is _MISSING:
            handler = next(
                (self._by_name[c.__name__] for c in kind.__mro__ if c.__name__ in self._by_name), None
            )
            self._handlers[kind] = handler
        if handler is not None:
            handler(event)

    # -- one method per event type ---------------------------------------------------------------

    def _stage(self, e: StageCompleted) -> None:
        stage = self._stage_label(e.stage)
        self.stage_duration.labels(stage, self._tenant(e.tenant), e.outcome).observe(e.duration_s)
        first = getattr(e, "first_item_s", None)
        if first is not None:
            self.first_item.labels(stage).observe(first)

    def _call(self, e: events.CallOutcome) -> None:
        self.call_duration.labels(self._breaker(e.breaker), e.outcome).observe(e.duration_s)

    def _rejected(self, e: events.CallRejected) -> None:
        self.rejected.labels(self._breaker(e.breaker), e.state).inc()

    def _transition(self, e: events.BreakerTransition) -> None:
        label = self._breaker(e.breaker)
        self.transitions.labels(label, e.old, e.new).inc()
        if label != OTHER or e.breaker == OTHER:  # only names with a label of their own: bounded
            self._last_states[e.breaker] = e.new

    def _fallback(self, e: events.FallbackServed) -> None:
        self.fallbacks.labels(self._stage_label(e.stage), e.fallback, self._tenant(e.tenant)).inc()

    def _quota(self, e: events.QuotaRejected) -> None:
        self.quota_rejections.labels(self._tenant(e.tenant), e.reason).inc()

    def _retry(self, e: events.RetryScheduled) -> None:
        self.retries.labels(self._stage_label(e.stage), self._tenant(getattr(e, "tenant", "") or "")).inc()

    def _budget(self, e: events.RetryBudgetExhausted) -> None:
        self.retry_budget.labels(self._stage_label(e.stage), self._tenant(e.tenant)).inc()

    def _shed(self, e: Any) -> None:
        stage, tenant = self._stage_label(e.stage), self._tenant(e.tenant)
        self.shed.labels(stage, tenant, e.priority, e.reason).inc()

    def _throttled(self, e: Any) -> None:
        self.throttled.labels(self._stage_label(e.stage), self._tenant(e.tenant)).inc()

    def _degraded(self, e: Any) -> None:
        self._remember_link(e.component, 1.0)

    def _restored(self, e: Any) -> None:
        self._remember_link(e.component, 0.0)

    def _remember_link(self, component: str, value: float) -> None:
        if component in self._links or len(self._links) < 1000:
            self._links[component] = value

    def _fault(self, e: Any) -> None:
        self.faults.labels(self._stage_label(e.stage), e.fault).inc()

    def _cut(self, e: events.StreamCut) -> None:
        self.stream_cuts.labels(self._stage_label(e.stage), e.budget).inc()

    def _ended(self, e: events.StreamEnded) -> None:
        self.stream_endings.labels(self._stage_label(e.stage), e.ending).inc()

    def _settled(self, e: events.StreamSettled) -> None:
        stage, tenant = self._stage_label(e.stage), self._tenant(e.tenant)
        if e.tokens:
            self.stream_tokens.labels(stage, tenant).inc(e.tokens)
        if e.paced_s:
            self.stream_paced.labels(stage, tenant).inc(e.paced_s)
        for kind, n in billed(e):
            self.stream_usage.labels(stage, kind, e.outcome).inc(n)

    def _failed_over(self, e: events.FailedOver) -> None:
        group, deployment, to = (self._deployment(x) for x in (e.group, e.deployment, e.to))
        self.failovers.labels(group, deployment, e.reason, to).inc()

    def _stall(self, e: Any) -> None:
        self.stalls.inc()
        self.stall_duration.observe(e.duration_s)

    def _pool(self, e: Any) -> None:
        self.pool_events.labels(e.pool, e.reason).inc()

    def _leak(self, e: Any) -> None:
        self.pool_leaks.labels(e.pool).inc()


_MISSING: Any = object()


def billed(e: events.StreamSettled) -> list[tuple[str, int]]:
    """A settled stream's tokens as its provider bills them, as ``(gen_ai.token.type, n)``:
    ``input`` when the provider reported it, ``output`` as reported, else as counted (none of 0)."""
    out: list[tuple[str, int]] = []
    if e.input_tokens:
        out.append(("input", e.input_tokens))
    output = e.tokens if e.output_tokens is None else e.output_tokens
    if output:
        out.append(("output", output))
    return out


class _Export:
    """The exporter's metrics as the scraped registry sees them: the inner registry's families,
    without their ``_created`` samples unless ``created``."""

    def __init__(self, inner: Any, created: bool) -> None:
        self._inner = inner
        self._created = created

    def collect(self) -> Iterator[Metric]:
        for family in self._inner.collect():
            if not self._created:
                family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())


class _StateCollector:
    """The gauges of what is true now, read from the Guards at scrape time (nothing runs on a
    guarded call for them): adaptive limits, hedges, throttles, tenants' slots, Redis links."""

    def __init__(
        self, guards: Callable[[], list[Guard]], stage: Callable[[str], str], links: dict[str, float]
    ) -> None:
        self._guards = guards
        self._stage = stage
        self._links = links

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from ._status import links, overload, quotas

        gauges: dict[str, dict[tuple[str, ...], float]] = {name: {} for name in _STATE_GAUGES}
        hedges: dict[tuple[str, ...], float] = {}
        keyed: dict[str, dict[tuple[str, ...], float]] = {name: {} for name in _KEY_FAMILIES}
        shared = dict(self._links)

        def add(table: dict[tuple[str, ...], float], key: tuple[str, ...], value: float | None) -> None:
            if value is not None:
                table[key] = table.get(key, 0.0) + float(value)

        def add_limit(labels: tuple[str, ...], limit: dict[str, Any]) -> None:
            add(gauges["ragguard_adaptive_limit"], labels, limit["limit"])
            add(gauges["ragguard_adaptive_min_limit"], labels, limit.get("min_limit"))
            add(gauges["ragguard_adaptive_in_flight"], labels, limit["in_flight"])
            add(gauges["ragguard_adaptive_queue_length"], labels, limit["queued"])
            add(gauges["ragguard_adaptive_min_rtt_seconds"], labels, limit["min_rtt_s"])

        def read(guard: Guard) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]], list[Any]]:
            try:
                return overload(guard), quotas(guard), links(guard), keyed_stages(guard)
            except RuntimeError:
                # a scrape from prometheus-client's server thread reads while the loop changes the
                # state: a read that raced a change (a dict resized mid-iteration) is taken again
                return overload(guard), quotas(guard), links(guard), keyed_stages(guard)

        for guard in self._guards():
            parts_of, q, guard_links, stages_keyed = read(guard)
            own_key = {stage: OVERFLOW for stage, _, _ in stages_keyed}  # a keyed stage's own: the overflow
            for name, parts in parts_of.items():
                stage = (self._stage(name),)
                limit = parts.get("limit")
                if limit is not None:
                    add_limit((*stage, own_key.get(name, "")), limit)
                throttle = parts.get("throttle")
                if throttle is not None:
                    gauges["ragguard_throttle_probability"][stage] = float(throttle["probability"])
                hedge = parts.get("hedge")
                if hedge is not None:
                    for outcome in ("fired", "won", "refused"):
                        add(hedges, (*stage, outcome), hedge[outcome])
                    if hedge.get("delay_s") is not None:
                        gauges["ragguard_hedge_delay_seconds"][stage] = float(hedge["delay_s"])
            for tenant, got in q["tenants"].items():
                add(gauges["ragguard_tenant_in_flight"], (tenant,), got["in_flight"])
                add(gauges["ragguard_tenant_waiting"], (tenant,), got["waiting"])
            add(gauges["ragguard_tenant_in_flight"], (OTHER,), q["others"]["in_flight"] or 0)
            add(gauges["ragguard_tenant_waiting"], (OTHER,), q["others"]["waiting"] or 0)
            for link in guard_links:  # a breaker no call used yet (pending) has lost nothing
                shared[link["component"]] = 0.0 if link["shared"] or link.get("pending") else 1.0
            for name, counts, runtimes in stages_keyed:
                stage = (self._stage(name),)
                add(keyed["ragguard_keys"], stage, counts["kept"])
                add(keyed["ragguard_key_overflow"], stage, counts["overflowed"])
                add(keyed["ragguard_keys_evicted"], stage, counts["evicted"])
                for key, entry in runtimes:
                    add(keyed["ragguard_key_in_flight"], (*stage, key), entry["in_flight"])
                    if "limit" in entry:
                        add_limit((*stage, key), entry["limit"])
        for name, (help_text, labels) in _STATE_GAUGES.items():
            family = GaugeMetricFamily(name, help_text, labels=list(labels))
            for key, value in gauges[name].items():
                family.add_metric(list(key), value)
            yield family
        for name, (kind, help_text, labels) in _KEY_FAMILIES.items():
            family_of = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            made = family_of(name, help_text, labels=list(labels))
            for key, value in keyed[name].items():
                made.add_metric(list(key), value)
            yield made
        counter = CounterMetricFamily(
            "ragguard_hedges", "Hedges per stage: fired, won (answered first), refused (budget).",
            labels=["stage", "outcome"],
        )  # fmt: skip
        for key, value in hedges.items():
            counter.add_metric(list(key), value)
        yield counter
        degraded = GaugeMetricFamily(
            "ragguard_shared_state_degraded",
            "1 while a component (quotas, breaker:<name>) runs on local state instead of Redis.",
            labels=["component"],
        )
        for component, value in shared.items():
            degraded.add_metric([component], value)
        yield degraded

    def describe(self) -> Iterator[Metric]:
        return iter(())


_KEYED = ("stage", "key")
_STATE_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ragguard_adaptive_limit": ("A stage's (or a key's) adaptive concurrency limit now.", _KEYED),
    "ragguard_adaptive_min_limit": ("An adaptive limit's floor (its policy's min_limit).", _KEYED),
    "ragguard_adaptive_in_flight": ("Calls holding an adaptive-limit slot now.", _KEYED),
    "ragguard_adaptive_queue_length": ("Calls queued for an adaptive limit now.", _KEYED),
    "ragguard_adaptive_min_rtt_seconds": ("An adaptive limit's baseline (no-load) latency.", _KEYED),
    "ragguard_throttle_probability": ("Share of calls client-side throttling refuses now.", ("stage",)),
    "ragguard_hedge_delay_seconds": ("How long a stage waits before hedging now.", ("stage",)),
    "ragguard_tenant_in_flight": (
        "Requests holding a tenant's concurrency slot now (policy tenants; other: the rest).",
        ("tenant",),
    ),
    "ragguard_tenant_waiting": (
        "Requests queued for a tenant's slot now (policy tenants; other: the rest).",
        ("tenant",),
    ),
}


_KEY_FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "ragguard_keys": ("gauge", "Keys a keyed stage keeps now (at most max_keys, and its declared ones).",
                      ("stage",)),
    "ragguard_key_overflow": ("counter", "Calls a keyed stage ran on its own instance for want of room.",
                              ("stage",)),
    "ragguard_keys_evicted": ("counter", "Idle keys a keyed stage forgot to make room.", ("stage",)),
    "ragguard_key_in_flight": ("gauge", "Calls in flight on each key of a keyed stage now.", _KEYED),
}  # fmt: skip

OVERFLOW = "__other__"
"""The ``key`` label of a keyed stage's own instance: the overflow (keys past ``max_keys``) and
calls without a key."""


def keyed_stages(guard: Guard) -> list[tuple[str, dict[str, int], list[tuple[str, dict[str, Any]]]]]:
    """Each keyed stage of ``guard``: its name, its map's counts and each key kept now with its
    :func:`ragguard._status.key_entry`."""
    from ._status import key_counts, key_entry

    out = []
    for name in guard.stage_names():
        keys = guard.stage(name).keys
        if keys is not None:
            out.append((name, key_counts(keys), [(key, key_entry(runtime)) for key, runtime in keys.items()]))
    return out


class _PoolCollector:
    """Reads the live monitored pools at scrape time (nothing is kept between scrapes)."""

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        from .monitors._pool import monitored_pools

        conns = GaugeMetricFamily("ragguard_redis_pool_connections", "Pool connections by state.",
                                  labels=["pool", "state"])  # fmt: skip
        maximum = GaugeMetricFamily(
            "ragguard_redis_pool_max_connections", "Pool size limit.", labels=["pool"]
        )
        waiting = GaugeMetricFamily(
            "ragguard_redis_pool_waiting", "Callers waiting for a connection.", labels=["pool"]
        )
        waits = HistogramMetricFamily(
            "ragguard_redis_pool_acquire_wait_seconds", "Time to get a connection.", labels=["pool"]
        )
        timeouts = CounterMetricFamily(
            "ragguard_redis_pool_acquire_timeouts", "Acquires that timed out.", labels=["pool"]
        )
        too_many = CounterMetricFamily(
            "ragguard_redis_pool_too_many_connections", "'Too many connections' errors.", labels=["pool"]
        )
        for pool in monitored_pools():
            s = pool.stats()
            conns.add_metric([s.pool, "in_use"], s.in_use)
            conns.add_metric([s.pool, "idle"], s.idle)
            maximum.add_metric([s.pool], s.max_connections)
            waiting.add_metric([s.pool], s.waiting)
            buckets = [(_le(b), float(c)) for b, c in s.wait_buckets]
            waits.add_metric([s.pool], buckets, s.wait_sum_s)
            timeouts.add_metric([s.pool], s.acquire_timeouts)
            too_many.add_metric([s.pool], s.too_many_connections)
        yield from (conns, maximum, waiting, waits, timeouts, too_many)

    def describe(self) -> Iterator[Metric]:
        return iter(())


class _BreakerStateCollector:
    """``ragguard_breaker_state`` at scrape time: every live breaker whose events reach ``bus``
    (:func:`ragguard.breakers.live_breakers`, the newest of a name winning), and for names no live
    breaker has, the last transition seen on the bus. Nothing runs on a guarded call. A breaker whose
    name the ``label`` cap folds into ``"other"`` has no series (one gauge cannot hold many states),
    except the breakers of the keys the ``guards``' keyed stages keep now (``stage[key]``): bounded
    by each stage's ``max_keys``, each has its series."""

    def __init__(
        self,
        bus: events.EventBus,
        last: dict[str, str],
        label: Callable[[str], str],
        guards: Callable[[], list[Guard]] | None = None,
    ) -> None:
        self._bus = bus
        self._last = last
        self._label = label
        self._guards = guards

    def _kept(self) -> set[str]:
        """The names of the breakers of the keys kept now."""
        names: set[str] = set()
        for guard in self._guards() if self._guards is not None else ():
            for name in guard.stage_names():
                keys = guard.stage(name).keys
                for _, runtime in () if keys is None else keys.items():
                    if runtime.breaker is not None:
                        names.add(runtime.breaker.name)
        return names

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        from .breakers._live import live_breakers

        states = dict(self._last)
        for breaker in live_breakers():
            if _reaches(getattr(breaker, "bus", None), self._bus):
                state = breaker.state
                states[breaker.name] = str(getattr(state, "value", state))
        try:
            kept = self._kept()
        except RuntimeError:  # a map changed under a scrape from another thread: read it again
            kept = self._kept()
        family = GaugeMetricFamily(
            "ragguard_breaker_state", "1 for the state each breaker is in, 0 for the others.",
            labels=["breaker", "state"],
        )  # fmt: skip
        for name, current in states.items():
            if name not in kept and self._label(name) == OTHER and name != OTHER:
                continue
            for state in (*BREAKER_STATES, *(() if current in BREAKER_STATES else (current,))):
                family.add_metric([name, state], 1.0 if state == current else 0.0)
        yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())


def _reaches(bus: Any, target: events.EventBus) -> bool:
    """True when events emitted on ``bus`` are delivered to ``target`` (it or a parent is)."""
    while bus is not None:
        if bus is target:
            return True
        bus = getattr(bus, "_parent", None)
    return False


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


# -- OpenTelemetry --------------------------------------------------------------------------------

_tracer: Any = None
"""The OpenTelemetry tracer while tracing is on (read by the Guard to choose the observed chain)."""


def enable_tracing(tracer_provider: Any = None) -> None:
    """Open an OpenTelemetry span per guarded stage from now on (see docs/monitors.md).

    ``tracer_provider``: an ``opentelemetry.trace.TracerProvider`` (default: the global one).
    Raises ImportError with an install hint when opentelemetry-api is missing.
    """
    global _tracer
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise ImportError(f"OpenTelemetry tracing needs opentelemetry-api: {install_hint('otel')}") from exc
    provider = trace.get_tracer_provider() if tracer_provider is None else tracer_provider
    disable_tracing()
    tracer = _OtelTracer(provider.get_tracer("ragguard"))
    tracer.untap = events.bus.tap(tracer.record)
    events.tracer = tracer
    _tracer = tracer.tracer
    _inject.epoch += 1  # the observed chains are rebuilt with their attempt spans


def disable_tracing() -> None:
    """Stop opening spans (``otel_span`` becomes a no-op again unless the bus has listeners)."""
    global _tracer
    current = events.tracer
    if isinstance(current, _OtelTracer):
        events.tracer = None
        if current.untap is not None:
            current.untap()
        _inject.epoch += 1  # and without them
    _tracer = None


def _attributes(items: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in items.items() if v is not None and v != ""}


# Each decision a guarded call meets, as a span event: the event's name and attributes.
_SPAN_EVENTS: dict[str, tuple[str, Callable[[Any], dict[str, Any]]]] = {
    "CallOutcome": ("ragguard.attempt", lambda e: {
        "ragguard.breaker": e.breaker, "ragguard.outcome": e.outcome,
        "ragguard.duration_s": e.duration_s, "error.type": e.error}),
    "RetryScheduled": ("ragguard.retry", lambda e: {
        "ragguard.attempt": e.attempt, "ragguard.wait_s": e.wait_s, "error.type": e.error}),
    "RetryBudgetExhausted": ("ragguard.retry_budget_exhausted", lambda e: {}),
    "FallbackServed": ("ragguard.fallback", lambda e: {
        "ragguard.fallback": e.fallback, "error.type": e.cause}),
    "HedgeFired": ("ragguard.hedge", lambda e: {"ragguard.delay_s": e.delay_s}),
    "LoadShed": ("ragguard.shed", lambda e: {
        "ragguard.reason": e.reason, "ragguard.priority": e.priority, "ragguard.tenant": e.tenant}),
    "Throttled": ("ragguard.throttled", lambda e: {"ragguard.probability": e.probability}),
    "CallRejected": ("ragguard.breaker_rejected", lambda e: {
        "ragguard.breaker": e.breaker, "ragguard.reason": e.state,
        "ragguard.retry_after_s": e.retry_after_s}),
    "QuotaRejected": ("ragguard.quota_rejected", lambda e: {
        "ragguard.tenant": e.tenant, "ragguard.reason": e.reason,
        "ragguard.retry_after_s": e.retry_after_s}),
    "StreamCut": ("ragguard.stream_cut", lambda e: {"ragguard.reason": e.budget, "ragguard.items": e.items}),
    "FaultInjected": ("ragguard.fault", lambda e: {"ragguard.fault": e.fault}),
    "BreakerTransition": ("ragguard.breaker_transition", lambda e: {
        "ragguard.breaker": e.breaker, "ragguard.from_state": e.old, "ragguard.to_state": e.new,
        "ragguard.reason": e.reason}),
    "FailedOver": ("ragguard.failover", lambda e: {
        "ragguard.group": e.group, "ragguard.deployment": e.deployment, "ragguard.reason": e.reason,
        "ragguard.to": e.to, "error.type": e.error, "ragguard.breaker": e.breaker}),
}  # fmt: skip


_SETTLED: Any = object()


class _OtelTracer:
    """The :class:`ragguard.events.StageTracer` for OpenTelemetry, and the bus tap that adds each
    decision to the span current where it is made."""

    __slots__ = ("_context", "_makers", "_status", "_trace", "tracer", "untap")

    def __init__(self, tracer: Any) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import Status, StatusCode

        self.tracer = tracer
        self._trace = trace
        self._context = context
        self._status = (Status, StatusCode.ERROR)
        self.untap: Callable[[], None] | None = None
        self._makers: dict[type, Any] = {}  # event type -> its _SPAN_EVENTS entry (by its classes' names)

    def start(
        self, stage: str, tenant: str, breaker_state: str, operation: str, attributes: Any = None
    ) -> Any:
        given = {"ragguard.stage": stage, "ragguard.tenant": tenant}
        if breaker_state:
            given["ragguard.breaker_state"] = breaker_state
        if operation:
            given["gen_ai.operation.name"] = operation
        if attributes:
            given.update(attributes)
        return self.tracer.start_span(f"ragguard.{stage}", attributes=given)

    def attach(self, span: Any) -> Any:
        return self._context.attach(self._trace.set_span_in_context(span))

    def start_attempt(self, attributes: dict[str, Any]) -> Any:
        """An attempt's span, the current span's child (see :mod:`ragguard.layers._attempts`)."""
        return self.tracer.start_span("ragguard.attempt", attributes=attributes)

    def end_attempt(self, span: Any, exc: BaseException | None) -> None:
        """End an attempt's span with how it ended: the outcome its error was classified as."""
        if exc is None:
            span.set_attribute("ragguard.outcome", "success")
        elif not isinstance(exc, Exception):
            span.set_attribute("ragguard.outcome", "cancelled")
        else:
            outcome = outcome_of(exc)
            kind = error_type(exc)
            span.set_attribute("ragguard.outcome", outcome.kind.value)
            if outcome.reason:
                span.set_attribute("ragguard.reason", outcome.reason)
            span.set_attribute("error.type", kind)
            status, error = self._status
            span.set_status(status(error, kind))
        span.end()

    def detach(self, token: Any) -> None:
        self._context.detach(token)

    def end(
        self, span: Any, outcome: str, exc: BaseException | None, fallback: str, first_item_s: float | None
    ) -> None:
        if fallback:
            span.set_attribute("ragguard.fallback", fallback)
        if first_item_s is not None:
            span.set_attribute("gen_ai.response.time_to_first_chunk", first_item_s)
        span.set_attribute("ragguard.outcome", outcome)
        if outcome == "error" and exc is not None:
            kind = error_type(exc)
            span.set_attribute("error.type", kind)
            span.record_exception(exc)
            status, error = self._status
            span.set_status(status(error, kind))
        span.end()

    def stream_ended(self, span: Any, ending: Any) -> None:
        """A stream's ending (:class:`ragguard.StreamEnding`) on its span, before it ends."""
        span.set_attribute("ragguard.stream.ending", ending.kind)
        span.set_attribute("ragguard.items", ending.items)
        if ending.continued_by:
            span.set_attribute("ragguard.stream.continued_by", ending.continued_by)
            span.set_attribute("ragguard.stream.continued_after", ending.continued_after)

    def record(self, event: Any) -> None:
        """The bus tap: the event as a span event of the span current where it was emitted."""
        kind = type(event)
        make = self._makers.get(kind, _MISSING)
        if make is _MISSING:
            names = [c.__name__ for c in kind.__mro__]
            make = next((_SPAN_EVENTS[n] for n in names if n in _SPAN_EVENTS), None)
            if make is None and "StreamSettled" in names:
                make = _SETTLED
            self._makers[kind] = make
        if make is None:
            return
        span = self._trace.get_current_span()
        if not span.is_recording():
            return
        if make is _SETTLED:
            output = event.tokens if event.output_tokens is None else event.output_tokens
            span.set_attribute("gen_ai.usage.output_tokens", output)
            if event.input_tokens is not None:
                span.set_attribute("gen_ai.usage.input_tokens", event.input_tokens)
            span.set_attribute("ragguard.items", event.items)
            return
        name, attributes = make
        span.add_event(name, _attributes(attributes(event)))


class StageSpan:
    """What :func:`otel_span` yields: set what the stage learnt while it ran.

    ``set_breaker_state(state)``, ``set_fallback(name)`` (the outcome becomes ``fallback``),
    ``set_outcome(outcome)``. ``span`` is the OpenTelemetry span, or None when tracing is off.
    """

    __slots__ = (
        "_attached", "_bus", "_clock", "_tracer", "breaker_state", "deadline_s", "fallback", "outcome",
        "span", "stage", "started", "tenant",
    )  # fmt: skip

    def __init__(
        self,
        stage: str,
        tenant: str,
        breaker_state: str,
        span: Any,
        bus: events.EventBus | None,
        clock: Callable[[], float] = time.monotonic,
        tracer: _OtelTracer | None = None,
    ) -> None:
        self.stage = stage
        self.tenant = tenant
        self.breaker_state = breaker_state
        self.fallback = ""
        self.outcome = ""
        self.span = span
        self._bus = bus
        self._clock = clock
        self._tracer = tracer
        self._attached: Any = None
        self.started = clock()
        self.deadline_s = remaining()  # what the request's deadline had left when the stage started

    def set_breaker_state(self, state: str) -> None:
        self.breaker_state = str(state)
        if self.span is not None:
            self.span.set_attribute("ragguard.breaker_state", self.breaker_state)

    def set_fallback(self, fallback: str) -> None:
        self.fallback = fallback

    def set_outcome(self, outcome: str) -> None:
        self.outcome = outcome

    def __enter__(self) -> StageSpan:
        if self._tracer is not None and self.span is not None:
            self._attached = self._tracer.attach(self.span)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.outcome:
            if exc is None:
                self.outcome = "fallback" if self.fallback else "success"
            else:
                self.outcome = "error" if isinstance(exc, Exception) else "cancelled"
        tracer = self._tracer
        if tracer is not None and self.span is not None:
            if self._attached is not None:
                tracer.detach(self._attached)
                self._attached = None
            tracer.end(self.span, self.outcome, exc, self.fallback, None)
        bus = self._bus
        if bus is not None and bus.active:
            error = error_type(exc) if self.outcome == "error" else ""
            bus.emit(
                StageCompleted(self.stage, self.tenant, self.outcome, self._clock() - self.started,
                               self.fallback, self.breaker_state, error, None, self.deadline_s)
            )  # fmt: skip


class _NoSpan:
    """The shared do-nothing span: tracing off and nobody listening."""

    __slots__ = ()
    span = None

    def set_breaker_state(self, state: str) -> None:
        pass

    def set_fallback(self, fallback: str) -> None:
        pass

    def set_outcome(self, outcome: str) -> None:
        pass

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


_NO_SPAN = _NoSpan()


def otel_span(
    stage: str,
    tenant: str,
    *,
    breaker_state: str = "",
    bus: events.EventBus | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """A context manager around one stage of your own: a span (current inside the block) and a
    StageCompleted event, as a guarded stage has.

    The span (when :func:`enable_tracing` was called) is named ``ragguard.<stage>`` and carries
    ``ragguard.stage``, ``ragguard.tenant``, ``ragguard.breaker_state``, ``ragguard.fallback``
    and ``ragguard.outcome``; an exception is recorded, sets ``error.type`` and the status to
    ERROR (a cancellation does not). On exit a :class:`StageCompleted` is emitted on ``bus``
    (default :data:`ragguard.events.bus`) when it has listeners. With neither, it returns a
    shared no-op. ``clock`` (monotonic seconds) times the stage. Yields a :class:`StageSpan`.
    """
    b = events.bus if bus is None else bus
    tracer = events.tracer if isinstance(events.tracer, _OtelTracer) else None
    if tracer is None and not b.active:
        return _NO_SPAN
    span = None if tracer is None else tracer.start(stage, tenant, breaker_state, "")
    return StageSpan(stage, tenant, breaker_state, span, b, clock, tracer)


# -- OpenTelemetry metrics ------------------------------------------------------------------------


class OTelMetrics:
    """ragguard's events as OpenTelemetry metrics, beside (or instead of) Prometheus.

    A listener of ``bus`` (default :data:`ragguard.events.bus`) from :meth:`start` on, recording
    on a meter named ``ragguard`` of ``meter_provider`` (default: the global one):

    - ``ragguard.stage.duration`` (histogram, s): ``ragguard.stage``, ``ragguard.outcome``,
      ``error.type`` when it failed;
    - ``ragguard.stage.time_to_first_chunk`` (histogram, s): a guarded stream's first item;
    - ``ragguard.stream.tokens`` (counter, {token}): tokens of generation streams,
      ``gen_ai.token.type`` ``output``;
    - ``ragguard.rejections`` (counter, {call}): ``ragguard.rejection`` (``breaker``, ``quota``,
      ``shed``, ``throttle``), ``ragguard.reason`` and the stage (breaker) it happened at;
    - ``ragguard.fallbacks`` (counter, {call}): ``ragguard.stage``, ``ragguard.fallback`` and the
      ``error.type`` it answered for;
    - ``ragguard.stream.endings`` (counter, {stream}): ``ragguard.stage``, ``ragguard.stream.ending``
      (``completed``, ``continued``, ``incomplete``);
    - ``ragguard.attempts`` (counter, {attempt}): each attempt through a breaker,
      ``ragguard.breaker`` (``stage`` or ``stage[key]``) and ``ragguard.outcome``;
    - ``ragguard.failovers`` (counter, {call}): ``ragguard.group``, ``ragguard.deployment`` (the one
      left), ``ragguard.reason``, ``ragguard.to`` (the one that answered, "" when none did).

    And the GenAI semantic conventions' client metrics, for stages of a GenAI operation (the
    embedding, vector_store and generation presets), each with ``gen_ai.operation.name``,
    ``gen_ai.provider.name`` and ``gen_ai.request.model`` when known, and ``ragguard.stage``:

    - ``gen_ai.client.operation.duration`` (histogram, s): one per operation as its caller sees
      it (its retries, failovers and fallbacks inside it), ``error.type`` when it failed;
    - ``gen_ai.client.operation.time_to_first_chunk`` (histogram, s): a stream's first item;
    - ``gen_ai.client.token.usage`` (histogram, {token}): each generation stream's tokens as its
      provider bills them, ``gen_ai.token.type`` ``input`` (when reported) and ``output`` (as
      reported, else as counted), and ``ragguard.outcome`` (``ok``, ``error``, ``cancelled``): a
      stream that failed part way records the usage reported before it failed.

    No tenant attribute (a tenant id is unbounded), no key (the model says it). The breaker
    names (``stage[key]``) and the models a caller names are unbounded over time too: the first
    :data:`OTEL_MAX_VALUES` distinct ones keep their value, later ones are ``other``. Raises
    ImportError with an install hint when opentelemetry-api is missing.
    """

    def __init__(self, meter_provider: Any = None, *, bus: events.EventBus | None = None) -> None:
        try:
            from opentelemetry import metrics as otel_metrics
        except ImportError as exc:
            hint = install_hint("otel")
            raise ImportError(f"OpenTelemetry metrics need opentelemetry-api: {hint}") from exc
        provider = otel_metrics.get_meter_provider() if meter_provider is None else meter_provider
        meter = provider.get_meter("ragguard")
        self._bus = events.bus if bus is None else bus
        self._stop: Callable[[], None] | None = None
        self._breaker = _Capped(OTEL_MAX_VALUES)
        self._model = _Capped(OTEL_MAX_VALUES)
        self.duration = meter.create_histogram(
            "ragguard.stage.duration", unit="s", description="Guarded stage latency, fallbacks included."
        )
        self.first_chunk = meter.create_histogram(
            "ragguard.stage.time_to_first_chunk",
            unit="s",
            description="Time to a guarded stream's first item.",
        )
        self.tokens = meter.create_counter(
            "ragguard.stream.tokens", unit="{token}", description="Tokens counted in generation streams."
        )
        self.rejections = meter.create_counter(
            "ragguard.rejections", unit="{call}", description="Calls ragguard refused, by kind and reason."
        )
        self.fallbacks = meter.create_counter(
            "ragguard.fallbacks", unit="{call}", description="Answers served by a fallback."
        )
        self.endings = meter.create_counter(
            "ragguard.stream.endings", unit="{stream}",
            description="Guarded streams ended: completed, continued or incomplete.",
        )  # fmt: skip
        self.attempts = meter.create_counter(
            "ragguard.attempts", unit="{attempt}",
            description="Attempts through a circuit breaker, by outcome.",
        )  # fmt: skip
        self.failovers = meter.create_counter(
            "ragguard.failovers", unit="{call}",
            description="Calls a model group took from a deployment to the next.",
        )  # fmt: skip
        self.operation_duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=GEN_AI_DURATION_BUCKETS_S,
        )  # fmt: skip
        self.time_to_first_chunk = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk", unit="s",
            description="Time to receive the first chunk of a streamed GenAI operation.",
            explicit_bucket_boundaries_advisory=GEN_AI_DURATION_BUCKETS_S,
        )  # fmt: skip
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=GEN_AI_TOKEN_BUCKETS,
        )  # fmt: skip

    def start(self) -> OTelMetrics:
        """Subscribe to the bus; returns self. Starting twice is a no-op."""
        if self._stop is None:
            self._stop = self._bus.subscribe(self.handle)
        return self

    def close(self) -> None:
        stop, self._stop = self._stop, None
        if stop is not None:
            stop()

    def handle(self, e: Any) -> None:
        """Record one event (the bus listener). Unknown event types are ignored."""
        kind = type(e).__name__
        if kind == "StageCompleted":
            attributes = {"ragguard.stage": e.stage, "ragguard.outcome": e.outcome}
            error = getattr(e, "error", "")
            if error:
                attributes["error.type"] = error
            self.duration.record(e.duration_s, attributes)
            first = getattr(e, "first_item_s", None)
            if first is not None:
                self.first_chunk.record(first, {"ragguard.stage": e.stage})
            at = getattr(e, "where", None)
            if at is not None and at.operation:
                self._operation(e, at, error, first)
        elif kind == "StreamEnded":
            self.endings.add(1, {"ragguard.stage": e.stage, "ragguard.stream.ending": e.ending})
        elif kind == "StreamSettled":
            if e.tokens:
                self.tokens.add(e.tokens, {"ragguard.stage": e.stage, "gen_ai.token.type": "output"})
            usage = self._gen_ai({"gen_ai.operation.name": "chat", "ragguard.stage": e.stage,
                                  "ragguard.outcome": e.outcome}, e.provider, e.model)  # fmt: skip
            for token_type, n in billed(e):
                self.token_usage.record(n, {**usage, "gen_ai.token.type": token_type})
        elif isinstance(e, events.CallOutcome):  # a breaker's own subclass too
            breaker = self._breaker(e.breaker)
            self.attempts.add(1, {"ragguard.breaker": breaker, "ragguard.outcome": e.outcome})
        elif kind == "FailedOver":
            self.failovers.add(1, {"ragguard.group": e.group, "ragguard.deployment": e.deployment,
                                   "ragguard.reason": e.reason, "ragguard.to": e.to})  # fmt: skip
        elif kind == "FallbackServed":
            self.fallbacks.add(1, {"ragguard.stage": e.stage, "ragguard.fallback": e.fallback,
                                   "error.type": e.cause})  # fmt: skip
        elif kind == "CallRejected":
            self._rejected("breaker", e.state, {"ragguard.breaker": self._breaker(e.breaker)})
        elif kind == "QuotaRejected":
            self._rejected("quota", e.reason, {})
        elif kind == "LoadShed":
            self._rejected("shed", e.reason, {"ragguard.stage": e.stage})
        elif kind == "Throttled":
            self._rejected("throttle", "throttled", {"ragguard.stage": e.stage})

    def _rejected(self, rejection: str, reason: str, where: dict[str, str]) -> None:
        self.rejections.add(1, {"ragguard.rejection": rejection, "ragguard.reason": reason, **where})

    def _operation(self, e: StageCompleted, at: events.Where, error: str, first: float | None) -> None:
        """A GenAI operation's duration and time to first chunk, by the conventions' names."""
        attributes = self._gen_ai({"gen_ai.operation.name": at.operation, "ragguard.stage": e.stage},
                                  at.provider, at.model)  # fmt: skip
        if first is not None:
            self.time_to_first_chunk.record(first, attributes)
        if error:
            attributes["error.type"] = error
        self.operation_duration.record(e.duration_s, attributes)

    def _gen_ai(self, attributes: dict[str, Any], provider: str, model: str) -> dict[str, Any]:
        """``attributes`` with ``gen_ai.provider.name`` and ``gen_ai.request.model`` when known
        (the model capped: :data:`OTEL_MAX_VALUES`)."""
        if provider:
            attributes["gen_ai.provider.name"] = provider
        if model:
            attributes["gen_ai.request.model"] = self._model(model)
        return attributes


OTEL_MAX_VALUES = 100
"""Distinct breaker names and models that keep their own value in :class:`OTelMetrics`' attributes
(the rest are ``other``): a caller's keys and models cannot grow the series without bound."""

GEN_AI_DURATION_BUCKETS_S: tuple[float, ...] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
"""The GenAI semantic conventions' bucket boundaries for durations (seconds)."""
GEN_AI_TOKEN_BUCKETS: tuple[float, ...] = tuple(float(4**i) for i in range(14))
"""The GenAI semantic conventions' bucket boundaries for token counts: 1, 4, 16 ... 4**13."""

