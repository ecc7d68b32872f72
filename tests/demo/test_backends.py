"""The embedding and vector-store gRPC services, their faults, and the child-process runner."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

import grpc
from ragguard.demo import _wire
from ragguard.demo.backends import BackendFaults, BackendProcess, BackendServers, ControlClient
from ragguard.demo.corpus import Passage
from ragguard.demo.embedder import Embedder
from ragguard.demo.pipeline import BackendClients

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_embed_and_search_over_grpc(
    demo_backends: BackendServers, demo_embedder: Embedder, demo_passages: list[Passage]
) -> None:
    assert demo_backends.addresses is not None
    clients = BackendClients(demo_backends.addresses)
    try:
        p = demo_passages[42]
        vecs = await clients.embed([f"{p.title}\n{p.text}"], timeout_s=5)
        assert np.allclose(vecs, demo_embedder.embed([f"{p.title}\n{p.text}"]), atol=1e-6)
        hits = await clients.search(vecs[0], 5, timeout_s=5)
        assert len(hits) == 5 and hits[0].pid == 42
        assert hits[0].score == pytest.approx(1.0, abs=1e-4)
    finally:
        await clients.close()


async def test_embedding_runs_in_a_worker_thread(demo_embedder: Embedder, demo_index: Any) -> None:
    seen: list[int] = []

    class Recording(Embedder):
        def embed(self, texts: list[str]) -> Any:
            seen.append(threading.get_ident())
            return super().embed(texts)

    import random

    recording = Recording(demo_embedder.model, threading.Lock())
    servers = BackendServers(recording, demo_index, rng=random.Random(1))
    addresses = await servers.start()
    clients = BackendClients(addresses)
    try:
        await clients.embed(["a question"], timeout_s=5)
    finally:
        await clients.close()
        await servers.stop()
    assert seen and threading.get_ident() not in seen


async def test_malformed_requests_are_invalid_argument(demo_backends: BackendServers) -> None:
    assert demo_backends.addresses is not None
    async with grpc.aio.insecure_channel(demo_backends.addresses.embedding) as channel:
        raw = channel.unary_unary(_wire.method(_wire.EMBEDDING, "Embed"))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await raw(b"not json", timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        embed = _wire.unary(channel, _wire.EMBEDDING, "Embed")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await embed({"texts": []}, timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_latency_fault_makes_calls_time_out(demo_backends: BackendServers) -> None:
    assert demo_backends.addresses is not None
    control = ControlClient(demo_backends.addresses.control)
    clients = BackendClients(demo_backends.addresses)
    try:
        await control.set_faults(BackendFaults(embed_latency_s=0.4, embed_latency_share=1.0))
        t0 = time.perf_counter()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await clients.embed(["q"], timeout_s=0.15)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await clients.embed(["q"], timeout_s=5)
        assert time.perf_counter() - t0 >= 0.4
        await control.heal()
        t0 = time.perf_counter()
        await clients.embed(["q"], timeout_s=5)
        assert time.perf_counter() - t0 < 0.3
    finally:
        await clients.close()
        await control.close()


async def test_vector_store_down_refuses_then_comes_back(demo_backends: BackendServers) -> None:
    assert demo_backends.addresses is not None
    control = ControlClient(demo_backends.addresses.control)
    clients = BackendClients(demo_backends.addresses)
    vec = np.ones(256, dtype=np.float32) / 16.0
    try:
        assert await clients.search(vec, 3, timeout_s=5)
        await control.set_faults(BackendFaults(vector_down=True))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await clients.search(vec, 3, timeout_s=2)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        await control.heal()
        for _ in range(40):  # the channel reconnects within its 0.5 s max backoff
            try:
                assert await clients.search(vec, 3, timeout_s=2)
                break
            except grpc.aio.AioRpcError:
                import asyncio

                await asyncio.sleep(0.1)
        else:
            pytest.fail("vector store did not come back")
    finally:
        await clients.close()
        await control.close()


def test_fault_values_are_validated() -> None:
    from ragguard import InvalidInput

    with pytest.raises(InvalidInput):
        BackendFaults(embed_latency_share=1.5)
    with pytest.raises(InvalidInput):
        BackendFaults(embed_latency_s=-1)
    with pytest.raises(InvalidInput):
        BackendFaults.from_dict({"bogus": 1})


@pytest.mark.timeout(60)
async def test_backends_in_a_child_process() -> None:
    process = BackendProcess(seed=3)
    addresses = await process.start()
    clients = BackendClients(addresses)
    try:
        vecs = await clients.embed(["the global statement"], timeout_s=10)
        hits = await clients.search(vecs[0], 3, timeout_s=10)
        assert len(hits) == 3
    finally:
        await clients.close()
        await process.stop()
    assert not process.running
