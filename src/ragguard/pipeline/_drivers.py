"""The two drivers that run a chain of layers: one for calls, one for streams.

A chain (outermost layer first) is put together once into nodes. A node holds the recoveries
that surround it, then the gates it enters in order, then either a wrapper around the next node,
the next node, or the call itself::

    [observe gate] -> [fallback | deadline, quota gates] -> [retry | breaker, timeout gates]
        -> chaos wrapper -> the call

:meth:`Node.drive` is the whole call driver: a loop entering the node's gates, the step inside
them, a loop exiting them innermost first, and a loop over its recoveries, innermost first. A
call runs in one coroutine frame per node (the full stack is one node: its gates sit inside its
recoveries), and a gate costs a method call on the way in and one on the way out. A chain runs
the same steps written out per node (:mod:`ragguard.pipeline._compiled`) while the loop costs more
than a tenth of a guarded call (:data:`GENERATED`). The stream
driver walks the same nodes and calls the same layer objects (see :mod:`ragguard.pipeline._contract`
for what each shape does on a stream), so a call and a stream cannot be guarded differently.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from .. import outcomes
from .._compat import PY311, current_task, running_loop
from .._context import mark_degraded
from .._endings import StreamEnding, ended_by, record_ending
from .._errors import DeadlineExceeded, StageTimeout
from ..outcomes import Outcome
from ..outcomes._classify import RECORDED
from ._compiled import compiled_run
from ._contract import NO_EXIT, WAIT, Call, Gate, Recovery, Resumption, Wrapper

__all__ = ["Head", "Node", "call_fn", "compile_chain", "run_stream"]

Classifier = Callable[[BaseException], Outcome]
"""A chain's outcome classifier: its Guard's (:attr:`ragguard.pipeline.BuildContext.classify`)."""


class Node:
    """Recoveries, then gates, then a wrapper or the next node or the call (see module docstring)."""

    __slots__ = (
        "classify", "forks", "gates", "inner", "recoveries", "resume_gates", "run", "stream_gates", "wrapper",
    )

    def __init__(self, classify: Classifier) -> None:
        self.classify = classify  # the chain's (its Guard's) outcome classifier
        self.recoveries: tuple[Recovery, ...] = ()
        self.gates: tuple[Gate, ...] = ()
        self.wrapper: Wrapper | None = None
        self.forks = False  # the wrapper runs the inner layers with records of its own
        self.inner: Node | None = None
        self.stream_gates: tuple[Gate, ...] = ()  # the call/attempt-scope gates, for streams
        # (the root's) the item gates outside a wrapper that ``resumes`` a stream: what a
        # continuation's items still pass (a stage's deadline share)
        self.resume_gates: tuple[Gate, ...] = ()
        self.run: Callable[..., Awaitable[Any]] = self.drive
        """``await node.run(call, skip=0)``: :meth:`drive`, or the same written out for this node's
        gates (:mod:`ragguard.pipeline._compiled`, while :data:`GENERATED`)."""

    # -- calls ----------------------------------------------------------------------------------

    async def drive(self, call: Call, skip: int = 0) -> Any:
        """Run this node and the ones inside it once; recoveries ``[skip:]`` handle a failure.

        The gates are entered outermost first and exited innermost first, each once per ``enter``
        that did not answer :data:`NO_EXIT`, with the outcome: a gate's replacement error is what
        the gates outside it, the recoveries and the caller see. A failure (an ``Exception``) then
        goes to the innermost recovery first; one that raises hands its error to the next one out,
        and a recovery's ``again`` re-runs this node with itself and those outside it skipped.
        Every error is classified once, before the first layer is handed it, and every error that
        leaves the node has been (:func:`_classified`): its outcome is on the call and on it.

        One exception handler for all of it: in CPython 3.11 each handler an error is caught by
        and raised again from costs about as much as the raise itself, and the failure path pays
        it per attempt (benchmarks/failure_path.py)."""
        held: list[tuple[Gate, Any]] = []  # the gates entered whose exit must run, with their tokens
        try:
            for gate in self.gates:
                token = gate.enter(call)
                if token is WAIT:
                    token = await gate.enter_async(call)
                if token is not NO_EXIT:
                    held.append((gate, token))
            inner, wrapper = self.inner, self.wrapper
            if inner is None and not self.forks:  # the attempt itself: the function, or a wrapper around it
                if _CHECK_LOST_CANCEL:
                    # Python 3.11's asyncio.wait_for (redis-py wraps every command in it) drops a
                    # cancellation that lands while the awaited call finishes in the same loop
                    # iteration (cpython gh-86296): one asked for during the call and not
                    # delivered is raised here
                    task = call.task
                    if task is None:
                        loop = running_loop()
                        task = call.task = None if loop is None else current_task(loop)
                    before = 0 if task is None else task.cancelling()
                    if wrapper is None:
                        result = await call.fn(*call.args, **call.kwargs)
                    else:
                        result = await wrapper.around(call, call_fn(call))
                    if task is not None and task.cancelling() > before:
                        raise asyncio.CancelledError(_LOST_CANCEL)
                elif wrapper is None:
                    result = await call.fn(*call.args, **call.kwargs)
                else:
                    result = await wrapper.around(call, call_fn(call))
            elif wrapper is None:
                result = await inner.run(call)  # type: ignore[union-attr]
            elif self.forks:  # proceed(record), see Wrapper
                result = await wrapper.around(call, run_call if inner is None else inner.run)
            else:
                result = await wrapper.around(call, partial(inner.run, call))  # type: ignore[union-attr]
            while held:  # innermost first; an error a gate puts in place of the success is raised
                gate, token = held.pop()  # here, for the gates outside it (still held) to exit with
                replaced = gate.exit(call, token, None)
                if replaced is not None:
                    raise replaced
            return result
        except BaseException as exc:
            # No name of this frame may keep the error it raises or hands on: the error's traceback
            # holds the frame, and the two would be a reference cycle only the collector frees.
            replaced = None
            error: Any = exc
            _classified(call, exc, self.classify)
            while held:  # the gates entered exit innermost first, each seeing what those inside left
                gate, token = held.pop()
                replaced = gate.exit(call, token, error)
                if replaced is not None:
                    error = replaced
                    _classified(call, error, self.classify)
            recoveries = self.recoveries
            i = len(recoveries)
            if i <= skip or not isinstance(error, Exception):  # a cancellation is never recovered
                if error is exc:
                    error = replaced = None
                    raise
                exc, error, replaced = error, None, None  # ``exc`` is cleared as it leaves the block
                raise exc
            while True:  # the innermost recovery first; one that raises hands its error outward
                i -= 1
                recovering = recoveries[i].recover(call, error, partial(self.run, call, i + 1))
                error = replaced = None
                try:
                    return await recovering
                except Exception as raised:
                    _classified(call, raised, self.classify)  # (known: the error handed in, or again's)
                    if i == skip:
                        raise
                    error = raised

    # -- streams --------------------------------------------------------------------------------

    async def open(self, call: Call, item_gates: tuple[Gate, ...], skip: int = 0) -> Head:
        """Open the stream through this node and the ones inside it, up to its first item.

        Every gate of the node is entered at its place, as for a call, so the opening (wrappers
        included: a chaos latency, a slow first token) is bounded by the item gates (the attempt
        timer) exactly as a call is. Once the first item is there the item gates exit and the
        call and attempt gates are held until the stream ends. ``item_gates`` (those of the whole
        chain) bound each later item."""
        gates: list[Gate] = []
        tokens: list[Any] = []
        try:
            try:
                for gate in self.gates:
                    token = gate.enter(call)
                    if token is WAIT:
                        token = await gate.enter_async(call)
                    if token is not NO_EXIT:
                        gates.append(gate)
                        tokens.append(token)
                inner, wrapper = self.inner, self.wrapper
                head: Head
                if wrapper is not None:
                    proceed: Callable[..., Awaitable[Head]]
                    if self.forks:  # proceed(call), see Wrapper
                        proceed = partial(_open_call, inner, item_gates)
                    else:
                        proceed = _open_fn(call) if inner is None else partial(inner.open, call, item_gates)
                    head = await wrapper.around(call, proceed)
                elif inner is not None:
                    head = await inner.open(call, item_gates)
                else:
                    head = await _open_fn(call)()
            except BaseException as exc:
                _exit_all(call, gates, tokens, exc, self.classify)
                raise
            if all(gate.scope != "item" for gate in gates):
                head.held.append((gates, tokens))
            else:
                await _hold(call, gates, tokens, head, self.classify)
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
                    _classified(call, raised, self.classify)
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


def _classified(call: Call, exc: BaseException, classify: Classifier) -> None:
    """Put ``exc``'s outcome on the call (``outcome``: what the layers read), classifying it with
    the chain's ``classify`` unless a chain did already (an error handed on from the layers inside,
    or from a guarded call inside this one) and recording it on the error (what the breakers'
    classifiers and the front doors read, :func:`ragguard.outcomes.outcome_of`)."""
    outcome = getattr(exc, RECORDED, None)
    if type(outcome) is not Outcome:
        outcome = classify(exc)
        exc.__dict__[RECORDED] = outcome
    call.outcome = outcome


def _exit_all(
    call: Call, gates: Sequence[Gate], tokens: list[Any], exc: BaseException | None, classify: Classifier
) -> None:
    """Exit the held ``gates`` (with their ``tokens``), innermost first, with ``exc`` (None:
    success), each seeing what the gates inside it left; raise the error a gate put in its place."""
    if exc is not None:
        _classified(call, exc, classify)
    err = exc
    for i in range(len(tokens) - 1, -1, -1):
        replaced = gates[i].exit(call, tokens[i], err)
        if replaced is not None:
            err = replaced
            _classified(call, err, classify)
    if err is not exc and err is not None:
        raise err


async def _hold(
    call: Call, gates: Sequence[Gate], tokens: list[Any], head: Head, classify: Classifier
) -> None:
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
                _classified(call, err, classify)
    if err is None:
        head.held.append((held_gates, held_tokens))
        return
    try:
        await _close(head.agen)
    finally:
        try:
            for inner_gates, inner_tokens in head.held:  # the nodes inside, innermost first
                _exit_all(call, inner_gates, inner_tokens, err, classify)
        finally:
            _exit_all(call, held_gates, held_tokens, err, classify)
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


async def next_item(call: Call, agen: Any, gates: tuple[Gate, ...], classify: Classifier) -> Any:
    """The stream's next item through the item-scope ``gates`` (StopAsyncIteration at the end)."""
    held: list[Gate] = []
    tokens: list[Any] = []
    try:
        for gate in gates:
            token = gate.enter(call)
            if token is WAIT:
                token = await gate.enter_async(call)
            if token is not NO_EXIT:
                held.append(gate)
                tokens.append(token)
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
        _exit_all(call, held, tokens, None, classify)
        raise
    except BaseException as exc:
        _exit_all(call, held, tokens, exc, classify)
        raise
    _exit_all(call, held, tokens, None, classify)
    return item


