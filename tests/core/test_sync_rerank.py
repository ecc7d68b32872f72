"""The CrossEncoder rerank recipe of docs/sync.md: a sync scorer guarded as the rerank stage.

CI has no torch: the scorer here is a small sync function that raises the out-of-memory errors
ragguard classifies (MemoryError, torch's "CUDA out of memory" RuntimeError, a class named
OutOfMemoryError as torch's are), and a stand-in ``torch`` module records the cache being emptied.
With torch and sentence-transformers installed, the last tests run the recipe itself
(examples/crossencoder_rerank.py) with a real CrossEncoder and torch's own allocator error.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import types
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ragguard
from ragguard import BreakerState, FakeClock, Guard, Policy, StagePolicy
from ragguard.rag import empty_framework_cache, release_memory_on_oom

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "crossencoder_rerank.py"


class OutOfMemoryError(RuntimeError):
    """Named as ``torch.OutOfMemoryError`` / ``torch.cuda.OutOfMemoryError`` are."""


OOM_ERRORS: dict[str, Callable[[], BaseException]] = {
    "MemoryError": MemoryError,
    "cuda_message": lambda: RuntimeError(
        "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity)"
    ),
    "OutOfMemoryError": lambda: OutOfMemoryError("CUDA out of memory."),
    "cpu_allocator": lambda: RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried "
        "to allocate 1125899906842624 bytes. Error code 12 (Cannot allocate memory)"
    ),
}


class Batch:
    """What a failed batch leaves referenced from its frame (the tensors, in torch)."""


class Scorer:
    """A cross-encoder's ``predict``: sync, pointwise, out of memory above ``capacity`` pairs."""

    def __init__(self, capacity: int, error: Callable[[], BaseException]) -> None:
        self.capacity = capacity
        self.error = error
        self.sizes: list[int] = []
        self.threads: set[int] = set()
        self.last_batch: weakref.ref[Batch] | None = None

    def predict(self, pairs: list[tuple[str, str]]) -> list[float]:
        self.sizes.append(len(pairs))
        self.threads.add(threading.get_ident())
        batch = Batch()
        self.last_batch = weakref.ref(batch)
        if len(pairs) > self.capacity:
            raise self.error()
        return [-abs(int(doc) - 7) for _, doc in pairs]


class StandInTorch(types.ModuleType):
    """``sys.modules["torch"]`` for a test: CUDA initialised, ``empty_cache`` recorded (with
    whether the failed batch was already freed when it ran)."""

    def __init__(self, scorer: Scorer) -> None:
        super().__init__("torch")
        self.emptied: list[tuple[int, bool]] = []  # (thread, failed batch freed by then)

        def empty_cache() -> None:
            gc.collect()
            freed = scorer.last_batch is not None and scorer.last_batch() is None
            self.emptied.append((threading.get_ident(), freed))

        self.cuda = types.SimpleNamespace(is_initialized=lambda: True, empty_cache=empty_cache)


def _recipe(g: Guard, scorer: Scorer) -> Callable[..., Any]:
    @g.guard("rerank")
    @release_memory_on_oom
    def rerank(query: str, hits: list[int]) -> list[dict[str, float]]:
        scores = scorer.predict([(query, str(h)) for h in hits])
        scored = ({"id": h, "score": s} for h, s in zip(hits, scores, strict=True))
        return sorted(scored, key=lambda d: -d["score"])

    return rerank


@pytest.mark.parametrize("kind", sorted(OOM_ERRORS))
async def test_a_sync_scorer_is_chunked_on_each_out_of_memory_error_and_the_cache_emptied_in_its_thread(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scorer = Scorer(capacity=6, error=OOM_ERRORS[kind])
    torch = StandInTorch(scorer)
    monkeypatch.setitem(sys.modules, "torch", torch)
    g = Guard(clock=FakeClock())
    rerank = _recipe(g, scorer)
    hits = list(range(20))

    got = await rerank("q", hits)
    assert scorer.sizes == [20, 10, 5, 5, 5, 5]  # 20 and 10 ran out of memory; 4 chunks of 5 fit
    assert [d["id"] for d in got] == sorted(hits, key=lambda h: abs(h - 7))  # one batch's order
    assert ragguard.degraded() == ("chunked_rerank",)
    assert threading.get_ident() not in scorer.threads  # predict ran in worker threads
    assert len(torch.emptied) == 2  # once after each out-of-memory error
    assert all(thread in scorer.threads for thread, _ in torch.emptied)  # in the thread that ran out
    assert all(freed for _, freed in torch.emptied)  # the failed batch was freed before emptying
    assert g.breaker("rerank").state is BreakerState.CLOSED


async def test_at_the_floor_the_stage_falls_back_to_retrieval_order(monkeypatch: pytest.MonkeyPatch) -> None:
    scorer = Scorer(capacity=0, error=MemoryError)
    torch = StandInTorch(scorer)
    monkeypatch.setitem(sys.modules, "torch", torch)
    g = Guard(Policy(stages={"rerank": StagePolicy(preset="rerank", rerank_min_batch=4)}), clock=FakeClock())
    rerank = _recipe(g, scorer)
    hits = [9, 3, 7, 1, 5, 8, 2, 6]
    assert await rerank("q", hits) == hits
    assert scorer.sizes == [8, 4]
    assert ragguard.degraded()[-1] == "skip_rerank"
    assert len(torch.emptied) == 2


async def test_other_errors_pass_untouched_and_empty_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    scorer = Scorer(capacity=0, error=lambda: ValueError("bad pair"))
    torch = StandInTorch(scorer)
    monkeypatch.setitem(sys.modules, "torch", torch)

    @release_memory_on_oom
    def predict(pairs: list[tuple[str, str]]) -> list[float]:
        return scorer.predict(pairs)

    with pytest.raises(ValueError, match="bad pair"):
        predict([("q", "1")])
    assert torch.emptied == []


async def test_without_torch_imported_nothing_is_emptied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert empty_framework_cache() == []

    @release_memory_on_oom
    async def predict() -> None:
        raise MemoryError

    with pytest.raises(MemoryError):
        await predict()


def test_real_torch_out_of_memory_errors_are_recognised_and_a_cpu_run_empties_nothing() -> None:
    torch = pytest.importorskip("torch")
    from ragguard.breakers import is_out_of_memory

    with pytest.raises(RuntimeError) as info:
        torch.empty(1 << 50, dtype=torch.uint8)  # the CPU allocator's own error
    assert is_out_of_memory(info.value)
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory."))
    assert empty_framework_cache() == ([] if not torch.cuda.is_initialized() else ["cuda"])


@pytest.mark.parametrize(
    ("max_batch", "tried", "served"),
    [(6, "[20, 10, 5, 5, 5, 5]", "chunked_rerank"), (0, "[20, 10, 5, 4]", "skip_rerank")],
)
def test_the_crossencoder_example_runs_with_a_real_model(max_batch: int, tried: str, served: str) -> None:
    pytest.importorskip("sentence_transformers")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--max-batch", str(max_batch)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == f"batches tried: {tried}"
    assert served in lines[1]
    if served == "chunked_rerank":
        assert lines[2] == "same order as one batch: True"
