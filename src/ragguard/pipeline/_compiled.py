""":meth:`Node.drive <ragguard.pipeline._drivers.Node.drive>` with its gate loops unrolled, for one
node: the call driver a chain runs, while the plain loop costs more than a tenth of a guarded call.

The plain driver is the reference: it says what a node does, and this module writes the same steps
for a node's own gates, as ``dataclasses`` writes an ``__init__``: each gate's ``enter`` and ``exit``
become straight-line code around the step inside, under the one exception handler, with the same
recoveries loop. One step is its own: when the node's innermost recovery ``repeats`` (the retry
layer), its loop runs in the node's frame (:func:`compiled_run`), where ``Node.drive`` awaits its
``recover``: the same decisions (``recover`` asks the same ``next_wait``), without a frame and a
re-raise per attempt (the failure path: 26.6 -> 24.4 us for 3 attempts of the full stack).
The error of an attempt is classified as ``Node.drive`` does it, with one look-up first: an
error of a type whose outcome ragguard's classifier knows by its type alone (a refused connection)
and carrying no attribute of its own gets that outcome at once (``plain_outcomes``: 24.4 -> 23.2
us, the retry stage 12.2 -> 11.5 us).
And a node of one gate and no recovery around a written-out node (the observe layer outside a stage's
recoveries, with a listener) is written into that node (:data:`_OUTER`): one coroutine per call
where ``await inner_run(call)`` made two (overhead.py, full stack + listener: 1.06-1.07x of
9b27c28 before, 0.99-1.03x after).
Nothing else differs; tests/pipeline runs its driver tests against both, and
``benchmarks/overhead.py`` measures both in every run (``_drivers.GENERATED`` switches). In CPython
3.11 a loop over a node's gates cost 9-14% of a guarded call (nothing configured 1.10x, the failure
path 1.14x, the full stack 1.09x); when it costs less than 10%, this module goes. For a node with
two gates inside its recoveries, the code reads::

    async def run(call, skip=0):
        entered = 0
        try:
            t0 = enter0(call)
            if t0 is WAIT:
                t0 = await enter_async0(call)
            entered = 1
            t1 = enter1(call)
            ...
            entered = 2
            result = await call.fn(*call.args, **call.kwargs)    # or the wrapper, or the next node
            entered = 1
            if t1 is not NO_EXIT:
                replaced = exit1(call, t1, None)
                if replaced is not None:
                    raise replaced
            entered = 0
            ... gate 0 the same
            return result
        except BaseException as exc:
            ... Node.drive's handler, each gate's exit written out: ``if entered > 1 and t1 is not
            NO_EXIT:``
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any, Protocol

from .._compat import current_task, running_loop
from ..outcomes import Outcome
from ..outcomes._classify import RECORDED, plain_outcomes
from ._contract import NO_EXIT, WAIT, Gate, Recovery, Wrapper


class Node(Protocol):
    """What this module reads of a chain node (:class:`ragguard.pipeline._drivers.Node`, which
    imports this module: the shape is named here, so the two do not import each other)."""

    classify: Callable[[BaseException], Outcome]
    gates: tuple[Gate, ...]
    recoveries: tuple[Recovery, ...]
    wrapper: Wrapper | None
    forks: bool
    inner: Any


__all__ = ["compiled_run"]

_RAISE = """\
if error is exc:
    error = replaced = None
    raise
exc, error, replaced = error, None, None
raise exc"""
"""The error leaves the node: ``exc`` itself as it is, or what replaced it (``exc`` is cleared as it
leaves the handler)."""

_HANDLER = """\
except BaseException as exc:
    replaced = None
    error = exc
    recorded = exc.__dict__  # classified(call, exc, classify), inlined:
    outcome = plain.get(type(exc)) if not recorded else None  # a plain OSError's outcome at once
    if outcome is None:
        outcome = recorded.get(RECORDED)
        if type(outcome) is not Outcome:
            outcome = classify(exc)
    recorded[RECORDED] = outcome
    call.outcome = outcome
{exits}
{first}
    i = n_recoveries
    if i <= skip or not isinstance(error, Exception):
{raise_}
{recover}"""
"""Node.drive's handler (see it for why each line is there), with ``{exits}`` written per gate and
``{recover}`` the recoveries' loop (:data:`_RECOVER`, or :data:`_REPEAT` around it; then
``{first}`` is :data:`_FIRST`)."""

_RECOVER = """\
while True:
    i -= 1
    recovering = recoveries[i].recover(call, error, partial(self_run, call, i + 1))
    error = replaced = None
    try:
        return await recovering
    except Exception as raised:
        classified(call, raised, classify)
        if i == skip:
            raise
        error = raised"""

_REPEAT = """\
try:
    wait = next_wait(call, error, attempt)
