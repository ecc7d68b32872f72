"""The stream driver on the same layer objects as the unary one: call/attempt gates hold from
opening to end, item gates wrap each item, recoveries act only before the first item."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any

import anyio
import pytest
from pipeline_helpers import LogGate, LogRecovery, LogWrapper

from ragguard.pipeline import Call
from ragguard.pipeline._chain import Chain

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


def _layers(log: list[Any]) -> list[Any]:
    return [
        LogGate("quota", log),
        LogGate("breaker", log, scope="attempt"),
        LogGate("timer", log, scope="item"),
    ]


async def test_one_chain_runs_a_call_and_a_stream_through_the_same_layer_objects() -> None:
    call_log: list[Any] = []
    layers = _layers(call_log)
    chain = Chain(layers)

    async def one() -> str:
        return "r"

    assert await chain.run(Call("s", one, (), {})) == "r"

    stream_log: list[Any] = []
    for layer in layers:
        layer.log = stream_log  # the very same objects, now logging the stream

    async def three() -> Any:
        for i in range(3):
            yield i

    assert [i async for i in chain.stream(Call("s", three, (), {}, True))] == [0, 1, 2]
    assert call_log == [
        ("enter", "quota"),
        ("enter", "breaker"),
        ("enter", "timer"),
        ("exit", "timer", "t-timer", None),
        ("exit", "breaker", "t-breaker", None),
        ("exit", "quota", "t-quota", None),
    ]
    item = [("enter", "timer"), ("exit", "timer", "t-timer", None)]
    assert stream_log == [
        ("enter", "quota"),
        ("enter", "breaker"),
        *item * 4,  # 3 items and the end
        ("exit", "breaker", "t-breaker", None),
        ("exit", "quota", "t-quota", None),
    ]


async def _tokens(n: int, fail_at: int | None = None, pause: bool = False) -> Any:
    for i in range(n):
        if i == fail_at:
            raise ConnectionResetError("peer went away")
        if pause and i:
            await anyio.Event().wait()
        yield i


async def test_a_stream_that_fails_after_its_first_item_is_not_recovered() -> None:
    log: list[Any] = []
    recovered: list[Any] = []

    async def fallback(call: Call, exc: Exception, again: Any) -> Any:
        return ["fallback"]

    chain = Chain([LogRecovery("fb", recovered, fallback), *_layers(log)])
    got: list[int] = []
    with pytest.raises(ConnectionResetError):
        async with aclosing(chain.stream(Call("s", _tokens, (5, 2), {}, True))) as stream:
            async for item in stream:
                got.append(item)
    assert got == [0, 1] and recovered == []  # the commit point: the caller has items already
    assert log[-2:] == [
        ("exit", "breaker", "t-breaker", "ConnectionResetError"),
        ("exit", "quota", "t-quota", "ConnectionResetError"),
    ]


async def test_a_stream_that_fails_before_its_first_item_is_recovered_and_the_fallback_skips_item_gates() -> (
    None
):
    log: list[Any] = []
    recovered: list[Any] = []

    async def fallback(call: Call, exc: Exception, again: Any) -> Any:
        return ["a", "b"]

    chain = Chain([LogRecovery("fb", recovered, fallback), *_layers(log)])
    assert [i async for i in chain.stream(Call("s", _tokens, (5, 0), {}, True))] == ["a", "b"]
    assert recovered == [("recover", "fb", "ConnectionResetError")]
    assert log.count(("enter", "timer")) == 1  # only the failed opening passed the item gate


async def test_an_early_close_exits_the_gates_with_generator_exit() -> None:
    log: list[Any] = []
    closed: list[bool] = []

    async def endless() -> Any:
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.append(True)

    async with aclosing(Chain(_layers(log)).stream(Call("s", endless, (), {}, True))) as stream:
        assert await stream.__anext__() == 0
        assert await stream.__anext__() == 1
    assert closed == [True]
    assert log[-2:] == [
        ("exit", "breaker", "t-breaker", "GeneratorExit"),
        ("exit", "quota", "t-quota", "GeneratorExit"),
    ]


async def test_a_cancelled_consumer_exits_every_gate_with_the_cancellation() -> None:
    log: list[Any] = []
    chain = Chain([*_layers(log), LogWrapper("chaos", log)])

    async def consume() -> None:
        async with aclosing(chain.stream(Call("s", _tokens, (3, None, True), {}, True))) as stream:
            async for _ in stream:
                pass

    task = asyncio.ensure_future(consume())
    await anyio.wait_all_tasks_blocked()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ("exit", "timer", "t-timer", "CancelledError") in log  # the item being waited for
    assert log[-2:] == [
        ("exit", "breaker", "t-breaker", "CancelledError"),
        ("exit", "quota", "t-quota", "CancelledError"),
    ]
    assert log.count(("around", "chaos")) == 1  # the wrapper wrapped the opening only


async def test_a_retry_before_the_first_item_reopens_the_stream() -> None:
    log: list[Any] = []
    opened: list[int] = []

    async def flaky() -> Any:
        opened.append(1)
        if len(opened) == 1:
            raise ConnectionRefusedError("first try")
        yield "x"

    async def retry(call: Call, exc: Exception, again: Any) -> Any:
        call.attempt += 1
        return await again()

    chain = Chain([LogRecovery("retry", log, retry), LogGate("breaker", log, scope="attempt")])
    assert [i async for i in chain.stream(Call("s", flaky, (), {}, True))] == ["x"]
    assert len(opened) == 2
    assert [e for e in log if e[0] == "exit"] == [
        ("exit", "breaker", "t-breaker", "ConnectionRefusedError"),
        ("exit", "breaker", "t-breaker", None),
    ]
