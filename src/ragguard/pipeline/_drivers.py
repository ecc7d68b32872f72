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
from .._context import mark_degraded
from .._endings import StreamEnding, ended_by, record_ending
from .._errors import DeadlineExceeded, StageTimeout
from ._contract import WAIT, Call, Gate, Recovery, Resumption, Wrapper

__all__ = ["Head", "Node", "call_fn", "compile_chain", "run_stream"]


class Node:
    """Recoveries, then gates, then a wrapper or the next node or the call (see module docstring)."""

    __slots__ = (
        "gates", "inner", "recoveries", "resume_gates", "run", "runs", "source", "stream_gates", "wrapper",
    )

    def __init__(self) -> None:
        self.recoveries: tuple[Recovery, ...] = ()
        self.gates: tuple[Gate, ...] = ()
        self.wrapper: Wrapper | None = None
        self.inner: Node | None = None
        self.stream_gates: tuple[Gate, ...] = ()  # the call/attempt-scope gates, for streams
        self.source = ""  # the compiled run(), for reading in a debugger
        # (the root's) the item gates outside a wrapper that ``resumes`` a stream: what a
        # continuation's items still pass (a stage's deadline share)
        self.resume_gates: tuple[Gate, ...] = ()

    # -- calls ----------------------------------------------------------------------------------

    run: Callable[..., Awaitable[Any]]
    """``await node.run(call, skip=0)``: run this node and the ones inside it once; recoveries
    ``[skip:]`` handle a failure (a recovery calling ``again`` re-runs with itself and those outside
    it skipped). Compiled by :func:`_compile_run` once the chain is built."""

    runs: tuple[Callable[[Call], Awaitable[Any]], ...]
    """``runs[k](call)``: :attr:`run` with recoveries ``[k:]`` (``runs[0]`` is ``run``; the last
    has no recovery at all: what a recovery's ``again`` runs when it is the innermost)."""

    async def _recover(self, call: Call, exc: Exception, skip: int) -> Any:
        recoveries = self.recoveries
        i = len(recoveries) - 1
        try:
            while True:  # the innermost recovery first; one that raises hands its error outward
                try:
                    return await recoveries[i].recover(call, exc, partial(self.runs[i + 1], call))
                except Exception as raised:
                    if i <= skip:
                        raise
                    exc = raised
                i -= 1
        finally:
            del exc  # no reference cycle between the error raised and this frame

    # -- streams --------------------------------------------------------------------------------

    async def open(self, call: Call, item_gates: tuple[Gate, ...], skip: int = 0) -> Head:
        """Open the stream through this node and the ones inside it, up to its first item.

        Every gate of the node is entered at its place, as for a call, so the opening (wrappers
        included: a chaos latency, a slow first token) is bounded by the item gates (the attempt
        timer) exactly as a call is. Once the first item is there the item gates exit and the
        call and attempt gates are held until the stream ends. ``item_gates`` (those of the whole
        chain) bound each later item."""
        gates = self.gates
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
                    proceed: Callable[..., Awaitable[Head]]
                    if getattr(self.wrapper, "forks", False):  # proceed(call), see Wrapper
                        proceed = partial(_open_call, inner, item_gates)
                    else:
                        proceed = _open_fn(call) if inner is None else partial(inner.open, call, item_gates)
                    head = await self.wrapper.around(call, proceed)
                elif inner is not None:
                    head = await inner.open(call, item_gates)
                else:
                    head = await _open_fn(call)()
            except BaseException as exc:
                _exit_all(call, gates, tokens, exc)
                raise
            if len(self.stream_gates) == len(gates):
                head.held.append((gates, tokens))
            else:
                await _hold(call, gates, tokens, head)
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
        try:
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
        finally:
            del exc  # no reference cycle between the error raised and this frame


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


