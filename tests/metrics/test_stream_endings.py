"""A guarded stream's typed ending in the metrics and spans: ``ragguard_stream_endings_total`` by
stage and ending, the OpenTelemetry counter ``ragguard.stream.endings``, and the stage span's
``ragguard.stream.ending`` (with the continuation that took over and when)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ragguard import Guard, Policy, StagePolicy, metrics
from ragguard.metrics import OTelMetrics, PrometheusExporter
from ragguard.rag import Partial

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _isolated(isolated_registry: None) -> None:
    pass


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    metrics.enable_tracing(provider)
    try:
        yield exporter
    finally:
        metrics.disable_tracing()


def answers(g: Guard) -> tuple[Any, Any]:
    """A model that drops the stream after two words unless asked for all, and its continuation."""

    async def finish(question: str, cut: bool, *, partial: Partial) -> AsyncIterator[str]:
        for word in ("c ", "d "):
            yield word

    @g.guard("generation", continuation=finish)
    async def answer(question: str, cut: bool) -> AsyncIterator[str]:
        yield "a "
        yield "b "
        if cut:
            raise ConnectionResetError("dropped")
        yield "c "

    @g.guard("generation")
    async def bare(question: str, cut: bool) -> AsyncIterator[str]:
        yield "a "
        raise ConnectionResetError("dropped")

    return answer, bare


async def read(stream: Any) -> str:
    got = []
    try:
        async for word in stream:
            got.append(word)
    except ConnectionResetError:
        pass
    return "".join(got)


async def test_endings_are_counted_by_stage_and_kind_and_set_on_the_span(spans: InMemorySpanExporter) -> None:
    exporter = PrometheusExporter().start()
    reader = InMemoryMetricReader()
    otel = OTelMetrics(MeterProvider(metric_readers=[reader])).start()
    g = Guard(Policy(stages={"generation": StagePolicy()}))
    answer, bare = answers(g)
    assert await read(answer("q", True)) == "a b c d "
    assert await read(answer("q", False)) == "a b c "
    assert await read(bare("q", True)) == "a "
    for _ in range(5):  # the bus delivers on later loop iterations
        await asyncio.sleep(0)

    scraped = {
        (s.name, s.labels.get("ending")): s.value
        for family in text_string_to_metric_families(exporter.scrape().decode())
        for s in family.samples
        if s.name == "ragguard_stream_endings_total" and s.labels.get("stage") == "generation"
    }
    assert scraped == {
        ("ragguard_stream_endings_total", "continued"): 1,
        ("ragguard_stream_endings_total", "completed"): 1,
        ("ragguard_stream_endings_total", "incomplete"): 1,
    }

    counted = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "ragguard.stream.endings":
                    for point in metric.data.data_points:
                        counted[point.attributes["ragguard.stream.ending"]] = point.value
    assert counted == {"continued": 1, "completed": 1, "incomplete": 1}

    stages = [s for s in spans.get_finished_spans() if s.name == "ragguard.generation"]
    assert [s.attributes["ragguard.stream.ending"] for s in stages] == [
        "continued",
        "completed",
        "incomplete",
    ]
    continued = stages[0].attributes
    assert (continued["ragguard.stream.continued_by"], continued["ragguard.stream.continued_after"]) == (
        "finish",
        2,
    )
    assert continued["ragguard.items"] == 4 and continued["ragguard.outcome"] == "fallback"
    assert "ragguard.stream.continued_by" not in stages[1].attributes
    exporter.close()
    otel.close()