except Exception as raised:  # for the recoveries outside it, as one its recover() raised
    classified(call, raised, classify)
    wait, error = None, raised
if wait is None:
    first = None
    i -= 1  # not repeated: the recoveries outside it, as if its recover() had raised the error
    if i == skip:
{raise_}
{recover}
error = replaced = None"""
"""The innermost recovery repeats: its decision in the handler; a wait leaves the handler for the
sleep and the next turn of the node's loop (see :func:`compiled_run`)."""

_FIRST = """\
    if first is None:
        first = exc
    elif exc.__context__ is None and exc is not first:
        exc.__context__ = first"""
"""A later attempt's error has the first one as its context, as when ``recover`` ran the attempt
inside the handler of the first (``first`` is let go of before the error leaves the frame)."""

_SLEEP = """\
try:
    await sleep(wait)
except BaseException as exc:  # what raises in the wait is what its recover() would have raised
    if exc.__context__ is None and exc is not first:
        exc.__context__ = first
    first = None
    i = n_recoveries - 1
    if i == skip or not isinstance(exc, Exception):
        raise
    classified(call, exc, classify)
    error = exc
{recover}
attempt += 1
call.attempt += 1"""
"""The wait before the next attempt: a cancellation or an error in it leaves as one from the
repeating recovery's ``recover`` would (for the recoveries outside it, the first error its
context)."""


_OUTER = """\
outer = NO_EXIT
failed = False
try:
    outer = oenter(call)
    if outer is WAIT:
        outer = NO_EXIT
        outer = await oenter_async(call)
    skip = 0  # the node inside runs as ``inner_run(call)`` would: from its innermost recovery
{inside}
except BaseException as outer_exc:  # Node.drive's handler for the one gate, no recoveries
    failed = True
    classified(call, outer_exc, classify)
    if outer is not NO_EXIT:
        outer_error = oexit(call, outer, outer_exc)
        if outer_error is not None:
            classified(call, outer_error, classify)
            outer_exc, outer_error = outer_error, None
            raise outer_exc
    raise
finally:
    if not failed and outer is not NO_EXIT:  # the node inside returned: the gate exits with success
        try:
            outer_error = oexit(call, outer, None)
        except BaseException as outer_exc:
            classified(call, outer_exc, classify)
            raise
        if outer_error is not None:
            classified(call, outer_error, classify)
            try:
                raise outer_error
            finally:
                outer_error = None  # (no name of the frame keeps the error its traceback holds)"""
"""A node of one gate and no recovery around a written-out node (``{inside}``, its body): both in
one frame. Every ``return`` of the body inside passes the ``finally``, which exits the gate with
success (an error it puts in place of the result is raised there, as Node.drive raises it)."""


def compiled_run(
    node: Node, steps: Mapping[str, Callable[..., Any]], lost_cancel: str | None
) -> Callable[..., Awaitable[Any]]:
    """``node.drive`` written out for ``node``'s gates (see the module docstring). ``steps``: the
    drivers' own ``classified``, ``call_fn`` and ``run_call``; ``lost_cancel``: the message of the
    cancellation the attempt raises when Python 3.11 lost one, None for no check.

    When the node's innermost recovery ``repeats`` (see :class:`~ragguard.pipeline.Recovery`: the
    retry layer), its loop is written in too: the node's steps run in a ``while`` loop, and a
    failed attempt asks ``next_wait`` in the handler; a wait leaves the handler, sleeps, raises
    ``call.attempt`` and goes round again, where ``await recover(...)`` would run the node once
    more in a frame of its own per attempt (and the error back up through it)."""
    body, ns, names = _written(node, steps, lost_cancel)
    source = "async def run(call, skip=0):\n" + "\n".join("    " + line for line in body) + "\n"
    exec(compile(source, f"<ragguard chain node: {names}>", "exec"), ns)
    run: Callable[..., Awaitable[Any]] = ns["run"]
    # a recovery's ``again``: this node once more, with fewer recoveries (written in, the node inside's own)
    ns.setdefault("self_run", run)
    run.__ragguard_source__ = source  # type: ignore[attr-defined]  # for reading in a debugger
    return run