async def _hold(call: Call, gates: Sequence[Gate], tokens: list[Any], head: Head) -> None:
    """The first item is there: exit the item gates (innermost first) and hold the others until
    the stream ends. An item gate that replaces the success with an error ends the stream here."""
    held_gates: list[Gate] = []
    held_tokens: list[Any] = []
    for gate, token in zip(gates, tokens, strict=True):
        if gate.scope != "item":
            held_gates.append(gate)
            held_tokens.append(token)
    err: BaseException | None = None
    for i in range(len(gates) - 1, -1, -1):
        if gates[i].scope == "item":
            replaced = gates[i].exit(call, tokens[i], err)
            if replaced is not None:
                err = replaced
    if err is None:
        head.held.append((held_gates, held_tokens))
        return
    try:
        await _close(head.agen)
    finally:
        try:
            for inner_gates, inner_tokens in head.held:  # the nodes inside, innermost first
                _exit_all(call, inner_gates, inner_tokens, err)
        finally:
            _exit_all(call, held_gates, held_tokens, err)
    raise err


async def run_call(call: Call) -> Any:
    """The innermost step of ``call`` for a wrapper that ``forks`` (see :class:`Wrapper`)."""
    return await call.fn(*call.args, **call.kwargs)


def call_fn(call: Call) -> Callable[[], Awaitable[Any]]:
    """The innermost step of a call: the guarded function with the call's current arguments, as a
    ``functools.partial`` (chaos faults read the arguments' batch size from it)."""
    return partial(call.fn, *call.args, **call.kwargs)


# -- streams --------------------------------------------------------------------------------------


class Head:
    """An opened stream: the iterator, its first item, and the gate tokens held until it ends.

    ``deliver``: None, or a function the stream driver calls with each item (the first included)
    before it hands the item to the caller, outside every item gate; it returns None, or an
    awaitable the driver awaits first. A wrapper with ``streams = True`` sets it on the head it
    returns (the generation preset counts each item's tokens there and returns the tenant's pacing
    wait, so the wait is not the dependency's time and an item that needs none costs no coroutine).
    """

    __slots__ = ("agen", "deliver", "done", "first", "guarded", "held", "resume")

    def __init__(self, agen: Any, first: Any, done: bool, guarded: bool = True) -> None:
        self.agen = agen
        self.first = first
        self.done = done
        self.guarded = guarded  # False for a fallback's stream: its items skip the item gates
        self.held: list[tuple[Sequence[Gate], list[Any]]] = []
        self.deliver: Callable[[Any], Awaitable[Any] | None] | None = None
        self.resume: Resumption | None = None  # set by a layer that can carry the stream on

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


async def _open_call(inner: Node | None, item_gates: tuple[Gate, ...], call: Call) -> Head:
    """A forking stream wrapper's ``proceed(call)``: open ``call`` through ``inner``."""
    return await (_open_fn(call)() if inner is None else inner.open(call, item_gates))


def _open_fn(call: Call) -> Callable[[], Awaitable[Head]]:
    """The innermost step of a stream's opening: start the generator and read its first item
    (the nodes around it entered the item gates for that item)."""

    async def open_stream() -> Head:
        agen = call.fn(*call.args, **call.kwargs)
        try:
            first = await _anext(agen)
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
        if _CHECK_LOST_CANCEL:  # inlined: an extra coroutine frame per item cost more than the check
            loop = call.loop
            if loop is None:
                loop = call.loop = running_loop()
            task = None if loop is None else current_task(loop)  # the consumer may change
            before = 0 if task is None else task.cancelling()
            item = await agen.__anext__()
            if task is not None and task.cancelling() > before:
                raise asyncio.CancelledError(_LOST_CANCEL)
        else:
            item = await agen.__anext__()
    except StopAsyncIteration:
        _exit_all(call, gates, entered, None)
        raise
    except BaseException as exc:
        _exit_all(call, gates, entered, exc)
        raise
    _exit_all(call, gates, entered, None)
    return item


_LOST_CANCEL = "cancelled as the call finished (Python 3.11 wait_for)"

async def _anext_checked(agen: Any) -> Any:
    """``await agen.__anext__()``, raising the cancellation Python 3.11's ``wait_for`` can drop
    inside the generator (see :func:`_compile_run`)."""
    loop = running_loop()
    task = None if loop is None else current_task(loop)
    if task is None:
        return await agen.__anext__()
    before = task.cancelling()
    item = await agen.__anext__()
    if task.cancelling() > before:
        raise asyncio.CancelledError(_LOST_CANCEL)
    return item


def _anext_plain(agen: Any) -> Awaitable[Any]:
    return agen.__anext__()  # type: ignore[no-any-return]


