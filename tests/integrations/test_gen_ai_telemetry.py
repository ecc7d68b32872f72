"""What a guarded OpenAI client's calls tell OpenTelemetry and Prometheus, through the real
``openai`` SDK against the OpenAI wire server: the stage's span and each attempt's span (its
child) name the provider, the model and the deployment's key; the GenAI semantic conventions'
client metrics (``gen_ai.client.operation.duration`` with ``error.type`` when it failed,
``gen_ai.client.operation.time_to_first_chunk``, ``gen_ai.client.token.usage``); and a stream
that failed part way counts the usage its provider reported before the failure (vLLM's
``continuous_usage_stats``), as billed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
from _door import deployment_breaker
from prometheus_client.parser import text_string_to_metric_families

from ragguard import BreakerState, FakeClock, Guard, Policy, metrics
from ragguard.integrations.openai import guard_openai
from wire import Fault, OpenAIWire

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402

from otel_helpers import traced  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

ASK = [{"role": "user", "content": "hi"}]
RETRY = {"attempts": 2, "initial_backoff_s": 0, "jitter_s": 0}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with traced() as (_, exporter):
        yield exporter


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    got = InMemoryMetricReader()
    recorder = metrics.OTelMetrics(MeterProvider(metric_readers=[got])).start()
    try:
        yield got
    finally:
        recorder.close()


@pytest.fixture
def client_of(closing: list[Any]) -> Any:
    def make(wire: OpenAIWire, guard: Guard) -> Any:
        raw = openai.AsyncOpenAI(base_url=f"{wire.url}/v1", api_key="k", max_retries=0)
        guarded = guard_openai(raw, guard=guard)
        closing.extend((raw, guarded.client))
        return guarded

    return make


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out[metric.name] = list(metric.data.data_points)
    return out


async def _settle() -> None:
    await asyncio.sleep(0.01)  # the bus delivers on the next loop iterations


def _is_child(child: Any, parent: Any) -> bool:
    return child.parent is not None and child.parent.span_id == parent.context.span_id


async def test_the_stage_span_and_each_attempts_span_name_the_provider_the_model_and_the_key(
    client_of: Any, openai_wire: OpenAIWire, spans: InMemorySpanExporter
) -> None:
    g = Guard(Policy.parse({"stages": {"openai": {"retry": RETRY}}}))
    client = client_of(openai_wire, g)
    openai_wire.faults.push("chat", Fault(status=500))
    answer = await client.chat.completions.create(model="gpt-x", messages=ASK)
    assert answer.choices[0].message.content == "Hello from the wire"
    assert openai_wire.faults.seen["chat"] == 2  # a 500, then the retry
    finished = spans.get_finished_spans()
    (stage,) = [s for s in finished if s.name == "ragguard.openai"]
    key = f"{urlsplit(openai_wire.url).netloc}/gpt-x"  # <endpoint>/<model>
    named = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
             "gen_ai.request.model": "gpt-x", "ragguard.key": key}  # fmt: skip
    assert {name: stage.attributes[name] for name in named} == named
    first, second = sorted((s for s in finished if s.name == "ragguard.attempt"), key=lambda s: s.start_time)
    for attempt in (first, second):
        assert _is_child(attempt, stage)
        where = {name: value for name, value in named.items() if name != "gen_ai.operation.name"}
        assert {name: attempt.attributes[name] for name in where} == where
    assert first.attributes["ragguard.attempt"] == 1 and second.attributes["ragguard.attempt"] == 2
    assert first.attributes["ragguard.outcome"] == "failure"
    assert first.attributes["error.type"] == "InternalServerError"
    assert first.status.status_code is StatusCode.ERROR
    assert second.attributes["ragguard.outcome"] == "success"


async def test_the_gen_ai_client_metrics_of_a_stream_and_of_a_failed_call(
    client_of: Any, openai_wire: OpenAIWire, reader: InMemoryMetricReader
) -> None:
    g = Guard(Policy.parse({"stages": {"openai": {"retry": {"attempts": 1}}}}))
    client = client_of(openai_wire, g)
    stream = await client.chat.completions.create(model="gpt-x", messages=ASK, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "Hello from the wire"
    openai_wire.faults.push("chat", Fault(status=500))
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="gpt-y", messages=ASK)
    await _settle()
    points = _points(reader)
    ours = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "ragguard.stage": "openai"}
    durations = {p.attributes["gen_ai.request.model"]: p for p in points["gen_ai.client.operation.duration"]}
    assert dict(durations["gpt-x"].attributes) == {**ours, "gen_ai.request.model": "gpt-x"}
    assert dict(durations["gpt-y"].attributes) == {
        **ours,
        "gen_ai.request.model": "gpt-y",
        "error.type": "InternalServerError",
    }
    assert durations["gpt-x"].count == durations["gpt-y"].count == 1
    (first,) = points["gen_ai.client.operation.time_to_first_chunk"]
    assert dict(first.attributes) == {**ours, "gen_ai.request.model": "gpt-x"} and first.count == 1
    usage = {p.attributes["gen_ai.token.type"]: p for p in points["gen_ai.client.token.usage"]}
    assert (usage["input"].sum, usage["output"].sum) == (3, 4)  # the provider's usage chunk
    assert usage["input"].attributes["ragguard.outcome"] == "ok"
    assert usage["input"].attributes["gen_ai.request.model"] == "gpt-x"


async def test_a_stream_failed_part_way_counts_the_usage_reported_before_it_failed(
    client_of: Any, openai_wire: OpenAIWire, reader: InMemoryMetricReader
) -> None:
    g = Guard(Policy.parse({"stages": {"openai": {"retry": {"attempts": 1}}}}))
    exporter = metrics.PrometheusExporter(guards=g).start()
    client = client_of(openai_wire, g)
    openai_wire.faults.push("chat", Fault(reset=True, after_tokens=2))
    stream = await client.chat.completions.create(
        model="gpt-x", messages=ASK, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )  # fmt: skip
    got = []
    with pytest.raises(openai.APIError):
        async for chunk in stream:
            got += [c.delta.content or "" for c in chunk.choices]
    assert "".join(got) == "Hello from"
    await _settle()
    usage = {p.attributes["gen_ai.token.type"]: p for p in _points(reader)["gen_ai.client.token.usage"]}
    assert (usage["input"].sum, usage["output"].sum) == (3, 2)  # billed: what it reported before the reset
    assert {p.attributes["ragguard.outcome"] for p in usage.values()} == {"error"}
    scraped = {
        (s.labels["type"], s.labels["outcome"]): s.value
        for family in text_string_to_metric_families(exporter.scrape().decode())
        for s in family.samples
        if s.name == "ragguard_stream_usage_tokens_total"
    }
    exporter.close()
    assert scraped == {("input", "error"): 3.0, ("output", "error"): 2.0}


async def test_a_whole_response_is_a_success_its_breaker_counts(
    client_of: Any, openai_wire: OpenAIWire
) -> None:
    """A non-streamed create runs as a stream of one item: read to its end, it ends completed, so
    the half-open breaker's trial is answered and the breaker closes (closed early, it was not)."""
    breaker = {"minimum_calls": 2, "window_size": 2, "failure_rate_threshold": 50, "open_for_s": 30,
               "half_open_permits": 1}  # fmt: skip
    clock = FakeClock(auto_advance=False)
    g = Guard(
        Policy.parse({"stages": {"openai": {"retry": {"attempts": 1}, "breaker": breaker}}}), clock=clock
    )
    client = client_of(openai_wire, g)
    openai_wire.faults.push("chat", Fault(status=500), times=2)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="gpt-x", messages=ASK)
    tripped = deployment_breaker(client.chat.completions.create, "gpt-x")
    assert tripped.state is BreakerState.OPEN
    clock.advance(31.0)
    answer = await client.chat.completions.create(model="gpt-x", messages=ASK)
    assert answer.choices[0].message.content == "Hello from the wire"
    assert tripped.state is BreakerState.CLOSED


