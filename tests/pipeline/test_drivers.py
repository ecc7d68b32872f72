"""The unary driver: chain shapes, one frame per node, replacement errors, cancellation at every
await, and which recoveries a re-run skips."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from pipeline_helpers import (
    LogGate,
    LogRecovery,
    LogWrapper,
    MaybeTokenGate,
    NoExitGate,
    RepeatLike,
    RetryLike,
)

from ragguard.pipeline import NO_EXIT, Call
from ragguard.pipeline._chain import Chain
from ragguard.pipeline._drivers import compile_chain

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


def _call(fn: Callable[..., Awaitable[Any]], *args: Any) -> Call:
    return Call("s", fn, args, {})


def _fn(log: list[Any], outcome: Any = "result") -> Callable[..., Awaitable[Any]]:
    async def fn(*args: Any) -> Any:
        log.append(("call", args))
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return fn


# -- shapes ---------------------------------------------------------------------------------------


def test_a_chain_compiles_into_nodes_one_per_recovery_level() -> None:
    log: list[Any] = []
    observe, fallback = LogGate("observe", log), LogRecovery("fallback", log, lambda c, e, a: a())
    deadline, retry = LogGate("deadline", log), RetryLike("retry", log)
    breaker, timeout = LogGate("breaker", log, scope="attempt"), LogGate("timeout", log, scope="item")
    chaos = LogWrapper("chaos", log)
    root, item_gates = compile_chain([observe, fallback, deadline, retry, breaker, timeout, chaos])
    assert (root.recoveries, root.gates, root.wrapper) == ((), (observe,), None)
    second = root.inner
    assert second is not None
    assert (second.recoveries, second.gates, second.wrapper) == ((fallback,), (deadline,), None)
    third = second.inner
    assert third is not None and third.inner is None
    # the retry layer is a recovery and a gate: both, in one node
    assert (third.recoveries, third.gates, third.wrapper) == ((retry,), (retry, breaker, timeout), chaos)
    assert item_gates == (timeout,)
    assert third.stream_gates == (retry, breaker)  # call and attempt gates hold for a whole stream


async def test_a_call_runs_in_one_driver_frame_per_node(generated: bool) -> None:
    import sys

    log: list[Any] = []
    frames: list[list[str]] = []

    async def fn() -> str:
        names, frame = [], sys._getframe(1)
        while frame is not None and frame.f_code.co_name != "test_body":
            names.append(frame.f_code.co_filename)
            frame = frame.f_back
        frames.append(names)
        return "ok"

    layers = [
        LogGate("observe", log),
        LogRecovery("fallback", log, lambda c, e, a: a()),
        LogGate("deadline", log),
        RetryLike("retry", log),
        LogGate("breaker", log, scope="attempt"),
    ]
    chain = Chain(layers)
    assert chain.root.inner is not None and chain.root.inner.inner is not None  # three nodes

    async def test_body() -> str:
        return await chain.run(_call(fn))

    assert await test_body() == "ok"
    drivers = [f for f in frames[0] if f.endswith("_drivers.py") or f.startswith("<ragguard chain")]
    # one per node, nothing else between caller and function; written out, the node of the one gate
    # outside the recoveries (the observe layer's) is written into the node inside it: one frame less
    assert len(drivers) == len(frames[0]) == (2 if generated else 3)
    exits = [entry for entry in log if entry[0] == "exit"]
    assert [name for _, name, *_ in exits] == ["breaker", "retry", "deadline", "observe"]  # innermost first
    assert all(entry[-1] is None for entry in exits)  # each with the success


def test_recoveries_without_gates_between_share_a_node_and_wrappers_nest() -> None:
    log: list[Any] = []
    outer, inner = (
        LogRecovery("outer", log, lambda c, e, a: a()),
        LogRecovery("inner", log, lambda c, e, a: a()),
    )
    first, second = LogWrapper("w1", log), LogWrapper("w2", log)
    root, _ = compile_chain([outer, inner, first, second])
    assert root.recoveries == (outer, inner) and root.wrapper is first
    assert root.inner is not None and root.inner.wrapper is second and root.inner.recoveries == ()


def test_anything_else_is_refused() -> None:
    with pytest.raises(TypeError, match="not a Gate, a Recovery or a Wrapper"):
        compile_chain([object()])


@pytest.mark.parametrize("fails", [False, True], ids=["success", "failure"])
async def test_a_gate_that_answers_no_exit_is_not_exited_for_that_call(fails: bool) -> None:
    log: list[Any] = []
    holding, idle = MaybeTokenGate("holding", log, "held"), MaybeTokenGate("idle", log, NO_EXIT)
    nothing = MaybeTokenGate("nothing", log, None)  # None is a token like any other
    chain = Chain([holding, idle, nothing])
    outcome = ConnectionError("down") if fails else "ok"
    if fails:
        with pytest.raises(ConnectionError):
            await chain.run(_call(_fn(log, outcome)))
    else:
        assert await chain.run(_call(_fn(log, outcome))) == "ok"
    exits = [(entry[1], entry[2], entry[3]) for entry in log if entry[0] == "exit"]
    error = type(outcome).__name__ if fails else None
    assert exits == [("nothing", None, error), ("holding", "held", error)]  # the idle gate skipped


async def test_a_recovery_re_runs_through_a_run_without_the_recoveries_it_skips() -> None:
    log: list[Any] = []
    outer = LogRecovery("outer", log, lambda c, e, again: again())
    inner = LogRecovery("inner", log, lambda c, e, again: again())
    root, _ = compile_chain([outer, inner, LogGate("gate", log)])
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError(calls)
        return "ok"

    assert await root.run(_call(flaky)) == "ok"
    recovered = [entry[1] for entry in log if entry[0] == "recover"]
    assert recovered == ["inner", "outer"]  # inner's re-run failed: to outer, whose re-run passed


async def test_a_gate_with_nothing_to_undo_is_never_exited() -> None:
    log: list[Any] = []
    chain = Chain([NoExitGate("quiet", log), LogGate("loud", log)])
    with pytest.raises(ConnectionError):
        await chain.run(_call(_fn(log, ConnectionError("down"))))
    assert [entry[1] for entry in log if entry[0] == "exit"] == ["loud"]


# -- one call -------------------------------------------------------------------------------------


async def test_a_call_enters_outermost_first_and_exits_innermost_first() -> None:
    log: list[Any] = []
    chain = Chain([LogGate("a", log), LogGate("b", log, wait=True), LogWrapper("w", log), LogGate("c", log)])
    assert await chain.run(_call(_fn(log), 1)) == "result"
    assert log == [
        ("enter", "a"),
        ("enter", "b"),
        ("enter_async", "b"),
        ("around", "w"),
        ("enter", "c"),
        ("call", (1,)),
        ("exit", "c", "t-c", None),
        ("around-done", "w"),
        ("exit", "b", "ta-b", None),
        ("exit", "a", "t-a", None),
    ]


async def test_a_failure_reaches_every_exit_and_then_the_recovery() -> None:
    log: list[Any] = []

    async def serve(call: Call, exc: Exception, again: Any) -> str:
        return f"served after {type(exc).__name__}"

    chain = Chain([LogRecovery("fb", log, serve), LogGate("a", log), LogGate("b", log)])
    assert await chain.run(_call(_fn(log, ConnectionError("down")))) == "served after ConnectionError"
    assert log[-3:] == [
        ("exit", "b", "t-b", "ConnectionError"),
        ("exit", "a", "t-a", "ConnectionError"),
        ("recover", "fb", "ConnectionError"),
    ]


async def test_a_gate_refusing_at_enter_exits_only_the_gates_already_entered() -> None:
    log: list[Any] = []
    chain = Chain([LogGate("a", log), LogGate("b", log, refuse=PermissionError("no")), LogGate("c", log)])
    with pytest.raises(PermissionError):
        await chain.run(_call(_fn(log)))
    assert log == [("enter", "a"), ("enter", "b"), ("exit", "a", "t-a", "PermissionError")]


async def test_a_replacement_error_is_what_outer_gates_and_the_caller_see() -> None:
    log: list[Any] = []

    def to_timeout(exc: BaseException | None) -> BaseException | None:
        if isinstance(exc, asyncio.CancelledError):
            replaced = TimeoutError("attempt timed out")
            replaced.__cause__ = exc
            return replaced
        return None

    chain = Chain([LogGate("outer", log), LogGate("timer", log, replace=to_timeout)])
    with pytest.raises(TimeoutError) as raised:
        await chain.run(_call(_fn(log, asyncio.CancelledError())))
    assert isinstance(raised.value.__cause__, asyncio.CancelledError)
    assert log[-2:] == [
        ("exit", "timer", "t-timer", "CancelledError"),
        ("exit", "outer", "t-outer", "TimeoutError"),
    ]


async def test_a_success_can_be_replaced_too() -> None:
    log: list[Any] = []
    chain = Chain([LogGate("outer", log), LogGate("late", log, replace=lambda exc: LookupError("too late"))])
    with pytest.raises(LookupError):
        await chain.run(_call(_fn(log)))
    assert log[-1] == ("exit", "outer", "t-outer", "LookupError")


# -- cancellation at every await ------------------------------------------------------------------


async def _cancel_while_blocked(run: Callable[[], Awaitable[Any]]) -> None:
    task = asyncio.ensure_future(run())
    await anyio.wait_all_tasks_blocked()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_cancelled_in_enter_async_exits_the_gates_entered_before_it() -> None:
    log: list[Any] = []
    recoveries: list[Any] = []
    chain = Chain(
        [
            LogRecovery("never", recoveries, lambda c, e, a: a()),
            LogGate("a", log),
            LogGate("queued", log, wait=True, hold=anyio.Event()),
            LogGate("c", log),
        ]
    )
    await _cancel_while_blocked(lambda: chain.run(_call(_fn(log))))
    assert log == [
        ("enter", "a"),
        ("enter", "queued"),
        ("enter_async", "queued"),
        ("exit", "a", "t-a", "CancelledError"),
    ]
    assert recoveries == []  # a cancellation is never recovered


async def test_cancelled_during_the_call_exits_every_gate_with_the_cancellation() -> None:
    log: list[Any] = []

    async def hang() -> None:
        log.append(("call", ()))
        await anyio.Event().wait()

    chain = Chain([LogGate("a", log), LogWrapper("w", log), LogGate("b", log)])
    await _cancel_while_blocked(lambda: chain.run(_call(hang)))
    assert log[-4:] == [
        ("call", ()),
        ("exit", "b", "t-b", "CancelledError"),
        ("around-done", "w"),
        ("exit", "a", "t-a", "CancelledError"),
    ]


async def test_cancelled_inside_a_recovery_propagates_and_nothing_is_left_entered() -> None:
    log: list[Any] = []

    async def slow_fallback(call: Call, exc: Exception, again: Any) -> Any:
        await anyio.Event().wait()

    outer = LogRecovery("outer", log, lambda c, e, a: a())
    chain = Chain([LogGate("a", log), outer, LogRecovery("slow", log, slow_fallback), LogGate("b", log)])
    await _cancel_while_blocked(lambda: chain.run(_call(_fn(log, ConnectionError()))))
    assert ("recover", "slow", "ConnectionError") in log
    assert ("recover", "outer", "CancelledError") not in log and log[-1] == (
        "exit",
        "a",
        "t-a",
        "CancelledError",
    )
    entered = sum(1 for e in log if e[0] == "enter")
    assert entered == sum(1 for e in log if e[0] == "exit")


# -- which recoveries a re-run skips --------------------------------------------------------------


async def test_a_recovery_re_runs_the_layers_inside_it_with_itself_and_the_outer_ones_skipped() -> None:
    log: list[Any] = []
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise ConnectionError(f"failure {calls}")
        return "ok"

    async def once_more(call: Call, exc: Exception, again: Any) -> Any:
        return await again()

    async def serve(call: Call, exc: Exception, again: Any) -> Any:
        return await again()  # a recovery that re-runs: the inner recovery is active again

    chain = Chain([LogRecovery("outer", log, serve), LogRecovery("inner", log, once_more), LogGate("g", log)])
    assert await chain.run(_call(flaky)) == "ok"
    recoveries = [e for e in log if e[0] == "recover"]
    # failure 1 -> inner re-runs -> failure 2 is raised by ``again`` to inner (inner skipped
    # itself), inner raises it -> outer -> re-run with inner active again -> success
    assert recoveries == [("recover", "inner", "ConnectionError"), ("recover", "outer", "ConnectionError")]
    assert calls == 3


async def test_a_recovery_that_does_not_apply_hands_the_error_outward() -> None:
    log: list[Any] = []

    async def refuse(call: Call, exc: Exception, again: Any) -> Any:
        raise exc

    async def replace(call: Call, exc: Exception, again: Any) -> Any:
        raise KeyError("replaced")

    async def catch(call: Call, exc: Exception, again: Any) -> Any:
        return f"outer got {type(exc).__name__}"

    chain = Chain(
        [
            LogRecovery("outer", log, catch),
            LogRecovery("mid", log, replace),
            LogRecovery("inner", log, refuse),
            LogGate("g", log),
        ]
    )
    assert await chain.run(_call(_fn(log, ConnectionError()))) == "outer got KeyError"
    assert [e[1] for e in log if e[0] == "recover"] == ["inner", "mid", "outer"]


async def test_the_retry_shape_counts_attempts_and_re_enters_its_gates() -> None:
    log: list[Any] = []
    results = [ConnectionError("1"), ConnectionError("2"), "ok"]

    async def fn() -> Any:
        r = results.pop(0)
        if isinstance(r, BaseException):
            raise r
        return r

    retry = RetryLike("retry", log, times=3)
    call = _call(fn)
    assert await Chain([retry, LogGate("breaker", log, scope="attempt")]).run(call) == "ok"
    assert call.attempt == 3
    assert [e for e in log if e[0] == "enter"] == [("enter", "retry"), ("enter", "breaker")] * 3


# -- a recovery that repeats (the retry layer's shape) ---------------------------------------------


def _failing(results: list[Any]) -> Callable[..., Awaitable[Any]]:
    async def fn() -> Any:
        r = results.pop(0)
        if isinstance(r, BaseException):
            raise r
        return r

    return fn


async def test_a_repeating_recovery_re_enters_the_gates_until_a_success() -> None:
    log: list[Any] = []
    repeat = RepeatLike("retry", log, attempts=3)
    call = _call(_failing([ConnectionError("1"), TimeoutError("2"), "ok"]))
    assert await Chain([repeat, LogGate("breaker", log, scope="attempt")]).run(call) == "ok"
    assert call.attempt == 3
    assert [e for e in log if e[0] in ("enter", "next_wait", "sleep")] == [
        ("enter", "retry"), ("enter", "breaker"),
        ("next_wait", "retry", "ConnectionError", 1, 1), ("sleep", "retry", 0.0),
        ("enter", "retry"), ("enter", "breaker"),
        ("next_wait", "retry", "TimeoutError", 2, 2), ("sleep", "retry", 0.0),
        ("enter", "retry"), ("enter", "breaker"),
    ]  # fmt: skip
    exits = [(e[1], e[3]) for e in log if e[0] == "exit"]
    assert exits == [
        ("breaker", "ConnectionError"), ("retry", "ConnectionError"),
        ("breaker", "TimeoutError"), ("retry", "TimeoutError"),
        ("breaker", None), ("retry", None),
    ]  # fmt: skip


async def test_an_error_a_repeating_recovery_stops_at_goes_to_the_recoveries_outside_it() -> None:
    log: list[Any] = []

    async def catch(call: Call, exc: Exception, again: Any) -> Any:
        return f"outer got {exc!r} at attempt {call.attempt}"

    outer, repeat = LogRecovery("fallback", log, catch), RepeatLike("retry", log, attempts=2)
    chain = Chain([outer, repeat, LogGate("g", log)])
    got = await chain.run(_call(_failing([ConnectionError("1"), ConnectionError("2")])))
    assert got == "outer got ConnectionError('2') at attempt 2"
    got = await chain.run(_call(_failing([KeyError("not repeated")])))  # declined at once
    assert got == "outer got KeyError('not repeated') at attempt 1"
    with pytest.raises(ConnectionError, match="3"):  # with nothing outside it, the last error is raised
        await Chain([RepeatLike("retry", log, attempts=3)]).run(
            _call(_failing([ConnectionError("1"), ConnectionError("2"), ConnectionError("3")]))
        )


async def test_a_recovery_outside_a_repeating_one_re_runs_it_from_its_first_attempt() -> None:
    log: list[Any] = []

    async def once_more(call: Call, exc: Exception, again: Any) -> Any:
        return await again()

    results: list[Any] = [ConnectionError("1"), ConnectionError("2"), ConnectionError("3"), "ok"]
    outer, repeat = LogRecovery("outer", log, once_more), RepeatLike("retry", log, attempts=2)
    chain = Chain([outer, repeat, LogGate("g", log)])
    call = _call(_failing(results))
    assert await chain.run(call) == "ok"
    asked = [(e[3], e[4]) for e in log if e[0] == "next_wait"]
    assert asked == [(1, 1), (2, 2), (1, 2)]  # the re-run counts its own attempts from 1 again
    assert call.attempt == 3


async def test_a_repeating_recoverys_later_errors_have_the_first_as_context_and_it_is_cancellable() -> None:
    log: list[Any] = []
    errors = [ConnectionError("1"), ConnectionError("2"), ConnectionError("3")]
    with pytest.raises(ConnectionError) as raised:
        await Chain([RepeatLike("retry", log, attempts=3)]).run(_call(_failing(list(errors))))
    assert raised.value is errors[2]
    # as when recover() runs each later attempt inside the handler of the first error
    assert errors[2].__context__ is errors[0] and errors[1].__context__ is errors[0]
    assert errors[0].__context__ is None
    gate = LogGate("g", log)
    task = asyncio.ensure_future(Chain([RepeatLike("retry", log, attempts=99), gate]).run(
        _call(_failing([ConnectionError(str(n)) for n in range(99)]))
    ))  # fmt: skip
    for _ in range(3):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    entered = [e for e in log if e[0] == "enter" and e[1] == "g"]
    assert len(entered) == len([e for e in log if e[0] == "exit" and e[1] == "g"])  # nothing left held


async def test_the_written_out_driver_runs_a_repeating_recoverys_attempts_in_the_nodes_frame(
    generated: bool,
) -> None:
    import sys

    depths: list[int] = []

    async def fn() -> str:
        depth, frame = 0, sys._getframe(1)
        while frame is not None:
            depth, frame = depth + 1, frame.f_back
        depths.append(depth)
        if len(depths) < 3:
            raise ConnectionError(len(depths))
        return "ok"

    log: list[Any] = []
    assert await Chain([RepeatLike("retry", log, attempts=3), LogGate("g", log)]).run(_call(fn)) == "ok"
    if generated:
        assert depths[0] == depths[1] == depths[2]  # no frame per attempt
    else:
        assert depths[0] < depths[1] == depths[2]  # recover() and the re-run's frame


# -- the outcome each error is recorded with -------------------------------------------------------


class _OutcomeGate(LogGate):
    """Logs the outcome the chain put on the call for the error its exit is handed."""

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        self.log.append(("outcome", call.outcome))
        return None


class _Waits(ConnectionRefusedError):
    retry_after_s = 3.0  # a class of the user's that states its wait


@pytest.mark.parametrize("own_classifier", [False, True], ids=["ragguard's", "a Guard's own"])
async def test_a_plain_os_error_and_one_carrying_a_wait_are_recorded_as_classify_says(
    own_classifier: bool,
) -> None:
    from ragguard.outcomes import Kind, Outcome, classify, outcome_of
    from ragguard.outcomes._classify import classify_with

    asked = classify_with(lambda exc: Outcome(Kind.UNKNOWN, reason="asked"))
    classifier = asked if own_classifier else classify
    stated = ConnectionRefusedError("down")
    stated.retry_after_s = 2.0  # type: ignore[attr-defined]  # an instance with its wait
    for error, wait in [
        (ConnectionRefusedError("down"), None), (TimeoutError("slow"), None),
        (stated, 2.0), (_Waits("x"), 3.0),
    ]:  # fmt: skip
        log: list[Any] = []
        chain = Chain([_OutcomeGate("g", log)], classifier)
        with pytest.raises(type(error)):
            await chain.run(_call(_fn(log, error)))
        recorded = [entry[1] for entry in log if entry[0] == "outcome"]
        expected = classifier(type(error)(*error.args))
        assert recorded == [outcome_of(error)]
        assert recorded[0].kind is expected.kind and recorded[0].retry_after_s == wait


async def test_a_classifier_not_ragguards_is_asked_about_every_error() -> None:
    from ragguard.outcomes import Kind, Outcome

    asked: list[BaseException] = []

    def mine(exc: BaseException) -> Outcome:
        asked.append(exc)
        return Outcome(Kind.CALLER_ERROR)

    log: list[Any] = []
    error = ConnectionRefusedError("down")
    with pytest.raises(ConnectionRefusedError):
        await Chain([_OutcomeGate("g", log)], mine).run(_call(_fn(log, error)))
    assert asked == [error] and log[-1] == ("outcome", Outcome(Kind.CALLER_ERROR))


async def test_an_error_a_repeating_recoverys_decision_raises_goes_to_the_recoveries_outside_it() -> None:
    log: list[Any] = []

    class Broken(RepeatLike):
        def next_wait(self, call: Call, exc: Exception, attempt: int) -> float | None:
            raise KeyError("broken decision")

    async def catch(call: Call, exc: Exception, again: Any) -> Any:
        return f"outer got {exc!r}"

    chain = Chain([LogRecovery("fallback", log, catch), Broken("retry", log), LogGate("g", log)])
    assert await chain.run(_call(_failing([ConnectionError("1")]))) == "outer got KeyError('broken decision')"
    with pytest.raises(KeyError, match="broken decision"):
        await Chain([Broken("retry", log)]).run(_call(_failing([ConnectionError("1")])))


async def test_what_raises_in_a_repeating_recoverys_wait_leaves_as_from_its_recover() -> None:
    log: list[Any] = []
    first = ConnectionError("1")

    class BrokenSleep(RepeatLike):
        async def sleep(self, seconds: float) -> None:
            raise KeyError("no sleep")

    async def catch(call: Call, exc: Exception, again: Any) -> Any:
        return f"outer got {exc!r}, context {exc.__context__!r}"

    chain = Chain([LogRecovery("fallback", log, catch), BrokenSleep("retry", log), LogGate("g", log)])
    got = await chain.run(_call(_failing([first])))
    assert got == "outer got KeyError('no sleep'), context ConnectionError('1')"

    class Parked(RepeatLike):
        async def sleep(self, seconds: float) -> None:
            await asyncio.sleep(10)

    errors = [ConnectionError("2")]
    task = asyncio.ensure_future(Chain([LogRecovery("fallback", log, catch), Parked("retry", log)]).run(
        _call(_failing(list(errors)))
    ))  # fmt: skip
    for _ in range(3):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError) as cancelled:
        await task
    assert cancelled.value.__context__ is errors[0]  # cancelled in the wait: never recovered


class _Refused(Exception):
    pass


class _Replaced(Exception):
    pass


def _outer_gate(mode: str, log: list[Any]) -> LogGate:
    """The one gate outside the recoveries, doing ``mode``."""

    def replace(exc: BaseException | None) -> BaseException | None:
        if mode == "raises in exit":
            raise _Replaced("exit raised")
        wanted = {"replaces a success": exc is None, "replaces an error": exc is not None}.get(mode, False)
        return _Replaced("replaced") if wanted else None

    return LogGate("observe", log, replace=replace, wait=mode == "waits",
                   refuse=_Refused("refused") if mode == "refuses" else None)  # fmt: skip


async def _outer_case(generated: bool, gate: str, recovery: str, attempt: str) -> tuple[Any, ...]:
    from ragguard.pipeline import _drivers

    async def fallback(call: Call, exc: Exception, again: Callable[[], Awaitable[Any]]) -> Any:
        if recovery == "raises":
            raise exc
        return "fallback" if recovery == "recovers" else await again()

    runs = 0

    async def fn() -> str:
        nonlocal runs
        runs += 1
        if attempt == "cancelled":
            raise asyncio.CancelledError()
        if attempt == "fails" or (attempt == "fails once" and runs == 1):
            raise _Refused(f"attempt {runs}")
        return "ok"

    log: list[Any] = []
    _drivers.GENERATED = generated
    chain = Chain([_outer_gate(gate, log), LogRecovery("fallback", log, fallback), LogGate("inner", log)])
    call = _call(fn)
    try:
        result: tuple[Any, ...] = ("returned", await chain.run(call))
    except BaseException as exc:  # what left the chain, its context and the outcome it carries
        context = exc.__context__
        result = ("raised", type(exc), str(exc), type(context), str(context), call.outcome)
    return result, log


_GATE_MODES = [
    "lets through", "replaces a success", "replaces an error", "refuses", "waits", "raises in exit",
]  # fmt: skip


@pytest.mark.parametrize("gate", _GATE_MODES)
async def test_one_gate_around_a_node_runs_written_in_as_in_its_own_node(gate: str) -> None:
    # written out, the node of one gate around a node with recoveries is written into that node's
    # frame (_compiled._OUTER): every outcome, exit and error is Node.drive's
    for recovery in ("recovers", "runs again", "raises"):
        for attempt in ("succeeds", "fails", "fails once", "cancelled"):
            written = await _outer_case(True, gate, recovery, attempt)
            plain = await _outer_case(False, gate, recovery, attempt)
            assert written == plain, (recovery, attempt)