def _written(
    node: Node, steps: Mapping[str, Callable[..., Any]], lost_cancel: str | None
) -> tuple[list[str], dict[str, Any], str]:
    """The lines of ``node``'s ``run`` under its ``def``, the names they read, and the names of its
    layers (for the code's file name). A node of one gate and no recovery around a written-out node
    (the observe layer, outside a stage's recoveries) writes the node inside in too, from that node
    itself (:data:`_OUTER`): one coroutine where ``await inner_run(call)`` made two."""
    gates, n = node.gates, len(node.gates)
    inner = node.inner
    if (
        n == 1 and not node.recoveries and node.wrapper is None
        and inner is not None and hasattr(inner.run, "__ragguard_source__")
    ):  # fmt: skip
        inner_body, inner_ns, inner_names = _written(inner, steps, lost_cancel)
        inner_ns.setdefault("self_run", inner.run)  # a recovery's ``again`` inside: that node once more
        gate = gates[0]
        inner_ns.update(oenter=gate.enter, oenter_async=gate.enter_async, oexit=gate.exit)
        outer = _OUTER.format(inside=_indent("\n".join(inner_body), 4)).splitlines()
        return outer, inner_ns, f"{type(gate).__name__} > {inner_names}"
    ns: dict[str, Any] = {
        **steps,
        "WAIT": WAIT,
        "NO_EXIT": NO_EXIT,
        "partial": partial,
        "classify": node.classify,
        "recoveries": node.recoveries,
        "n_recoveries": len(node.recoveries),
        "running_loop": running_loop,
        "current_task": current_task,
        "CancelledError": asyncio.CancelledError,
        "RECORDED": RECORDED,
        "Outcome": Outcome,
        "plain": plain_outcomes(node.classify),
    }
    body = ["entered = 0", "try:"]
    for i, gate in enumerate(gates):
        ns[f"enter{i}"], ns[f"enter_async{i}"], ns[f"exit{i}"] = gate.enter, gate.enter_async, gate.exit
        body += [
            f"    t{i} = enter{i}(call)",
            f"    if t{i} is WAIT:",
            f"        t{i} = await enter_async{i}(call)",
            f"    entered = {i + 1}",
        ]
    body += ["    " + line for line in _inside(node, ns, lost_cancel)]
    for i in range(n - 1, -1, -1):
        body += [
            f"    entered = {i}",
            f"    if t{i} is not NO_EXIT:",
            f"        replaced = exit{i}(call, t{i}, None)",
            "        if replaced is not None:",
            "            raise replaced",
        ]
    body.append("    return result")
    exits = []
    for i in range(n - 1, -1, -1):
        exits += [
            f"    if entered > {i} and t{i} is not NO_EXIT:",
            f"        replaced = exit{i}(call, t{i}, error)",
            "        if replaced is not None:",
            "            error = replaced",
            "            classified(call, error, classify)",
        ]
    repeater = node.recoveries[-1] if node.recoveries else None
    repeats = bool(getattr(repeater, "repeats", False))
    recover, first, raise_ = _indent(_RECOVER, 4), "", _indent(_RAISE, 8)
    if repeats:
        ns["next_wait"], ns["sleep"] = repeater.next_wait, repeater.sleep  # type: ignore[union-attr]
        recover = _indent(_REPEAT.format(raise_=raise_, recover=_indent(_RECOVER, 4)), 4)
        raise_ = _indent("first = None\n" + _RAISE, 8)
        first = _FIRST
    exits_source = "\n".join(exits) or "    pass"
    handler = _HANDLER.format(exits=exits_source, first=first, raise_=raise_, recover=recover)
    body += [line for line in handler.splitlines() if line]
    if repeats:
        body = ["attempt = 1", "first = None", "while True:", *("    " + line for line in body)]
        body += _indent(_SLEEP.format(recover=_indent(_RECOVER, 4)), 4).splitlines()
    names = " > ".join(type(layer).__name__ for layer in (*node.recoveries, *gates)) or "call"
    return body, ns, names


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line for line in text.splitlines())


def _inside(node: Node, ns: dict[str, Any], lost_cancel: str | None) -> list[str]:
    """The step inside the gates, as :meth:`Node.drive` takes it, for this node's shape only."""
    inner, wrapper = node.inner, node.wrapper
    if wrapper is not None:
        ns["around"] = wrapper.around
    if inner is not None:
        ns["inner_run"] = inner.run
    if inner is None and not node.forks:  # the attempt itself: the function, or a wrapper around it
        step = (
            "result = await call.fn(*call.args, **call.kwargs)"
            if wrapper is None
            else "result = await around(call, call_fn(call))"
        )
        if lost_cancel is None:
            return [step]
        return [  # the lost-cancellation check of Node.drive
            "task = call.task",
            "if task is None:",
            "    loop = running_loop()",
            "    task = call.task = None if loop is None else current_task(loop)",
            "before = 0 if task is None else task.cancelling()",
            step,
            "if task is not None and task.cancelling() > before:",
            f"    raise CancelledError({lost_cancel!r})",
        ]
    if wrapper is None:
        return ["result = await inner_run(call)"]
    if node.forks:
        ns["proceed"] = ns["run_call"] if inner is None else inner.run
        return ["result = await around(call, proceed)"]
    return ["result = await around(call, partial(inner_run, call))"]