def _usage(reader: InMemoryMetricReader) -> dict[str, Any]:
    return {p.attributes["gen_ai.token.type"]: p for p in _points(reader)["gen_ai.client.token.usage"]}


async def test_a_cut_openai_stream_has_its_output_as_counted_and_no_input(
    client_of: Any, openai_wire: OpenAIWire, reader: InMemoryMetricReader
) -> None:
    g = Guard(Policy.parse({"stages": {"openai": {"retry": {"attempts": 1}}}}))
    client = client_of(openai_wire, g)
    openai_wire.faults.push("chat", Fault(reset=True, after_tokens=2))
    stream = await client.chat.completions.create(model="gpt-x", messages=ASK, stream=True)
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass
    await _settle()
    usage = _usage(reader)
    assert set(usage) == {"output"}  # its usage chunk comes last: never sent
    assert usage["output"].sum >= 2 and usage["output"].attributes["ragguard.outcome"] == "error"


async def test_a_cut_anthropic_stream_counts_the_input_its_message_start_reported(
    closing: list[Any], anthropic_wire: Any, reader: InMemoryMetricReader
) -> None:
    import anthropic

    from ragguard.integrations.anthropic import guard_anthropic

    g = Guard(Policy.parse({"stages": {"anthropic": {"retry": {"attempts": 1}}}}))
    raw = anthropic.AsyncAnthropic(base_url=anthropic_wire.url, api_key="k", max_retries=0)
    client = guard_anthropic(raw, guard=g)
    closing.extend((raw, client.client))
    overloaded = {"type": "overloaded_error", "message": "Overloaded"}
    anthropic_wire.faults.push("messages", Fault(event=overloaded, event_after=5))  # after two tokens
    stream = await client.messages.create(model="c", max_tokens=64, messages=ASK, stream=True)
    with pytest.raises(anthropic.APIStatusError):
        async for _ in stream:
            pass
    await _settle()
    usage = _usage(reader)
    assert usage["input"].sum == 3  # message_start's, before the cut
    assert {p.attributes["gen_ai.provider.name"] for p in usage.values()} == {"anthropic"}
    assert {p.attributes["ragguard.outcome"] for p in usage.values()} == {"error"}


async def test_a_callers_many_models_and_keys_keep_the_otel_series_bounded(
    client_of: Any, openai_wire: OpenAIWire, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "OTEL_MAX_VALUES", 3)
    got = InMemoryMetricReader()
    recorder = metrics.OTelMetrics(MeterProvider(metric_readers=[got])).start()
    try:
        g = Guard(Policy.parse({"stages": {"openai": {"retry": {"attempts": 1}, "max_keys": 2}}}))
        client = client_of(openai_wire, g)
        for i in range(8):
            stream = await client.chat.completions.create(model=f"m-{i}", messages=ASK, stream=True)
            async for _ in stream:
                pass
        await _settle()
    finally:
        recorder.close()
    points = _points(got)
    models = {p.attributes["gen_ai.request.model"] for p in points["gen_ai.client.token.usage"]}
    assert models == {"m-0", "m-1", "m-2", "other"}  # 3 of their own, then "other"
