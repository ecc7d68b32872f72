"""The three typed breakers: their defaults, classifiers, errors, and overrides."""

from __future__ import annotations

import pytest
from breaker_helpers import fail, succeed

from ragguard import (
    ConfigError,
    EmbeddingUnavailable,
    FakeClock,
    RerankOutOfMemory,
    VectorStoreUnavailable,
)
from ragguard.breakers import (
    BreakerState,
    EmbeddingTimeoutBreaker,
    RerankOOMBreaker,
    VectorStoreUnavailableBreaker,
)

pytestmark = pytest.mark.timeout(30)


def test_embedding_trips_on_slow_calls_and_timeouts(clock: FakeClock) -> None:
    breaker = EmbeddingTimeoutBreaker(clock=clock)
    assert breaker.name == "embedding"
    for _ in range(5):
        succeed(breaker, duration_s=0.2)
    for _ in range(4):
        succeed(breaker, duration_s=3.5)  # slower than 3 s
    fail(breaker, ValueError("empty text"))  # the caller's error: not counted
    assert breaker.state is BreakerState.CLOSED and breaker.metrics().calls == 9
    fail(breaker, TimeoutError(), duration_s=0.1)  # a timeout is a slow failure whatever its duration
    assert breaker.state is BreakerState.OPEN  # 5 of 10 slow = 50 %
    with pytest.raises(EmbeddingUnavailable) as info:
        breaker.acquire()
    assert info.value.retry_after_s == 60.0


def test_vector_store_trips_on_connection_errors_only(clock: FakeClock) -> None:
    breaker = VectorStoreUnavailableBreaker(clock=clock)
    fail(breaker, KeyError("no such collection"))
    for _ in range(2):
        succeed(breaker)
    for _ in range(2):
        fail(breaker, ConnectionRefusedError())
    assert breaker.state is BreakerState.CLOSED  # 4 counted calls < minimum_calls 5
    fail(breaker, ConnectionResetError())
    assert breaker.state is BreakerState.OPEN  # 3 of 5 = 60 %
    with pytest.raises(VectorStoreUnavailable) as info:
        breaker.acquire()
    assert info.value.retry_after_s == 120.0


def test_rerank_trips_after_three_ooms_in_a_row(clock: FakeClock) -> None:
    breaker = RerankOOMBreaker(clock=clock)
    fail(breaker, MemoryError())
    fail(breaker, RuntimeError("CUDA out of memory. Tried to allocate 1.00 GiB"))
    succeed(breaker)
    fail(breaker, MemoryError())
    fail(breaker, RuntimeError("index out of range"))  # not OOM: passes through, run unbroken
    fail(breaker, MemoryError())
    assert breaker.state is BreakerState.CLOSED
    fail(breaker, MemoryError())
    assert breaker.state is BreakerState.OPEN
    with pytest.raises(RerankOutOfMemory) as info:
        breaker.acquire()
    assert info.value.retry_after_s == 300.0
    clock.advance(300.0)
    breaker.acquire()
    with pytest.raises(RerankOutOfMemory):  # one trial at a time by default
        breaker.acquire()


def test_typed_defaults_are_overridable(clock: FakeClock) -> None:
    breaker = VectorStoreUnavailableBreaker("store-eu", open_for_s=5.0, minimum_calls=1, window_size=1,
                                            clock=clock)
    assert breaker.name == "store-eu"
    fail(breaker, ConnectionRefusedError())
    assert breaker.retry_after_s == 5.0
    with pytest.raises(ConfigError, match="minimum_calls"):
        RerankOOMBreaker(minimum_calls=50)  # more than its window of 10 calls
