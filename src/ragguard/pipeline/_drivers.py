"""The two drivers that run a chain of layers: one for calls, one for streams.

A chain (outermost layer first) is compiled once into nodes. A node holds the recoveries that
surround it, then the gates it enters in order, then either a wrapper around the next node, the
next node, or the call itself::

    [observe gate] -> [fallback | deadline, quota gates] -> [retry | breaker, timeout gates]
        -> chaos wrapper -> the call

so a call through the full stack runs in as many coroutine frames as it has recovery levels, and
gates cost a method call each, in the driver's frame. The stream driver walks the same nodes and
calls the same layer objects (see :mod:`ragguard.pipeline._contract` for what each shape does on a
stream), so a call and a stream cannot be guarded differently.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from .._compat import PY311, current_task, running_loop
from ._contract import WAIT, Call, Gate, Recovery, Wrapper

__all__ = ["Head", "Node", "call_fn", "compile_chain", "run_stream"]


class Node:
    """Recoveries, then gates, then a wrapper or the next node or the call (see module docstring)."""

    __slots__ = ("gates", "inner", "recoveries", "stream_gates", "wrapper")

    def __init__(self) -> None:
        self.recoveries: tuple[Recovery, ...] = ()
        self.gates: tuple[Gate, ...] = ()
        self.wrapper: Wrapper | None = None
        self.inner: Node | None = None
        self.stream_gates: tuple[Gate, ...] = ()  # the call/attempt-scope gates, for streams

    # -- calls ----------------------------------------------------------------------------------

    async def run(self, call: Call, skip: int = 0) -> Any:
        """Run this node and the ones inside it once; recoveries ``[skip:]`` handle a failure
        (a recovery calling ``again`` re-runs with itself and those outside it skipped)."""
        gates = self.gates
        tokens: list[Any] = []
        try:
            try:
                for gate in gates:
                    token = gate.enter(call)
                    if token is WAIT:
                        token = await gate.enter_async(call)
                    tokens.append(token)
                if self.wrapper is not None:
                    inner = self.inner
                    proceed = call_fn(call) if inner is None else partial(inner.run, call)
                    result = await self.wrapper.around(call, proceed)
                elif self.inner is not None:
                    result = await self.inner.run(call)
                elif PY311:
                    result = await _await_311(call.fn, *call.args, **call.kwargs)
                else:
                    result = await call.fn(*call.args, **call.kwargs)
            except BaseException as exc:
                _exit_all(call, gates, tokens, exc)
                raise
            _exit_all(call, gates, tokens, None)
            return result
        except Exception as exc:
            if len(self.recoveries) <= skip:
                raise
            return await self._recover(call, exc, skip)

    async def _recover(self, call: Call, exc: Exception, skip: int) -> Any:
        recoveries = self.recoveries
        i = len(recoveries) - 1
        while True:  # the innermost recovery first; one that raises hands its error outward
            try:
                return await recoveries[i].recover(call, exc, partial(self.run, call, i + 1))
            except Exception as raised:
                if i <= skip:
                    raise
                exc = raised
            i -= 1

    # -- streams --------------------------------------------------------------------------------

    async def open(self, call: Call, item_gates: tuple[Gate, ...], skip: int = 0) -> Head:
        """Open the stream through this node and the ones inside it, up to its first item
        (which passes ``item_gates``, the item-scope gates of the whole chain)."""
        gates = self.stream_gates
        tokens: list[Any] = []
        try:
            try:
                for gate in gates:
                    token = gate.enter(call)
                    if token is WAIT:
                        token = await gate.enter_async(call)
                    tokens.append(token)
                inner = self.inner
                head: Head
                if self.wrapper is not None and self.wrapper.streams:
                    proceed = (
                        _open_fn(call, item_gates) if inner is None else partial(inner.open, call, item_gates)
                    )
                    head = await self.wrapper.around(call, proceed)
                elif inner is not None:
                    head = await inner.open(call, item_gates)
                else:
                    head = await _open_fn(call, item_gates)()
            except BaseException as exc:
                _exit_all(call, gates, tokens, exc)
                raise
            head.held.append((gates, tokens))
            return head
        except Exception as exc:
            if len(self.recoveries) <= skip:
                raise
            return await self._recover_open(call, item_gates, exc, skip)

    async def _recover_open(
        self, call: Call, item_gates: tuple[Gate, ...], exc: Exception, skip: int
    ) -> Head:
        recoveries = self.recoveries
        i = len(recoveries) - 1
        while True:
            try:
                got = await recoveries[i].recover(call, exc, partial(self.open, call, item_gates, i + 1))
            except Exception as raised:
                if i <= skip:
                    raise
                exc = raised
                i -= 1
                continue
            if isinstance(got, Head):
                return got
            return await Head.of_fallback(got)


def _exit_all(call: Call, gates: Sequence[Gate], tokens: list[Any], exc: BaseException | None) -> None:
    """Exit the entered gates, innermost first; raise the replacement error a gate returned (the
    gate sets its cause)."""
    err = exc
    for i in range(len(tokens) - 1, -1, -1):
        replaced = gates[i].exit(call, tokens[i], err)
        if replaced is not None:
            err = replaced
    if err is not exc and err is not None:
        raise err


def call_fn(call: Call) -> Callable[[], Awaitable[Any]]:
    """The innermost step of a call: the guarded function with the call's current arguments, as a
    ``functools.partial`` (chaos faults read the arguments' batch size from it)."""
    if PY311:
        return partial(_await_311, call.fn, *call.args, **call.kwargs)
    return partial(call.fn, *call.args, **call.kwargs)


async def _await_311(fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any) -> Any:
    # Python 3.11's asyncio.wait_for (redis-py wraps every command in it) drops a cancellation
    # that lands while the awaited call finishes in the same loop iteration (cpython gh-86296).
    # A cancellation requested during the call and not delivered is re-raised here.
    loop = running_loop()
    task = current_task(loop) if loop is not None else None
    if task is None:
        return await fn(*args, **kwargs)
    before = task.cancelling()
    result = await fn(*args, **kwargs)
    if task.cancelling() > before:
        raise asyncio.CancelledError("cancelled while the call was finishing (Python 3.11 wait_for)")
    return result


# -- streams --------------------------------------------------------------------------------------


class Head:
    """An opened stream: the iterator, its first item, and the gate tokens held until it ends."""

    __slots__ = ("agen", "done", "first", "guarded", "held")

    def __init__(self, agen: Any, first: Any, done: bool, guarded: bool = True) -> None:
        self.agen = agen
        self.first = first
        self.done = done
        self.guarded = guarded  # False for a fallback's stream: its items skip the item gates
        self.held: list[tuple[Sequence[Gate], list[Any]]] = []

    @classmethod
    async def of_fallback(cls, produced: Any) -> Head:
        """A stream a fallback returned (an async iterable, or an iterable), its first item read."""
        agen = produced.__aiter__() if hasattr(produced, "__aiter__") else _aiter(produced)
        try:
            first = await agen.__anext__()
        except StopAsyncIteration:
            return cls(agen, None, True, guarded=False)
        return cls(agen, first, False, guarded=False)


async def _aiter(items: Any) -> AsyncIterator[Any]:
    for item in items:
        yield item


def _open_fn(call: Call, item_gates: tuple[Gate, ...]) -> Callable[[], Awaitable[Head]]:
    async def open_stream() -> Head:
        agen = call.fn(*call.args, **call.kwargs)
        try:
            first = await next_item(call, agen, item_gates)
        except StopAsyncIteration:
            return Head(agen, None, True)
        except BaseException:
            await _close(agen)
            raise
        return Head(agen, first, False)

    return open_stream


async def next_item(call: Call, agen: Any, gates: tuple[Gate, ...]) -> Any:
    """The stream's next item through the item-scope ``gates`` (StopAsyncIteration at the end)."""
    entered: list[Any] = []
    try:
        for gate in gates:
            token = gate.enter(call)
            if token is WAIT:
                token = await gate.enter_async(call)
            entered.append(token)
        item = await agen.__anext__()
    except StopAsyncIteration:
        _exit_all(call, gates, entered, None)
        raise
    except BaseException as exc:
        _exit_all(call, gates, entered, exc)
        raise
    _exit_all(call, gates, entered, None)
    return item


async def _close(agen: Any) -> None:
    aclose = getattr(agen, "aclose", None)
    if aclose is not None:
        await aclose()


async def run_stream(root: Node, item_gates: tuple[Gate, ...], call: Call) -> AsyncIterator[Any]:
    """Drive a stream through the chain rooted at ``root`` (an async generator of its items).

    Before the first item, recoveries may retry or serve a fallback; after it, an error ends the
    stream (the commit point). Call- and attempt-scope gates hold until the stream ends, however
    it ends (exhausted, failed, closed early or cancelled) and exit once with that outcome.
    """
    head = await root.open(call, item_gates)
    outcome: BaseException | None = None
    try:
        if head.done:
            return
        call.items = 1
        yield head.first
        agen = head.agen
        while True:
            try:
                item = await (next_item(call, agen, item_gates) if head.guarded else agen.__anext__())
            except StopAsyncIteration:
                return
            call.items += 1
            yield item
    except BaseException as exc:
        outcome = exc
        raise
    finally:
        try:
            await _close(head.agen)
        finally:
            # innermost node first; a consumer that stops early closes us with GeneratorExit, which
            # gates treat as a cancellation: released, nothing recorded
            for gates, tokens in head.held:
                _exit_all(call, gates, tokens, outcome)


def compile_chain(layers: Sequence[Any]) -> tuple[Node, tuple[Gate, ...]]:
    """The root node for ``layers`` (outermost first; see the module docstring) and the item-scope
    gates of the whole chain, outermost first (what each item of a stream passes through)."""
    root = node = Node()
    for layer in layers:
        shapes = 0
        if isinstance(layer, Recovery):  # a layer may be a recovery and a gate (retry counts calls)
            if node.gates or node.wrapper is not None:
                node = _descend(node)
            node.recoveries = (*node.recoveries, layer)
            shapes += 1
        if isinstance(layer, Gate):
            if node.wrapper is not None:
                node = _descend(node)
            node.gates = (*node.gates, layer)
            shapes += 1
        if isinstance(layer, Wrapper):
            if node.wrapper is not None:
                node = _descend(node)
            node.wrapper = layer
            shapes += 1
        if not shapes:
            raise TypeError(f"{layer!r} is not a Gate, a Recovery or a Wrapper")
    item_gates: list[Gate] = []
    n: Node | None = root
    while n is not None:
        n.stream_gates = tuple(g for g in n.gates if g.scope != "item")
        item_gates.extend(g for g in n.gates if g.scope == "item")
        n = n.inner
    return root, tuple(item_gates)


def _descend(node: Node) -> Node:
    child = Node()
    node.inner = child
    return child
