"""The embedding, vector-store and generator gRPC services, their faults, and the child-process
runner."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from typing import Any

import grpc
import numpy as np
import pytest

from ragguard import InvalidInput
from ragguard.chaos import FaultProxy
from ragguard_tools.demo import _wire
from ragguard_tools.demo.backends import (
    DEPLOYMENTS,
    BackendProcess,
    BackendServers,
    ControlClient,
    parse_fault_specs,
)
from ragguard_tools.demo.corpus import Passage
from ragguard_tools.demo.embedder import Embedder
from ragguard_tools.demo.pipeline import BackendClients

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
        assert await control.set_faults([{"kind": "latency", "stage": "embedding", "seconds": 0.4}]) == 1
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


async def test_error_fault_ends_the_call_with_its_status(demo_backends: BackendServers) -> None:
    assert demo_backends.addresses is not None
    control = ControlClient(demo_backends.addresses.control)
    clients = BackendClients(demo_backends.addresses)
    vec = np.ones(256, dtype=np.float32) / 16.0
    try:
        await control.set_faults([{"kind": "error", "stage": "vector_store", "error": "connection_refused"}])
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await clients.search(vec, 3, timeout_s=2)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert len(await clients.embed(["the embedding stage is untouched"], timeout_s=2)) == 1
        await control.heal()
        assert await clients.search(vec, 3, timeout_s=2)
    finally:
        await clients.close()
        await control.close()


async def test_vector_store_behind_a_stopped_proxy_refuses_then_comes_back(
    demo_backends: BackendServers,
) -> None:
    assert demo_backends.addresses is not None
    port = int(demo_backends.addresses.vector_store.rsplit(":", 1)[1])
    vec = np.ones(256, dtype=np.float32) / 16.0
    async with FaultProxy(port) as proxy:
        addresses = replace(demo_backends.addresses, vector_store=proxy.target)
        clients = BackendClients(addresses)
        try:
            assert await clients.search(vec, 3, timeout_s=5)
            proxy.stop()
            # the client may still be mid-call on the connection the proxy is closing: the first
            # call after stop() can race the close, so look for the refusal within 5 s
            code = None
            give_up = time.monotonic() + 5.0
            while code is None and time.monotonic() < give_up:
                try:
                    await clients.search(vec, 3, timeout_s=2)
                    await asyncio.sleep(0.05)
                except grpc.aio.AioRpcError as exc:
                    code = exc.code()
            assert code == grpc.StatusCode.UNAVAILABLE
            proxy.heal()
            give_up = time.monotonic() + 15.0  # the channel reconnects within its 0.5 s max backoff
            while True:
                try:
                    assert await clients.search(vec, 3, timeout_s=2)
                    break
                except grpc.aio.AioRpcError:
                    if time.monotonic() > give_up:
                        pytest.fail("vector store did not come back within 15 s")
                    await asyncio.sleep(0.1)
        finally:
            await clients.close()


PASSAGES = ["The try statement specifies exception handlers. It may have a finally clause.", "Other text."]


async def generated(
    clients: BackendClients, tenant: str, max_words: int = 10, *, limit: int | None = None
) -> tuple[list[str], grpc.aio.AioRpcError | None]:
    words: list[str] = []
    try:
        async for word in clients.generate("why?", PASSAGES, max_words=max_words, tenant=tenant, timeout_s=5):
            words.append(word)
            if limit is not None and len(words) >= limit:
                break
    except grpc.aio.AioRpcError as exc:
        return words, exc
    return words, None


async def test_the_generator_streams_the_passages_word_by_word(demo_backends: BackendServers) -> None:
    assert demo_backends.addresses is not None
    clients = BackendClients(demo_backends.addresses)
    try:
        words, error = await generated(clients, "acme")
    finally:
        await clients.close()
    assert error is None
    assert "".join(words) == "The try statement specifies exception handlers. It may have a "


async def test_two_deployments_answer_alike_and_continue_from_a_prefix(demo_backends: BackendServers) -> None:
    addresses = demo_backends.addresses
    assert addresses is not None and addresses.generation != addresses.generation_b
    clients = BackendClients(addresses)
    try:
        answers = [[w async for w in clients.generate("why?", PASSAGES, max_words=10, deployment=d)]
                   for d in DEPLOYMENTS]  # fmt: skip
        going_on = clients.generate("why?", PASSAGES, max_words=10, deployment="b", prefix="The try ")
        rest = [w async for w in going_on]
    finally:
        await clients.close()
    assert answers[0] == answers[1] and len(answers[0]) == 10
    assert rest == answers[0][1:], "from the prefix's last word (repeated), to 10 words in all"


async def test_a_long_answer_fault_aimed_at_one_tenant_leaves_the_others_alone(
    demo_backends: BackendServers,
) -> None:
    assert demo_backends.addresses is not None
    control = ControlClient(demo_backends.addresses.control)
    clients = BackendClients(demo_backends.addresses)
    overrun = {"kind": "latency", "stage": "generation_overrun", "tenant": "hoarder", "seconds": 0.3}
    try:
        await control.set_faults([overrun])
        greedy, error = await generated(clients, "hoarder")
        assert error is None
        polite, error = await generated(clients, "acme")
        assert error is None
    finally:
        await clients.close()
        await control.close()
    assert len(polite) == 10
    assert len(greedy) > 30, "200 words/s for 0.3 s past the end of the answer"


async def test_a_stall_or_a_failure_midway_acts_after_half_the_answer(demo_backends: BackendServers) -> None:
    assert demo_backends.addresses is not None
    control = ControlClient(demo_backends.addresses.control)
    clients = BackendClients(demo_backends.addresses)
    try:
        reset = {"kind": "error", "stage": "generation_midway", "error": "connection_reset"}
        await control.set_faults([reset])
        words, error = await generated(clients, "acme")
        assert len(words) == 5 and error is not None and error.code() == grpc.StatusCode.UNAVAILABLE
        await control.set_faults([{"kind": "latency", "stage": "generation_midway", "seconds": 0.4}])
        t0 = time.perf_counter()
        words, error = await generated(clients, "acme")
        assert error is None and len(words) == 10 and time.perf_counter() - t0 >= 0.4
    finally:
        await clients.close()
        await control.close()


async def test_a_caller_that_stops_reading_ends_the_generators_call(demo_backends: BackendServers) -> None:
    assert demo_backends.addresses is not None
    clients = BackendClients(demo_backends.addresses)
    try:
        words, error = await generated(clients, "acme", max_words=1000, limit=3)
        assert (len(words), error) == (3, None)
        for _ in range(200):
            if demo_backends.streams_open == 0:
                break
            await asyncio.sleep(0.01)
        assert demo_backends.streams_open == 0
    finally:
        await clients.close()


@pytest.mark.parametrize(
    "specs",
    [
        "not a list",
        [{"kind": "latency", "stage": "embedding"}],
        [{"kind": "proxy", "target": "vector_store", "action": "stop"}],
        [{"kind": "error", "stage": "rerank", "error": "memory"}],
        [{"kind": "latency", "seconds": 1.0}],
        [{"kind": "latency", "stage": "generation_somewhere", "seconds": 1.0}],
    ],
)
def test_bad_fault_specs_are_refused(specs: object) -> None:
    with pytest.raises(InvalidInput):
        parse_fault_specs(specs)


def test_generation_faults_may_name_a_tenant() -> None:
    spec = {"kind": "latency", "stage": "generation_overrun", "tenant": "hoarder", "seconds": 0.5}
    assert [s.tenant for s in parse_fault_specs([spec])] == ["hoarder"]


async def test_bad_fault_specs_over_grpc_are_invalid_argument(demo_backends: BackendServers) -> None:
    assert demo_backends.addresses is not None
    control = ControlClient(demo_backends.addresses.control)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await control.set_faults([{"kind": "nonsense"}])
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await control.close()


@pytest.mark.timeout(60)
async def test_backends_in_a_child_process() -> None:
    process = BackendProcess(seed=3)
    addresses = await process.start()
    clients = BackendClients(addresses)
    try:
        vecs = await clients.embed(["the global statement"], timeout_s=10)
        hits = await clients.search(vecs[0], 3, timeout_s=10)
        assert len(hits) == 3
        words = [w async for w in clients.generate("q", ["a b c"], max_words=3, timeout_s=10)]
        assert words == ["a ", "b ", "c "]
    finally:
        await clients.close()
        await process.stop()
    assert not process.running