_LOST_CANCEL = "cancelled as the call finished (Python 3.11 wait_for)"

async def _anext_checked(agen: Any) -> Any:
    """``await agen.__anext__()``, raising the cancellation Python 3.11's ``wait_for`` can drop
    inside the generator (see :meth:`Node.drive`)."""
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
    classify = root.classify
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
                        if head.guarded:
                            item = await next_item(call, agen, item_gates, classify)
                        else:
                            item = await agen.__anext__()
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
                failed = await _release_inside(call, head, exc, classify)
                takeover = await _take_over(call, head, outer, failed, kept, classify)
                if takeover is None:
                    raise failed  # noqa: B904 - its own error, or the one a gate replaced it with
                taken, rest = takeover
                after, cause = call.items, ended_by(failed)
            while rest is not None:
                try:
                    item = await (next_item(call, rest, outer, classify) if outer else rest.__anext__())
                except StopAsyncIteration:
                    break
                except Exception as exc:
                    # the continuation failed past its own first item: the next one may carry on
                    failing, rest = rest, None
                    await _close(failing)  # its own layers settle
                    takeover = await _take_over(call, head, outer, exc, kept, classify)  # type: ignore[arg-type]
                    if takeover is None:
                        raise
                    taken, rest = takeover
                    after, cause = call.items, ended_by(exc)
                    continue
                call.items += 1
                kept.append(item)  # type: ignore[union-attr]
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
                _exit_all(call, gates, tokens, outcome, classify)
            if record and outcome is not None and call.items and isinstance(outcome, Exception):
                mark_degraded(f"incomplete: {call.stage} after {_items(call.items)}")