_anext: Callable[[Any], Awaitable[Any]] = _anext_checked if PY311 else _anext_plain
"""A stream's first item: on 3.11 with the lost-cancellation check, else no extra frame."""
_CHECK_LOST_CANCEL = PY311
"""Whether :func:`next_item` checks each item read for a cancellation 3.11 lost (module-level so
a benchmark can switch it off to measure it)."""


async def _close(agen: Any) -> None:
    aclose = getattr(agen, "aclose", None)
    if aclose is not None:
        await aclose()


async def run_stream(
    root: Node, item_gates: tuple[Gate, ...], call: Call, *, record: bool = True
) -> AsyncIterator[Any]:
    """Drive a stream through the chain rooted at ``root`` (an async generator of its items).

    Before the first item, recoveries may retry or serve a fallback; after it, an error ends the
    stream (the commit point, gRPC's "committed" rule) and says how many items the caller had:
    ``items`` on ragguard's timeouts and deadline errors, a note on any other error, unless a
    layer set the head's ``resume`` (:class:`~ragguard.pipeline.Resumption`): then the layers
    inside that one are released with the error and its ``take_over`` may carry the stream on
    from the items handed over. Call- and attempt-scope gates hold until the stream ends, however
    it ends (exhausted, failed, closed early or cancelled) and exit once with that outcome.
    ``call.items`` counts the items handed over; the head's ``deliver`` hook, if any, runs before
    each is. ``call.ending`` says how the stream ended (:class:`ragguard.StreamEnding`), set
    before the layers it held exit, and kept in the request (``record``; a stream cut after its
    commit point is named in :func:`ragguard.degraded` too).
    """
    try:
        head = await root.open(call, item_gates)
    except BaseException as exc:
        _end(call, exc, record)
        raise
    outcome: BaseException | None = None
    outer = root.resume_gates  # item gates a continuation's items pass too
    taken = ""  # the continuation that carries the stream on, once one has
    after = 0
    cause = ""
    rest: Any = None
    try:
        if not head.done:
            deliver = head.deliver
            kept: list[Any] | None = None if head.resume is None else []
            try:
                if deliver is not None:
                    pending = deliver(head.first)
                    if pending is not None:
                        await pending
                call.items = 1
                if kept is not None:
                    kept.append(head.first)
                yield head.first
                agen = head.agen
                while True:
                    try:
                        item = await (next_item(call, agen, item_gates) if head.guarded else agen.__anext__())
                    except StopAsyncIteration:
                        break
                    if deliver is not None:
                        pending = deliver(item)
                        if pending is not None:
                            await pending
                    call.items += 1
                    if kept is not None:
                        kept.append(item)
                    yield item
            except Exception as exc:
                if kept is None or not call.items:
                    raise
                failed = await _release_inside(call, head, exc)
                take_over = partial(head.resume.take_over, call, failed, kept)  # type: ignore[union-attr]
                takeover = await (_gated(call, outer, take_over) if outer else take_over())
                del kept, take_over
                if takeover is None:
                    raise failed  # noqa: B904 - its own error, or the one a gate replaced it with
                taken, rest = takeover
                after, cause = call.items, ended_by(failed)
            if rest is not None:
                while True:
                    try:
                        item = await (next_item(call, rest, outer) if outer else rest.__anext__())
                    except StopAsyncIteration:
                        break
                    call.items += 1
                    yield item
    except BaseException as exc:
        outcome = exc
        if call.items and isinstance(exc, Exception):
            _committed(call, exc)
        raise
    finally:
        try:
            try:
                if rest is not None:
                    await _close(rest)
            finally:
                await _close(head.agen)
        finally:
            _end(call, outcome, record, taken, after, cause)
            # innermost node first; a consumer that stops early closes us with GeneratorExit, which
            # gates treat as a cancellation: released, nothing recorded
            for gates, tokens in head.held:
                _exit_all(call, gates, tokens, outcome)
            if record and outcome is not None and call.items and isinstance(outcome, Exception):
                mark_degraded(f"incomplete: {call.stage} after {_items(call.items)}")


