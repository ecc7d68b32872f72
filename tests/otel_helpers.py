"""OpenTelemetry's SDK as the tests read it: ragguard's tracing on a provider whose spans land in
memory, for the length of a ``with`` block (the tests that use it skip without the SDK)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ragguard import metrics


@contextlib.contextmanager
def traced() -> Iterator[tuple[Any, Any]]:
    """``(tracer_provider, exporter)``: ragguard's spans go to ``exporter`` (an
    ``InMemorySpanExporter``) until the block ends, when tracing is turned off again."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    metrics.enable_tracing(provider)
    try:
        yield provider, exporter
    finally:
        metrics.disable_tracing()
