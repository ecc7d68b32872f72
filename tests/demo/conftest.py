"""Shared fixtures of the demo tests: the model and index are loaded once per session."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ragguard_tools.demo.backends import BackendServers, build_index
from ragguard_tools.demo.corpus import Passage, load_passages
from ragguard_tools.demo.embedder import Embedder, load_embedder
from ragguard_tools.demo.rerank import Reranker


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def demo_embedder() -> Embedder:
    return load_embedder()


@pytest.fixture(scope="session")
def demo_passages() -> list[Passage]:
    return load_passages()


@pytest.fixture(scope="session")
def demo_index(demo_embedder: Embedder, demo_passages: list[Passage]) -> Any:
    return build_index(demo_embedder, demo_passages)


@pytest.fixture
def demo_reranker(demo_embedder: Embedder, demo_passages: list[Passage]) -> Reranker:
    reranker = Reranker(demo_embedder)
    reranker.warm([p.text for p in demo_passages])
    return reranker


@pytest.fixture
async def demo_backends(demo_embedder: Embedder, demo_index: Any) -> AsyncIterator[BackendServers]:
    servers = BackendServers(demo_embedder, demo_index, rng=random.Random(7))
    await servers.start()
    try:
        yield servers
    finally:
        await servers.stop()