async def _gated(call: Call, gates: tuple[Gate, ...], step: Callable[[], Awaitable[Any]]) -> Any:
    """``await step()`` inside ``gates`` (entered in order, exited innermost first with its outcome)."""
    entered: list[Any] = []
    try:
        for gate in gates:
            token = gate.enter(call)
            if token is WAIT:
                token = await gate.enter_async(call)
            entered.append(token)
        result = await step()
    except BaseException as exc:
        _exit_all(call, gates, entered, exc)
        raise
    _exit_all(call, gates, entered, None)
    return result


async def _release_inside(call: Call, head: Head, exc: Exception) -> Exception:
    """``exc`` ended the stream of ``head`` past its commit point and a layer may carry it on:
    close the stream and release the layers inside that one (``head.resume.inside``) with
    ``exc`` (a breaker counts it, a token meter settles); the others stay held. Returns ``exc``,
    or the error a gate replaced it with."""
    inside = {id(entry) for entry in head.resume.inside}  # type: ignore[union-attr]
    failed: BaseException = exc
    try:
        await _close(head.agen)
    finally:
        held: list[tuple[Sequence[Gate], list[Any]]] = []
        for entry in head.held:
            if id(entry) not in inside:
                held.append(entry)
                continue
            try:
                _exit_all(call, entry[0], entry[1], failed)
            except Exception as replaced:
                failed = replaced
        head.held = held
    return failed if isinstance(failed, Exception) else exc


def _items(n: int) -> str:
    return "1 item" if n == 1 else f"{n} items"


def _end(
    call: Call, outcome: BaseException | None, record: bool, taken: str = "", after: int = 0, cause: str = ""
) -> None:
    """Set (and ``record`` in the request) how ``call``'s stream ended (see
    :mod:`ragguard._endings`): ``taken`` names the continuation that carried it on after ``after``
    items, from an error named ``cause``."""
    if outcome is None:
        if taken:
            ending = StreamEnding("continued", call.stage, call.items, taken, after, cause)
        else:
            ending = StreamEnding("completed", call.stage, call.items)
    else:
        ending = StreamEnding("incomplete", call.stage, call.items, taken, after, ended_by(outcome))
    call.ending = ending
    if record:
        record_ending(ending)


_COMMITTED = "ragguard: stream of stage "


def _committed(call: Call, exc: Exception) -> None:
    """``exc`` ends ``call``'s stream after ``call.items`` items reached the caller: record the
    count on a ragguard timeout or deadline error (its ``items``), or in a note on any other
    (once: an exception raised again by another stream keeps its first note)."""
    if isinstance(exc, (DeadlineExceeded, StageTimeout)):
        if exc.items is None:
            exc.items = call.items
        return
    notes = getattr(exc, "__notes__", ())
    if len(notes) < 8 and not any(isinstance(n, str) and n.startswith(_COMMITTED) for n in notes):
        exc.add_note(
            f"{_COMMITTED}{call.stage!r:.80} failed after {call.items} item(s) had reached the caller "
            "(committed: no fallback or retry)"
        )


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
    nodes: list[Node] = []
    n: Node | None = root
    while n is not None:
        n.stream_gates = tuple(g for g in n.gates if g.scope != "item")
        item_gates.extend(g for g in n.gates if g.scope == "item")
        if getattr(n.wrapper, "resumes", False) and not root.resume_gates:
            root.resume_gates = tuple(item_gates)  # the node's gates stand outside its wrapper
        nodes.append(n)
        n = n.inner
    for n in reversed(nodes):  # innermost first: a node's run() calls its inner node's
        _compile_run(n)
    return root, tuple(item_gates)


