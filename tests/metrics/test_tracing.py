"""Spans of guarded stages with the real OpenTelemetry SDK (in-memory exporters): the stage span
is current while the stage runs, so httpx's own instrumentation nests under it (calls, streams, a
hedge's second leg); each decision is a span event; GenAI semantic-convention attributes."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from metrics_helpers import http_server
from prometheus_client.parser import text_string_to_metric_families

from ragguard import Guard, HedgePolicy, Policy, RetryPolicy, StagePolicy, events, metrics
from ragguard.rag import Partial

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry import trace  # noqa: E402
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402

from otel_helpers import traced  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _isolated(isolated_registry: None) -> None:
    pass


@pytest.fixture
def provider() -> Iterator[tuple[Any, InMemorySpanExporter]]:
    with traced() as both:
        yield both


@pytest.fixture
def url() -> Iterator[str]:
    with http_server() as base:
        yield base


def _client(tracer_provider: Any) -> httpx.AsyncClient:
    client = httpx.AsyncClient()
    HTTPXClientInstrumentor.instrument_client(client, tracer_provider=tracer_provider)
    return client


def _by_name(exporter: InMemorySpanExporter) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for span in exporter.get_finished_spans():
        out.setdefault(span.name, []).append(span)
    return out


def _is_child(child: Any, parent: Any) -> bool:
    return child.parent is not None and child.parent.span_id == parent.context.span_id


async def test_an_httpx_span_inside_a_guarded_call_is_its_attempt_spans_child(
    provider: tuple[Any, InMemorySpanExporter], url: str
) -> None:
    tracer_provider, exporter = provider
    g = Guard(Policy())
    async with _client(tracer_provider) as client:

        @g.guard("vector_store")
        async def search(query: str) -> str:
            return (await client.get(f"{url}/search")).text

        assert await search("q") == "/search"
    spans = _by_name(exporter)
    (stage,) = spans["ragguard.vector_store"]
    (attempt,) = spans["ragguard.attempt"]
    (http,) = spans["GET"]
    assert _is_child(attempt, stage) and _is_child(http, attempt)
    assert attempt.attributes["ragguard.attempt"] == 1
    assert attempt.attributes["ragguard.outcome"] == "success"
    assert stage.attributes["gen_ai.operation.name"] == "retrieval"
    assert stage.attributes["ragguard.stage"] == "vector_store"
    assert stage.attributes["ragguard.outcome"] == "success"
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing left attached


async def test_a_stream_nests_its_reads_but_not_the_callers_spans(
    provider: tuple[Any, InMemorySpanExporter], url: str
) -> None:
    tracer_provider, exporter = provider
    g = Guard(Policy())
    caller = tracer_provider.get_tracer("caller")
    async with _client(tracer_provider) as client:

        @g.guard("generation")
        async def generate(prompt: str) -> AsyncIterator[str]:
            for word in ("alpha", "beta", "gamma"):
                got = (await client.get(f"{url}/{word}")).text
                yield got.strip("/") + " "

        words = []
        async for word in generate("p"):
            with caller.start_as_current_span("caller-work"):
                words.append(word)
    assert words == ["alpha ", "beta ", "gamma "]
    spans = _by_name(exporter)
    (stage,) = spans["ragguard.generation"]
    assert len(spans["GET"]) == 3
    assert all(_is_child(http, stage) for http in spans["GET"])
    assert not any(_is_child(work, stage) for work in spans["caller-work"])
    assert all(work.parent is None for work in spans["caller-work"])
    assert stage.attributes["gen_ai.operation.name"] == "chat"
    assert 0 < stage.attributes["gen_ai.response.time_to_first_chunk"] < stage.end_time / 1e9
    assert stage.attributes["gen_ai.usage.output_tokens"] >= 3
    assert stage.attributes["ragguard.items"] == 3
    assert stage.attributes["ragguard.outcome"] == "success"
    (attempt,) = spans["ragguard.attempt"]  # the stream's attempt: from its opening to its end
    assert _is_child(attempt, stage) and attempt.attributes["ragguard.outcome"] == "success"
    assert attempt.end_time >= max(http.end_time for http in spans["GET"])
    assert trace.get_current_span() is trace.INVALID_SPAN


async def test_a_stream_closed_early_ends_its_span_and_detaches(
    provider: tuple[Any, InMemorySpanExporter], url: str
) -> None:
    tracer_provider, exporter = provider
    g = Guard(Policy())
    async with _client(tracer_provider) as client:

        @g.guard("generation")
        async def generate(prompt: str) -> AsyncIterator[str]:
            try:
                while True:
                    yield (await client.get(f"{url}/w")).text
            finally:
                await client.get(f"{url}/closing")  # cleanup inside the stage is its child too

        stream = generate("p")
        assert await stream.__anext__() == "/w"
        await stream.aclose()
    spans = _by_name(exporter)
    (stage,) = spans["ragguard.generation"]
    assert stage.attributes["ragguard.outcome"] == "cancelled"
    assert all(_is_child(http, stage) for http in spans["GET"]) and len(spans["GET"]) == 2
    assert trace.get_current_span() is trace.INVALID_SPAN


async def test_the_hedges_second_leg_is_an_attempt_of_the_stage_span(
    provider: tuple[Any, InMemorySpanExporter], url: str
) -> None:
    tracer_provider, exporter = provider
    hedge = HedgePolicy(min_samples=5, samples=16, quantile=0.5, budget_ratio=1.0, budget_min_per_s=100)
    g = Guard(Policy(stages={"lookup": StagePolicy(hedge=hedge, idempotent=True)}))
    legs = 0
    async with _client(tracer_provider) as client:

        @g.guard("lookup", breaker=False)
        async def lookup(key: str) -> str:
            nonlocal legs
            legs += 1
            if key == "slow" and legs == 1:
                await asyncio.sleep(5)  # the first leg hangs: the hedge answers
            return (await client.get(f"{url}/{key}")).text

        for _ in range(6):
            legs = 0
            assert await lookup("warm") == "/warm"
        exporter.clear()
        legs = 0
        assert await lookup("slow") == "/slow"
    spans = _by_name(exporter)
    (stage,) = spans["ragguard.lookup"]
    (http,) = spans["GET"]  # only the second leg reached the server
    first, second = sorted(spans["ragguard.attempt"], key=lambda span: span.start_time)
    assert _is_child(first, stage) and _is_child(second, stage) and _is_child(http, second)
    assert first.attributes["ragguard.outcome"] == "cancelled"  # the hedge answered: the first leg stopped
    assert second.attributes["ragguard.outcome"] == "success"
    assert [e.name for e in second.events] == ["ragguard.hedge"]  # sent from the hedged attempt
    assert second.events[0].attributes["ragguard.delay_s"] > 0


async def test_a_retried_then_fallback_call_records_each_decision(
    provider: tuple[Any, InMemorySpanExporter],
) -> None:
    _, exporter = provider
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens: a real connection refused, from httpx
    retry = RetryPolicy(attempts=3, initial_backoff_s=0.001, jitter_s=0.0)
    g = Guard(Policy(stages={"vector_store": StagePolicy(retry=retry)}))

    async def keyword_search(query: str) -> str:
        return "from keywords"

    async with httpx.AsyncClient() as client:

        @g.guard("vector_store", fallback=keyword_search)
        async def search(query: str) -> str:
            return (await client.get(f"http://127.0.0.1:{port}/")).text

        assert await search("q") == "from keywords"
    spans = _by_name(exporter)
    (stage,) = spans["ragguard.vector_store"]
    named = [(e.name, dict(e.attributes or {})) for e in stage.events]
    assert [n for n, _ in named] == ["ragguard.retry", "ragguard.retry", "ragguard.fallback"]
    attempts = sorted(spans["ragguard.attempt"], key=lambda span: span.start_time)
    assert [a.attributes["ragguard.attempt"] for a in attempts] == [1, 2, 3]
    for attempt in attempts:  # each a child of the stage's span, saying why it failed
        assert _is_child(attempt, stage)
        assert attempt.attributes["ragguard.outcome"] == "failure"
        assert attempt.attributes["ragguard.reason"] == "connection"
        assert attempt.attributes["error.type"] == "ConnectError"
        assert attempt.status.status_code is StatusCode.ERROR
        (breaker,) = attempt.events  # the breaker's view of the attempt
        assert breaker.name == "ragguard.attempt" and breaker.attributes["ragguard.outcome"] == "failure"
    retries = [a for n, a in named if n == "ragguard.retry"]
    assert [a["ragguard.attempt"] for a in retries] == [2, 3]
    assert all(a["error.type"] == "ConnectError" and a["ragguard.wait_s"] >= 0 for a in retries)
    assert named[-1][1] == {"ragguard.fallback": "keyword_search", "error.type": "ConnectError"}
    assert stage.attributes["ragguard.outcome"] == "fallback"
    assert stage.attributes["ragguard.fallback"] == "keyword_search"
    assert stage.status.status_code is not StatusCode.ERROR


async def test_an_error_sets_error_type_and_a_rejection_is_an_event(
    provider: tuple[Any, InMemorySpanExporter],
) -> None:
    _, exporter = provider
    g = Guard(Policy())

    @g.guard("embedding")
    async def embed(texts: list[str]) -> list[float]:
        raise ValueError("a caller's bad input")

    with pytest.raises(ValueError):
        await embed(["x"])
    breaker = g.breaker("embedding")
    breaker.force_open()
    with pytest.raises(Exception, match="open"):
        await embed(["x"])
    spans = _by_name(exporter)
    failed, rejected = spans["ragguard.embedding"]
    assert failed.attributes["error.type"] == "ValueError"
    assert failed.attributes["gen_ai.operation.name"] == "embeddings"
    assert failed.status.status_code is StatusCode.ERROR
    tried, refused = sorted(spans["ragguard.attempt"], key=lambda span: span.start_time)
    assert _is_child(tried, failed) and _is_child(refused, rejected)
    assert tried.attributes["ragguard.outcome"] == "caller_error"
    assert refused.attributes["ragguard.outcome"] == "refused"  # the breaker refused the attempt
    assert refused.events[0].name == "ragguard.breaker_rejected"
    assert refused.events[0].attributes["ragguard.reason"] == "forced_open"
    assert rejected.attributes["error.type"] == "EmbeddingUnavailable"


async def test_otel_metrics_come_from_the_same_events() -> None:
    reader = InMemoryMetricReader()
    recorder = metrics.OTelMetrics(MeterProvider(metric_readers=[reader])).start()
    try:
        g = Guard(Policy())

        async def cached(texts: list[str]) -> list[float]:
            return [0.0]

        @g.guard("embedding", fallback=cached)
        async def embed(texts: list[str]) -> list[float]:
            raise ConnectionRefusedError

        @g.guard("generation")
        async def generate(prompt: str) -> AsyncIterator[str]:
            for word in ("one ", "two "):
                yield word

        assert await embed(["x"]) == [0.0]
        assert [w async for w in generate("p")] == ["one ", "two "]
        await asyncio.sleep(0.01)  # the bus delivers on the next loop iterations
    finally:
        recorder.close()
    data = reader.get_metrics_data()
    points: dict[str, list[Any]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points[metric.name] = list(metric.data.data_points)
    stages = {p.attributes["ragguard.stage"]: p for p in points["ragguard.stage.duration"]}
    assert stages["embedding"].attributes["ragguard.outcome"] == "fallback" and stages["embedding"].count == 1
    assert stages["generation"].attributes["ragguard.outcome"] == "success"
    (first,) = points["ragguard.stage.time_to_first_chunk"]
    assert first.attributes["ragguard.stage"] == "generation" and first.count == 1
    (tokens,) = points["ragguard.stream.tokens"]
    assert tokens.value >= 2 and tokens.attributes["gen_ai.token.type"] == "output"
    documented = _docs_column("**Metrics.**", "No tenant attribute")
    assert documented == set(points) | {"ragguard.rejections", "ragguard.failovers"}  # none in this run
    (fallback,) = points["ragguard.fallbacks"]
    assert fallback.attributes["ragguard.fallback"] == "cached"
    assert fallback.attributes["error.type"] == "ConnectionRefusedError"


async def test_attempt_spans_come_and_go_with_tracing() -> None:
    g = Guard(Policy())

    @g.guard("lookup")
    async def lookup(q: str) -> str:
        return q

    seen: list[Any] = []
    unsubscribe = events.bus.subscribe(seen.append)  # a listener: the observed chain runs throughout
    try:
        assert await lookup("untraced") == "untraced"  # its chain built with tracing off
        exporter = InMemorySpanExporter()
        tracer_provider = sdk_trace.TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        metrics.enable_tracing(tracer_provider)
        try:
            assert await lookup("traced") == "traced"
        finally:
            metrics.disable_tracing()
        assert await lookup("untraced again") == "untraced again"
    finally:
        unsubscribe()
    assert [s.name for s in exporter.get_finished_spans()] == ["ragguard.attempt", "ragguard.lookup"]


async def test_tracing_off_leaves_no_tap_and_no_hook() -> None:
    metrics.enable_tracing(sdk_trace.TracerProvider())
    assert events.tracer is not None and events.bus.active
    metrics.disable_tracing()
    assert events.tracer is None and metrics._tracer is None
    assert not events.bus._taps


DOCS = Path(__file__).resolve().parents[2] / "docs"


def _docs_column(start: str, end: str) -> set[str]:
    """The names in the first column of docs/monitors.md's tables between ``start`` and ``end``."""
    text = (DOCS / "monitors.md").read_text()
    section = text[text.index(start) : text.index(end)]
    return {m for line in section.splitlines() if line.startswith("| `")
            for m in re.findall(r"`([a-z_.]+)`", line.split("|")[1])}  # fmt: skip


def test_the_docs_span_event_table_names_every_span_event() -> None:
    documented = _docs_column("One span event per decision", "The span events are added")
    assert documented == {name for name, _ in metrics._SPAN_EVENTS.values()}


# -- a stream's typed ending ------------------------------------------------------------------


def _answers(g: Guard) -> tuple[Any, Any]:
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


async def _read(stream: Any) -> str:
    got = []
    try:
        async for word in stream:
            got.append(word)
    except ConnectionResetError:
        pass
    return "".join(got)


async def test_a_streams_ending_is_counted_by_stage_and_kind_and_set_on_its_span(
    provider: tuple[Any, InMemorySpanExporter],
) -> None:
    _, spans = provider
    exporter = metrics.PrometheusExporter().start()
    reader = InMemoryMetricReader()
    otel = metrics.OTelMetrics(MeterProvider(metric_readers=[reader])).start()
    g = Guard(Policy(stages={"generation": StagePolicy()}))
    answer, bare = _answers(g)
    assert await _read(answer("q", True)) == "a b c d "
    assert await _read(answer("q", False)) == "a b c "
    assert await _read(bare("q", True)) == "a "
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