async def _take_over(
    call: Call, head: Head, outer: tuple[Gate, ...], failed: Exception, kept: list[Any], classify: Classifier
) -> tuple[str, Any] | None:
    """The head's resumption carrying ``call``'s stream on after ``failed``, from the items
    ``kept`` (what the caller has), inside the ``outer`` item gates; None: nothing carries it on."""
    take_over = partial(head.resume.take_over, call, failed, kept)  # type: ignore[union-attr]
    return await (_gated(call, outer, take_over, classify) if outer else take_over())


async def _gated(
    call: Call, gates: tuple[Gate, ...], step: Callable[[], Awaitable[Any]], classify: Classifier
) -> Any:
    """``await step()`` inside ``gates`` (entered in order, exited innermost first with its outcome)."""
    entered: list[Gate] = []
    tokens: list[Any] = []
    try:
        for gate in gates:
            token = gate.enter(call)
            if token is WAIT:
                token = await gate.enter_async(call)
            if token is not NO_EXIT:
                entered.append(gate)
                tokens.append(token)
        result = await step()
    except BaseException as exc:
        _exit_all(call, entered, tokens, exc, classify)
        raise
    _exit_all(call, entered, tokens, None, classify)
    return result


async def _release_inside(call: Call, head: Head, exc: Exception, classify: Classifier) -> Exception:
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
                _exit_all(call, entry[0], entry[1], failed, classify)
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


def compile_chain(
    layers: Sequence[Any], classify: Classifier = outcomes.classify
) -> tuple[Node, tuple[Gate, ...]]:
    """The root node for ``layers`` (outermost first; see the module docstring) and the item-scope
    gates of the whole chain, outermost first (what each item of a stream passes through).
    ``classify``: what the dependency said (the Guard's classifier), asked once per error."""
    root = node = Node(classify)
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
            node.forks = bool(getattr(layer, "forks", False))
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
    if GENERATED:
        for n in reversed(nodes):  # innermost first: a node's code calls the run of the one inside
            steps: dict[str, Callable[..., Any]] = {
                "classified": _classified, "call_fn": call_fn, "run_call": run_call,
            }  # fmt: skip
            n.run = compiled_run(n, steps, _LOST_CANCEL if _CHECK_LOST_CANCEL else None)
    return root, tuple(item_gates)


GENERATED = True
"""Whether chains run :meth:`Node.drive` written out per node (:mod:`ragguard.pipeline._compiled`)
rather than the loop itself: read when a chain is put together (module-level so a benchmark
measures both)."""


def _descend(node: Node) -> Node:
    child = Node(node.classify)
    node.inner = child
    return child