def _compile_run(node: Node) -> None:
    """Write ``node.run`` (and ``node.runs``) for this node's shape, as dataclasses writes
    ``__init__``.

    Each gate becomes a nested ``try`` around the ones inside it (exactly as ``async with`` would
    nest them, without a context manager's calls): its ``enter`` before, its ``exit`` after, with
    the outcome, and a replacement error raised in place of the original. A generic loop over the
    gates cost three times as much per gate (measured by benchmarks/overhead.py), and a guarded call
    pays this on every call. The recoveries are written in too, innermost first (a recovery that
    raises hands its error to the next one out), each with an ``again`` that re-runs the node with
    itself and the outer ones left out: one function per number of recoveries left out
    (``runs[k]``), so a re-run carries no handler for recoveries it skips, and a failure reaches
    its recovery without a frame in between (benchmarks/failure_path.py). The code of the node
    inside (unless a wrapper stands between) is written in as well, so a call runs in one frame
    however many nodes its chain has (the observed chain's span gate is a node of its own). For a
    node with a fallback, a retry, two gates and the call, ``runs[0]`` (``run``) reads::

        async def run(call, skip=0):
            try:
                t0 = enter0(call)
                if t0 is WAIT:
                    t0 = await enter_async0(call)
                try:
                    ... gate 1, the same, around: result = await call.fn(*call.args, **call.kwargs)
                except BaseException as e0:
                    r0 = exit0(call, t0, e0)
                    if r0 is not None:
                        raise r0
                    raise
                r0 = exit0(call, t0, None)
                if r0 is not None:
                    raise r0
            except Exception as exc:
                if skip:
                    result = await recover(call, exc, skip)
                else:
                    left = True
                    try:
                        result = await recover1(call, exc, partial(run2, call))
                        left = False
                    except Exception as raised:
                        exc = raised
                    if left:
                        result = await recover0(call, exc, partial(run1, call))
            return result
    """
    n = len(node.recoveries)
    ns: dict[str, Any] = {
        "WAIT": WAIT,
        "partial": partial,
        "call_fn": call_fn,
        "running_loop": running_loop,
        "current_task": current_task,
        "CancelledError": asyncio.CancelledError,
        "recover": node._recover,
    }
    sources: list[str] = []
    for k in range(n, -1, -1):  # runs[n] first: runs[k] re-runs through runs[k + 1]
        name = "run" if k == 0 else f"run{k}"
        lines = [f"async def {name}(call, skip=0):" if k == 0 else f"async def {name}(call):"]
        lines += ["    " + line for line in _level(node, k, ns, "", top=k == 0)]
        lines.append("    return result")
        source = "\n".join(lines)
        exec(compile(source, f"<ragguard chain node: {_describe(node)}>", "exec"), ns)
        sources.append(source)
    node.runs = tuple(ns["run" if k == 0 else f"run{k}"] for k in range(n + 1))
    node.run = node.runs[0]
    node.source = "\n\n".join(reversed(sources))


def _level(node: Node, k: int, ns: dict[str, Any], p: str, *, top: bool = False) -> list[str]:
    """Lines that run ``node`` with its recoveries ``[k:]`` and leave the outcome in ``result``
    (see :func:`_compile_run`); ``p`` prefixes every name this node puts in ``ns`` and every local
    it uses, so a node written into another's code keeps its own. ``top``: the code of ``run``
    itself (the only one taking ``skip``)."""
    n = len(node.recoveries)
    for i, recovery in enumerate(node.recoveries):
        ns[f"{p}recover{i}"] = recovery.recover
        if p:  # a node written in: its re-runs are its own functions
            ns[f"{p}run{i + 1}"] = node.runs[i + 1]
    body = _gates(node, ns, p)
    if k == n:
        return body
    lines = ["try:", *("    " + line for line in body), f"except Exception as {p}exc:"]
    chain: list[str] = []
    if n - 1 > k:
        chain.append(f"{p}left = True")
    for i in range(n - 1, k - 1, -1):
        call = f"await {p}recover{i}(call, {p}exc, partial({p}run{i + 1}, call))"
        guard = i < n - 1  # an inner recovery ran before this one: only if it raised
        pad = "    " if guard else ""
        if guard:
            chain.append(f"if {p}left:")
        if i == k:
            chain.append(f"{pad}result = {call}")
        else:
            chain += [
                f"{pad}try:",
                f"{pad}    result = {call}",
                f"{pad}    {p}left = False",
                f"{pad}except Exception as {p}raised:",
                f"{pad}    {p}exc = {p}raised",
            ]
    if top:
        lines += [
            "    if skip:",
            f"        result = await recover(call, {p}exc, skip)",
            "    else:",
            *("        " + line for line in chain),
        ]
    else:
        lines += ["    " + line for line in chain]
    return lines


