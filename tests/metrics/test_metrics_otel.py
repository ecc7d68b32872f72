"""OpenTelemetry spans per guarded stage, checked with the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator

import pytest

from ragguard import events, metrics

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402

from otel_helpers import traced  # noqa: E402


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with traced() as (_, exporter):
        yield exporter


def test_span_carries_stage_tenant_breaker_state_and_fallback(spans: InMemorySpanExporter) -> None:
    with metrics.otel_span("embed", "acme", breaker_state="open", bus=events.EventBus()) as s:
        s.set_fallback("cache")
    (span,) = spans.get_finished_spans()
    assert span.name == "ragguard.embed"
    assert dict(span.attributes or {}) == {
        "ragguard.stage": "embed", "ragguard.tenant": "acme", "ragguard.breaker_state": "open",
        "ragguard.fallback": "cache", "ragguard.outcome": "fallback",
    }  # fmt: skip


def test_errors_are_recorded_and_cancellation_is_not_an_error(spans: InMemorySpanExporter) -> None:
    with pytest.raises(TimeoutError), metrics.otel_span("search", "t1") as s:
        s.set_breaker_state("half_open")
        raise TimeoutError
    with pytest.raises(asyncio.CancelledError), metrics.otel_span("search", "t1"):
        raise asyncio.CancelledError
    failed, cancelled = spans.get_finished_spans()
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None and failed.attributes["ragguard.breaker_state"] == "half_open"
    assert [e.name for e in failed.events] == ["exception"]
    assert cancelled.status.status_code is not StatusCode.ERROR
    assert cancelled.attributes is not None and cancelled.attributes["ragguard.outcome"] == "cancelled"


def test_disabled_and_unobserved_is_a_shared_noop() -> None:
    quiet = events.EventBus()
    a = metrics.otel_span("embed", "t", bus=quiet)
    b = metrics.otel_span("rerank", "u", bus=quiet)
    assert a is b and a.span is None
    with a as s:
        s.set_fallback("x")


def test_missing_opentelemetry_gives_an_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match=r"ragguard\[otel\]"):
        metrics.enable_tracing()
