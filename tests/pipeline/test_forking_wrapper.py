"""The wrapper contract's ``forks``: a wrapper that says ``forks = True`` gets ``proceed(call)``,
the rest of the chain as a function of the record to run, so it can run the inner layers with a
record of its own (the hedge's second leg) without knowing how the driver built them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import pytest

from ragguard.pipeline import Call
from ragguard.pipeline._chain import Chain

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


class Twice:
    """Runs the inner layers once with the call, once with a copy whose argument is doubled."""

    forks: ClassVar[bool] = True

    def __init__(self) -> None:
        self.records: list[Call] = []

    async def around(self, call: Call, proceed: Callable[[Call], Awaitable[Any]]) -> Any:
        twin = Call(call.stage, call.fn, tuple(a * 2 for a in call.args), call.kwargs, call.stream)
        first = await proceed(call)
        second = await proceed(twin)
        if call.stream:  # an opened stream each: the caller reads the first, the copy is closed
            await second.agen.aclose()
            return first
        return first, second


class SeesRecords:
    """A gate that logs the arguments of each record it admits."""

    scope: ClassVar[Any] = "call"

    def __init__(self, log: list[Any]) -> None:
        self.log = log

    async def enter_async(self, call: Call) -> Any:  # never asked
        return None

    def enter(self, call: Call) -> Any:
        self.log.append(("enter", call.args))
        return None

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        return None


async def _double(x: int) -> int:
    return x * 10


async def test_a_forking_wrapper_runs_the_inner_layers_with_its_own_record() -> None:
    log: list[Any] = []
    chain = Chain([Twice(), SeesRecords(log)])
    assert await chain.run(Call("s", _double, (1,), {})) == (10, 20)
    assert log == [("enter", (1,)), ("enter", (2,))]  # the inner gate saw each record


async def test_a_forking_wrapper_with_nothing_inside_calls_the_function_of_the_record() -> None:
    assert await Chain([Twice()]).run(Call("s", _double, (3,), {})) == (30, 60)


async def test_a_forking_stream_wrapper_opens_the_record_it_is_given() -> None:
    async def items(n: int) -> Any:
        for i in range(n):
            yield i

    log: list[Any] = []
    chain = Chain([Twice(), SeesRecords(log)])
    got = [item async for item in chain.stream(Call("s", items, (2,), {}, True))]
    assert got == [0, 1]
    assert log == [("enter", (2,)), ("enter", (4,))]