def _gates(node: Node, ns: dict[str, Any], p: str) -> list[str]:
    """The gates of ``node`` around its wrapper, inner node or call (see :func:`_compile_run`),
    as lines leaving the outcome in ``result``; the names it uses are put in ``ns``.

    A gate that says ``exits_none = False`` is exited only for a token other than None; when it
    is the node's last gate, the call inside it is written twice, once without the handler, for
    the token None (an untimed attempt pays no exception handler, on the failure path either)."""
    gates = node.gates
    for i, gate in enumerate(gates):
        ns[f"{p}enter{i}"], ns[f"{p}enter_async{i}"] = gate.enter, gate.enter_async
        ns[f"{p}exit{i}"] = gate.exit
    inside = _inside(node, ns, p)

    def around(i: int) -> list[str]:
        if i == len(gates):
            return inside
        gate, t = gates[i], f"{p}t{i}"
        lines = [f"{t} = {p}enter{i}(call)", f"if {t} is WAIT:", f"    {t} = await {p}enter_async{i}(call)"]
        body = around(i + 1)
        if not getattr(gate, "exits", True):
            return lines + body
        needs_none = getattr(gate, "exits_none", True)
        twice = not needs_none and i == len(gates) - 1
        guard = not (needs_none or twice)  # exit only for a token other than None
        pad = "    " if guard else ""
        handled = [
            "try:",
            *("    " + line for line in body),
            f"except BaseException as {p}e{i}:",
            *((f"    if {t} is not None:",) if guard else ()),
            f"    {pad}{p}r{i} = {p}exit{i}(call, {t}, {p}e{i})",
            f"    {pad}if {p}r{i} is not None:",
            f"    {pad}    raise {p}r{i}",
            "    raise",
            *((f"if {t} is not None:",) if guard else ()),
            f"{pad}{p}r{i} = {p}exit{i}(call, {t}, None)",
            f"{pad}if {p}r{i} is not None:",
            f"{pad}    raise {p}r{i}",
        ]
        if twice:
            return [
                *lines,
                f"if {t} is None:",
                *("    " + line for line in body),
                "else:",
                *("    " + line for line in handled),
            ]
        return lines + handled

    return around(0)


def _inside(node: Node, ns: dict[str, Any], p: str) -> list[str]:
    """What ``node``'s gates surround: its wrapper, the inner node's code, or the call."""
    lines: list[str] = []

    def innermost(statement: str) -> None:
        if not PY311:
            lines.append(statement)
            return
        # Python 3.11's asyncio.wait_for (redis-py wraps every command in it) drops a cancellation
        # that lands while the awaited call finishes in the same loop iteration (cpython
        # gh-86296): a cancellation requested during the call and not delivered is raised here.
        lines.extend([
            "task = call.task",
            "if task is None:",
            "    loop = running_loop()",
            "    task = call.task = None if loop is None else current_task(loop)",
            "before = 0 if task is None else task.cancelling()",
            statement,
            "if task is not None and task.cancelling() > before:",
            f"    raise CancelledError({_LOST_CANCEL!r})",
        ])  # fmt: skip

    inner = node.inner
    if node.wrapper is not None:
        ns[f"{p}around"] = node.wrapper.around
        if getattr(node.wrapper, "forks", False):  # proceed(call): the inner layers, for a record
            ns[f"{p}inner_run"] = run_call if inner is None else inner.run
            lines.append(f"result = await {p}around(call, {p}inner_run)")
        elif inner is None:  # the wrapper (chaos) awaits the call itself
            innermost(f"result = await {p}around(call, call_fn(call))")
        else:
            ns[f"{p}inner_run"] = inner.run
            lines.append(f"result = await {p}around(call, partial({p}inner_run, call))")
    elif inner is not None:  # the inner node's own code, written in (see _compile_run)
        lines.extend(_level(inner, 0, ns, f"{p}n{len(p) // 3 + 1}_"))
    else:
        innermost("result = await call.fn(*call.args, **call.kwargs)")
    return lines


def _describe(node: Node) -> str:
    parts = [type(r).__name__ for r in node.recoveries] + [type(g).__name__ for g in node.gates]
    if node.wrapper is not None:
        parts.append(type(node.wrapper).__name__)
    return " > ".join(parts) or "call"


def _descend(node: Node) -> Node:
    child = Node()
    node.inner = child
    return child
