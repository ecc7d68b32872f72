"""aiobreaker interop: its listeners on ragguard breakers, its breakers behind ragguard's protocol."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import aiobreaker
import pytest

from ragguard import BreakerOpen, FakeClock, VectorStoreUnavailable
from ragguard.breakers import BreakerState, CircuitBreaker, from_aiobreaker

pytestmark = pytest.mark.timeout(30)


class Recorder(aiobreaker.CircuitBreakerListener):
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def state_change(self, breaker: Any, old: Any, new: Any) -> None:
        self.calls.append(("state_change", breaker, old, new))

    def success(self, breaker: Any) -> None:
        self.calls.append(("success", breaker))

    def failure(self, breaker: Any, exception: Exception) -> None:
        self.calls.append(("failure", breaker, exception))


class Raising(aiobreaker.CircuitBreakerListener):
    def state_change(self, breaker: Any, old: Any, new: Any) -> None:
        raise RuntimeError("listener bug")

    def failure(self, breaker: Any, exception: Exception) -> None:
        raise RuntimeError("listener bug")


async def refuse() -> None:
    raise ConnectionRefusedError("refused")


async def ok() -> str:
    return "ok"


def test_ragguard_breaker_notifies_aiobreaker_listeners() -> None:
    breaker = CircuitBreaker("store", minimum_calls=2, window_size=2, clock=FakeClock())
    recorder = Recorder()
    breaker.add_listener(Raising())
    breaker.add_listener(recorder)

    async def main() -> None:
        assert await breaker.call(ok) == "ok"
        with pytest.raises(ConnectionRefusedError):
            await breaker.call(refuse)  # 1 of 2 failed: trips at 50 %
        await asyncio.sleep(0)

    asyncio.run(main())
    assert [c[0] for c in recorder.calls] == ["success", "failure", "state_change"]
    assert all(c[1] is breaker for c in recorder.calls)
    assert isinstance(recorder.calls[1][2], ConnectionRefusedError)  # the real exception
    assert recorder.calls[2][2:] == (BreakerState.CLOSED, BreakerState.OPEN)


def test_aiobreaker_behind_ragguard_protocol() -> None:
    recorder = Recorder()
    cb = aiobreaker.CircuitBreaker(fail_max=2, timeout_duration=timedelta(seconds=30),
                                   exclude=[ValueError], listeners=[recorder, Raising()], name="legacy")
    breaker = from_aiobreaker(cb, error_class=VectorStoreUnavailable)
    assert breaker.name == "legacy" and breaker.state is BreakerState.CLOSED

    async def main() -> None:
        assert await breaker.call(ok) == "ok"
        with pytest.raises(ConnectionRefusedError):
            await breaker.call(refuse)
        with pytest.raises(ConnectionRefusedError):  # the tripping call raises its own error
            await breaker.call(refuse)
        assert breaker.state is BreakerState.OPEN
        with pytest.raises(VectorStoreUnavailable) as info:
            await breaker.call(ok)
        assert 29.0 < (info.value.retry_after_s or 0) <= 30.0  # true time left, one clock (UTC)

    asyncio.run(main())
    assert ("success", cb) in recorder.calls
    assert sum(1 for c in recorder.calls if c[0] == "failure") == 2


def test_aiobreaker_half_opens_after_its_timeout_and_closes() -> None:
    cb = aiobreaker.CircuitBreaker(fail_max=1, timeout_duration=timedelta(seconds=30))
    breaker = from_aiobreaker(cb)
    token = breaker.acquire()
    breaker.on_result(token, 0.0, ConnectionResetError())
    assert breaker.state is BreakerState.OPEN
    with pytest.raises(BreakerOpen):
        breaker.acquire()
    cb._state_storage.opened_at = datetime.now(UTC).replace(tzinfo=None) - timedelta(seconds=31)
    token = breaker.acquire()
    assert breaker.state is BreakerState.HALF_OPEN
    breaker.on_result(token, 0.0, None)
    assert breaker.state is BreakerState.CLOSED
    breaker.release(breaker.acquire())  # cancellation: nothing counted
    assert cb.fail_counter == 0


def test_from_aiobreaker_validates() -> None:
    with pytest.raises(ValueError, match="aiobreaker"):
        from_aiobreaker(object())
