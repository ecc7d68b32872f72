"""Fixtures of the integration tests: asyncio, the default registry restored, one wire server of
each kind per test module (faults, counts and recorded requests cleared before each test), a
sleep that records the waits ragguard asks for instead of sleeping them, and a front door
(uvicorn + RagguardMiddleware) to disconnect from."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _door import Sleeps

from wire import AnthropicWire, OpenAIWire, QdrantGrpcWire, QdrantWire


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _isolated_registry(isolated_registry: None) -> None:
    """Each test gets the default registry, chaos hook and listeners as they were before it."""


def _fresh(wire: Any) -> Any:
    wire.faults.clear()
    wire.faults.seen.clear()
    for name in ("requests", "stream_ends"):
        if hasattr(wire, name):
            getattr(wire, name).clear()
    return wire


@pytest.fixture(scope="module")
def _openai_server() -> Iterator[OpenAIWire]:
    wire = OpenAIWire()
    with wire.running():
        yield wire


@pytest.fixture(scope="module")
def _openai_backup_server() -> Iterator[OpenAIWire]:
    wire = OpenAIWire(tokens=("Backup", " answer"))
    with wire.running():
        yield wire


@pytest.fixture(scope="module")
def _anthropic_server() -> Iterator[AnthropicWire]:
    wire = AnthropicWire()
    with wire.running():
        yield wire


@pytest.fixture(scope="module")
def _qdrant_server() -> Iterator[QdrantWire]:
    wire = QdrantWire()
    with wire.running():
        yield wire


@pytest.fixture(scope="module")
def _qdrant_grpc_server() -> Iterator[QdrantGrpcWire]:
    wire = QdrantGrpcWire()
    with wire.running():
        yield wire


@pytest.fixture
def openai_wire(_openai_server: OpenAIWire) -> OpenAIWire:
    _openai_server.completion_tokens = None
    _openai_server.usage_prompt_tokens = 3
    return _fresh(_openai_server)  # type: ignore[no-any-return]


@pytest.fixture
def backup_wire(_openai_backup_server: OpenAIWire) -> OpenAIWire:
    return _fresh(_openai_backup_server)  # type: ignore[no-any-return]


@pytest.fixture
def anthropic_wire(_anthropic_server: AnthropicWire) -> AnthropicWire:
    _anthropic_server.input_tokens, _anthropic_server.cache_read_input_tokens = 3, 0
    return _fresh(_anthropic_server)  # type: ignore[no-any-return]


@pytest.fixture
def qdrant_wire(_qdrant_server: QdrantWire) -> QdrantWire:
    return _fresh(_qdrant_server)  # type: ignore[no-any-return]


@pytest.fixture
def qdrant_grpc_wire(_qdrant_grpc_server: QdrantGrpcWire) -> QdrantGrpcWire:
    return _fresh(_qdrant_grpc_server)  # type: ignore[no-any-return]


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
async def closing() -> Any:
    """A list to put SDK clients in: each is closed (``await client.close()``) after the test, on
    the test's own event loop, so no connection outlives it."""
    opened: list[Any] = []
    yield opened
    for client in opened:
        await client.close()
