"""Prometheus and OpenTelemetry export of ragguard's events.

Prometheus (prometheus-client, a core dependency)::

    exporter = ragguard.metrics.PrometheusExporter().start()   # subscribes to ragguard.events.bus
    exporter.serve(9464)                                        # or scrape exporter.registry yourself

Metrics live in a dedicated ``CollectorRegistry`` unless one is passed. Names follow Prometheus
conventions: ``ragguard_`` prefix, ``_seconds`` for durations, ``_total`` for counters, labels
``stage``, ``tenant``, ``outcome``, ``breaker``, ``fallback``. Tenant, stage and breaker labels are
capped: the first ``max_tenants`` tenants (``max_stages`` stages, ``max_breakers`` breakers) seen keep
their name, every later one is folded into ``"other"``, so generated names cannot grow a scrape
without bound.

OpenTelemetry (ragguard's optional ``otel`` extra): :func:`enable_tracing` turns on a span per
guarded stage opened by :func:`otel_span`; without it, or without opentelemetry-api installed,
``otel_span`` costs one branch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import _validate as v
from . import events
from ._errors import ConfigError
from ._extras import install_hint

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

__all__ = [
    "BREAKER_STATES",
    "DEFAULT_LATENCY_BUCKETS_S",
    "PrometheusExporter",
    "StageCompleted",
    "StageSpan",
    "disable_tracing",
    "enable_tracing",
    "otel_span",
]

DEFAULT_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip
BREAKER_STATES: tuple[str, ...] = ("closed", "open", "half_open", "forced_open", "disabled")
STALL_BUCKETS_S: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
OTHER = "other"


@events.quick_init
@dataclass(frozen=True, slots=True)
class StageCompleted:
    """Guarded stage ``stage`` ended for ``tenant`` after ``duration_s`` seconds.

    ``outcome`` is ``success``, ``fallback`` (answered by ``fallback``), ``error`` or
    ``cancelled``; ``breaker_state`` the stage breaker's state when it ran ("" when none).
    Emitted by :func:`otel_span` when the bus has listeners.
    """

    stage: str
    tenant: str
    outcome: str
    duration_s: float
    fallback: str = ""
    breaker_state: str = ""


# -- Prometheus -----------------------------------------------------------------------------------


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise ImportError("ragguard.metrics needs prometheus-client: pip install prometheus-client") from exc
    return prometheus_client


class _Capped:
    """Label values kept as seen for the first ``limit`` distinct ones, the rest become ``other``."""

    __slots__ = ("limit", "seen")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self.seen:
            return value
        if len(self.seen) < self.limit:
            self.seen.add(value)
            return value
        return OTHER


class PrometheusExporter:
    """Turns every ragguard event on ``bus`` into Prometheus metrics in ``registry``.

    ``registry`` default: a new dedicated ``CollectorRegistry``; ``bus`` default
    :data:`ragguard.events.bus`; ``max_tenants``, ``max_stages``, ``max_breakers`` (each >= 1,
    default 100): distinct tenant, stage and breaker labels before the rest fold into ``"other"``
    (a breaker folded into ``"other"`` has no ``ragguard_breaker_state`` series: one gauge cannot
    hold the states of many breakers); ``latency_buckets_s`` histogram bounds in seconds;
    ``pools`` also export the gauges and wait histograms of every live
    :class:`ragguard.monitors.MonitoredConnectionPool`. Raises ConfigError for bad options.

    Metrics (all listed in docs/monitors.md): ``ragguard_stage_duration_seconds``,
    ``ragguard_call_duration_seconds``, ``ragguard_calls_rejected_total``, ``ragguard_breaker_state``,
    ``ragguard_breaker_transitions_total``, ``ragguard_fallbacks_served_total``,
    ``ragguard_quota_rejections_total``, ``ragguard_retries_total``,
    ``ragguard_retry_budget_exhausted_total``, ``ragguard_faults_injected_total``,
    ``ragguard_streams_cut_total``, ``ragguard_stream_tokens_total``,
    ``ragguard_stream_paced_seconds_total``,
    ``ragguard_loop_stalls_total``, ``ragguard_loop_stall_duration_seconds``, ``ragguard_redis_pool_*``.
    """

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        bus: events.EventBus | None = None,
        max_tenants: int = 100,
        max_stages: int = 100,
        max_breakers: int = 100,
        latency_buckets_s: tuple[float, ...] = DEFAULT_LATENCY_BUCKETS_S,
        pools: bool = True,
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
        self._tenant = _Capped(max_tenants)
        self._stage_label = _Capped(max_stages)
        self._breaker = _Capped(max_breakers)
        self._unsubscribe: Callable[[], None] | None = None
        r = self.registry
        self.stage_duration = pc.Histogram(
            "ragguard_stage_duration_seconds", "Guarded stage latency, fallbacks included.",
            ["stage", "tenant", "outcome"], buckets=buckets, registry=r,
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
        r.register(_BreakerStateCollector(self._bus, self._last_states, self._breaker))
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
        self.retries = pc.Counter("ragguard_retries", "Retries scheduled.", ["stage"], registry=r)
        self.retry_budget = pc.Counter(
            "ragguard_retry_budget_exhausted", "Retries refused because the retry budget was spent.",
            ["stage", "tenant"], registry=r,
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
        self.stream_tokens = pc.Counter(
            "ragguard_stream_tokens", "Tokens counted in generation streams, per tenant.",
            ["stage", "tenant"], registry=r,
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
            "FaultInjected": self._fault,
            "StreamCut": self._cut,
            "StreamSettled": self._settled,
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

    def serve(self, port: int, addr: str = "127.0.0.1") -> Any:
        """Serve ``/metrics`` over HTTP on ``addr:port`` from a daemon thread (prometheus-client's server)."""
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

    def _call(self, e: events.CallOutcome) -> None:
        self.call_duration.labels(self._breaker(e.breaker), e.outcome).observe(e.duration_s)

    def _rejected(self, e: events.CallRejected) -> None:
        self.rejected.labels(self._breaker(e.breaker), e.state).inc()

    def _transition(self, e: events.BreakerTransition) -> None:
        self.transitions.labels(self._breaker(e.breaker), e.old, e.new).inc()
        self._last_states[e.breaker] = e.new

    def _fallback(self, e: events.FallbackServed) -> None:
        self.fallbacks.labels(self._stage_label(e.stage), e.fallback, self._tenant(e.tenant)).inc()

    def _quota(self, e: events.QuotaRejected) -> None:
        self.quota_rejections.labels(self._tenant(e.tenant), e.reason).inc()

    def _retry(self, e: events.RetryScheduled) -> None:
        self.retries.labels(self._stage_label(e.stage)).inc()

    def _budget(self, e: events.RetryBudgetExhausted) -> None:
        self.retry_budget.labels(self._stage_label(e.stage), self._tenant(e.tenant)).inc()

    def _fault(self, e: Any) -> None:
        self.faults.labels(self._stage_label(e.stage), e.fault).inc()

    def _cut(self, e: events.StreamCut) -> None:
        self.stream_cuts.labels(self._stage_label(e.stage), e.budget).inc()

    def _settled(self, e: events.StreamSettled) -> None:
        stage, tenant = self._stage_label(e.stage), self._tenant(e.tenant)
        if e.tokens:
            self.stream_tokens.labels(stage, tenant).inc(e.tokens)
        if e.paced_s:
            self.stream_paced.labels(stage, tenant).inc(e.paced_s)

    def _stall(self, e: Any) -> None:
        self.stalls.inc()
        self.stall_duration.observe(e.duration_s)

    def _pool(self, e: Any) -> None:
        self.pool_events.labels(e.pool, e.reason).inc()

    def _leak(self, e: Any) -> None:
        self.pool_leaks.labels(e.pool).inc()


_MISSING: Any = object()


class _PoolCollector:
    """Reads the live monitored pools at scrape time (nothing is kept between scrapes)."""

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        from .monitors import monitored_pools

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
    name the ``label`` cap folds into ``"other"`` has no series (one gauge cannot hold many states)."""

    def __init__(self, bus: events.EventBus, last: dict[str, str], label: Callable[[str], str]) -> None:
        self._bus = bus
        self._last = last
        self._label = label

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        from .breakers import live_breakers

        states = dict(self._last)
        for breaker in live_breakers():
            if _reaches(getattr(breaker, "bus", None), self._bus):
                state = breaker.state
                states[breaker.name] = str(getattr(state, "value", state))
        family = GaugeMetricFamily(
            "ragguard_breaker_state", "1 for the state each breaker is in, 0 for the others.",
            labels=["breaker", "state"],
        )  # fmt: skip
        for name, current in states.items():
            if self._label(name) == OTHER and name != OTHER:
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


def enable_tracing(tracer_provider: Any = None) -> None:
    """Open an OpenTelemetry span per guarded stage from now on.

    ``tracer_provider``: an ``opentelemetry.trace.TracerProvider`` (default: the global one).
    Raises ImportError with an install hint when opentelemetry-api is missing.
    """
    global _tracer
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise ImportError(f"OpenTelemetry tracing needs opentelemetry-api: {install_hint('otel')}") from exc
    provider = trace.get_tracer_provider() if tracer_provider is None else tracer_provider
    _tracer = provider.get_tracer("ragguard")


def disable_tracing() -> None:
    """Stop opening spans (``otel_span`` becomes a no-op again unless the bus has listeners)."""
    global _tracer
    _tracer = None


class StageSpan:
    """What :func:`otel_span` yields: set what the stage learnt while it ran.

    ``set_breaker_state(state)``, ``set_fallback(name)`` (the outcome becomes ``fallback``),
    ``set_outcome(outcome)``. ``span`` is the OpenTelemetry span, or None when tracing is off.
    """

    __slots__ = (
        "_bus", "_clock", "breaker_state", "fallback", "outcome", "span", "stage", "started", "tenant",
    )

    def __init__(
        self,
        stage: str,
        tenant: str,
        breaker_state: str,
        span: Any,
        bus: events.EventBus | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stage = stage
        self.tenant = tenant
        self.breaker_state = breaker_state
        self.fallback = ""
        self.outcome = ""
        self.span = span
        self._bus = bus
        self._clock = clock
        self.started = clock()

    def set_breaker_state(self, state: str) -> None:
        self.breaker_state = str(state)
        if self.span is not None:
            self.span.set_attribute("ragguard.breaker_state", self.breaker_state)

    def set_fallback(self, fallback: str) -> None:
        self.fallback = fallback
        if self.span is not None:
            self.span.set_attribute("ragguard.fallback", fallback)

    def set_outcome(self, outcome: str) -> None:
        self.outcome = outcome

    def __enter__(self) -> StageSpan:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.outcome:
            if exc is None:
                self.outcome = "fallback" if self.fallback else "success"
            else:
                self.outcome = "error" if isinstance(exc, Exception) else "cancelled"
        span = self.span
        if span is not None:
            span.set_attribute("ragguard.outcome", self.outcome)
            if exc is not None and isinstance(exc, Exception):
                from opentelemetry.trace import Status, StatusCode

                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            span.end()
        bus = self._bus
        if bus is not None and bus.active:
            bus.emit(
                StageCompleted(self.stage, self.tenant, self.outcome, self._clock() - self.started,
                               self.fallback, self.breaker_state)
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
    """A context manager around one guarded stage: an OpenTelemetry span and a StageCompleted event.

    The span (when :func:`enable_tracing` was called) is named ``ragguard.<stage>`` and carries
    ``ragguard.stage``, ``ragguard.tenant``, ``ragguard.breaker_state``, ``ragguard.fallback``
    and ``ragguard.outcome``; an exception is recorded and sets the status to ERROR (a
    cancellation does not). On exit a :class:`StageCompleted` is emitted on ``bus`` (default
    :data:`ragguard.events.bus`) when it has listeners. With neither, it returns a shared no-op.
    ``clock`` (monotonic seconds) times the stage. Yields a :class:`StageSpan`.
    """
    b = events.bus if bus is None else bus
    tracer = _tracer
    if tracer is None and not b.active:
        return _NO_SPAN
    span = None
    if tracer is not None:
        attributes = {"ragguard.stage": stage, "ragguard.tenant": tenant}
        if breaker_state:
            attributes["ragguard.breaker_state"] = breaker_state
        span = tracer.start_span(f"ragguard.{stage}", attributes=attributes)
    return StageSpan(stage, tenant, breaker_state, span, b, clock)
