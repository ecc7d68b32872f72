"""Cost of a guarded call beside main before issue 30 (or another commit); then the happy path beside
the pre-redesign code, peers and floors, in one interleaved run; then the same at 1, 100 and 10,000
calls in flight.

    .venv/bin/python benchmarks/overhead.py [--ops 2000] [--rounds 25] [--against 9b27c28] [--against-only]

CPU time of the event loop's thread per call (``time.thread_time_ns``: time the process was
descheduled on the shared machine is not counted), median over rounds, contenders interleaved
round by round (see ``_bench``). "Full stack" is defined in ``_stacks``, the failure path (3 refused
attempts through the full stack) in ``failure_path``. The "before" rows of section 0 run the commit
given to ``--against`` (main before issue 30, 9b27c28, unless told) and the pre-redesign rows commit
ba06c64's ``Stage``, each extracted at run time (see ``_baseline``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import _baseline
import _bench
import _stacks
import failure_path
import ragguard
from _bench import Contender, Target
from ragguard import events
from ragguard.breakers._outcome import BreakerCallOutcome
from ragguard.events import bus
from ragguard.pipeline import _drivers


def _event_inits() -> tuple[Callable[[], None], Callable[[], None]]:
    """Switches for the ``__init__`` of the events made on every observed call: ``plain()`` gives
    them the one ``dataclasses`` writes (``object.__setattr__`` per field, as any frozen dataclass),
    ``quick()`` puts back ``events.quick_init``'s."""
    classes = [events.StageCompleted, events.CallOutcome, BreakerCallOutcome]
    quick = {cls: cls.__init__ for cls in classes}
    plain = {}
    for cls in classes:
        twin = dataclasses.make_dataclass(
            cls.__name__,
            [(f.name, Any, dataclasses.field(default=f.default)) if f.default is not dataclasses.MISSING
             else (f.name, Any) for f in dataclasses.fields(cls)],
            frozen=True, slots=True,
        )  # fmt: skip
        plain[cls] = twin.__init__  # object.__setattr__ per field: works on an instance of ``cls``

    def use_plain() -> None:
        for cls, init in plain.items():
            cls.__init__ = init  # type: ignore[misc]

    def use_quick() -> None:
        for cls, init in quick.items():
            cls.__init__ = init  # type: ignore[misc]

    return use_plain, use_quick


async def against_commit(ops: int, rounds: int, before: Any, commit: str) -> list[Target]:
    """The full stack, a stage with nothing configured and the failure path, each beside the same
    thing built from ``commit``'s code (``before``), in one run: no worse than before (<= 1.05x).
    And the two places where ragguard writes code and runs it with ``exec``, each against the plain
    version in the same run (each stays only while the plain one costs over 10%): the call driver
    written out per node against ``Node.drive``'s loop (``_drivers.GENERATED``), and the events'
    ``quick_init`` against the ``__init__`` ``dataclasses`` writes."""
    _, full = _stacks.full_stack_guard(ragguard)
    _, old_full = _stacks.full_stack_guard(before)
    failing, _ = failure_path._stage(ragguard, full=True)
    old_failing, _ = failure_path._stage(before, full=True)
    _, listened = _stacks.full_stack_guard(ragguard)  # its own Guards: the observed chains
    _, old_listened = _stacks.full_stack_guard(before)
    listening: list[Callable[[], None]] = []

    plain_events, quick_events = _event_inits()
    _drivers.GENERATED = False  # the chains of these Guards run the plain loop (read as they are built)
    try:
        _, full_plain = _stacks.full_stack_guard(ragguard)
        nothing_plain = _stacks.nothing_configured(ragguard)
        failing_plain, _ = failure_path._stage(ragguard, full=True)
    finally:
        _drivers.GENERATED = True

    def listen() -> None:
        quick_events()
        if not listening:
            listening.append(bus.subscribe(lambda event: None))
            listening.append(importlib.import_module(f"{before.__name__}.events").bus.subscribe(lambda e: None))

    def listen_plain() -> None:
        listen()
        plain_events()

    def quiet() -> None:
        quick_events()
        while listening:
            listening.pop()()

    pairs = [
        ("full stack", "the full stack (see _stacks)", full, old_full, quiet),
        ("nothing configured", "a stage with no layer configured", _stacks.nothing_configured(ragguard),
         _stacks.nothing_configured(before), quiet),
        ("failure path", "the full stack, 3 refused attempts (see failure_path)", failing, old_failing, quiet),
        ("full stack + listener", "the full stack, one event listener subscribed", listened, old_listened,
         listen),
    ]  # fmt: skip
    contenders = []
    for name, does, ours, theirs, setup in pairs:
        contenders.append(Contender(f"ragguard {name}", does, ours, setup=setup))
        contenders.append(Contender(f"{commit} {name}", f"commit {commit}, the same", theirs, setup=setup))
    contenders.append(Contender("ragguard full stack + listener, plain event __init__",
                                "the same, events built by the dataclass __init__", listened, setup=listen_plain))
    plain_drivers = [("full stack", full_plain), ("nothing configured", nothing_plain), ("failure path", failing_plain)]
    for name, body in plain_drivers:
        contenders.append(Contender(f"ragguard {name}, plain driver", "the same, Node.drive's loop", body,
                                    setup=quiet))
    results = await _bench.run_async(contenders, ops=ops, rounds=rounds)
    quiet()
    _bench.print_table(results, f"0. against commit {commit}", unit="call")
    targets = [
        _bench.ratio_target(results, f"{name} vs {commit}", f"ragguard {name}", f"{commit} {name}", 1.05)
        for name, *_ in pairs
    ]
    targets.append(_bench.ratio_target(
        results, "events: plain dataclass __init__ vs quick_init (GAP keeps the generated one)",
        "ragguard full stack + listener, plain event __init__", "ragguard full stack + listener", 1.10,
    ))  # fmt: skip
    for name, _ in plain_drivers:
        targets.append(_bench.ratio_target(
            results, f"{name}: plain driver vs written out (GAP keeps the generated one)",
            f"ragguard {name}, plain driver", f"ragguard {name}", 1.10,
        ))  # fmt: skip
    return targets


async def happy_path(ops: int, rounds: int, old: Any) -> list[Target]:
    _, full = _stacks.full_stack_guard(ragguard)
    _, full_listened = _stacks.full_stack_guard(ragguard)  # its own Guard: the observed chain
    listening: list[Callable[[], None]] = []

    def listen() -> None:
        if not listening:
            listening.append(bus.subscribe(lambda event: None))

    def quiet() -> None:
        while listening:
            listening.pop()()

    async def plain_exception() -> None:
        raise LookupError("floor")

    async def raise_floor() -> Any:
        try:
            await plain_exception()
        except LookupError:
            return None

    contenders = [
        Contender("bare await", "await a coroutine that returns", _stacks.work, setup=quiet),
        Contender(
            "floor: raise+catch", "raise a plain exception through a coroutine and catch it", raise_floor,
            setup=quiet,
        ),
        Contender("ragguard, nothing configured", "a stage with no layer configured",
                  _stacks.nothing_configured(ragguard), setup=quiet),
        Contender("ragguard full stack", "the full stack (see _stacks)", full, setup=quiet),
        Contender("ragguard full stack + listener", "the same, one event listener subscribed",
                  full_listened, setup=listen),
        Contender("stock libraries, natural", "aiolimiter+Semaphore+2 asyncio.timeout+tenacity per call"
                  "+aiobreaker", _stacks.natural_stack(), setup=quiet),
        Contender("stock libraries, lean", "the same, one timer, tenacity only after a failure",
                  _stacks.lean_stack(), setup=quiet),
        Contender("interlock-cb pipeline", "its pipeline + aiolimiter + asyncio.timeout deadline",
                  _stacks.interlock_stack(), setup=quiet),
    ]
    if old is not None:
        _, old_full = _stacks.full_stack_guard(old)
        contenders[3:3] = [
            Contender("pre-redesign, nothing configured", "commit ba06c64, a stage with no layer",
                      _stacks.nothing_configured(old), setup=quiet),
            Contender("pre-redesign full stack", "commit ba06c64's Stage, the same full stack", old_full,
                      setup=quiet),
        ]  # fmt: skip
    results = await _bench.run_async(contenders, ops=ops, rounds=rounds)
    quiet()
    against = ["ragguard full stack"] + (["pre-redesign full stack"] if old is not None else [])
    _bench.print_table(results, "1. happy path, one call at a time", against=against, unit="call")
    targets = []
    if old is not None:
        targets.append(_bench.ratio_target(
            results, "full stack vs the pre-redesign full stack (issue 10)", "ragguard full stack",
            "pre-redesign full stack", 1.10,
        ))  # fmt: skip
    targets.append(_bench.ratio_target(
        results, "full stack + one listener vs the full stack", "ragguard full stack + listener",
        "ragguard full stack", 1.5,
    ))  # fmt: skip
    targets.append(_bench.ratio_target(
        results, "natural stock stack vs ragguard full stack (faster, at least)", "stock libraries, natural",
        "ragguard full stack", 1.0, at_least=True,
    ))  # fmt: skip
    return targets


async def _yielding(x: int = 1) -> int:
    await asyncio.sleep(0)  # a dependency that answers on the next loop iteration
    return x


def _batch(body: Callable[[], Awaitable[Any]], in_flight: int, total: int) -> Callable[[], Awaitable[None]]:
    per_task = max(1, total // in_flight)

    async def worker() -> None:
        for _ in range(per_task):
            await body()

    async def batch() -> None:
        await asyncio.gather(*(worker() for _ in range(in_flight)))

    return batch


async def concurrency(rounds: int, total: int, old: Any) -> list[Target]:
    limit = 100_000
    targets = []
    for in_flight in (1, 100, 10_000):
        _, ours = _stacks.full_stack_guard(ragguard, _yielding, max_concurrency=limit)
        contenders = [
            Contender("bare await", "the dependency alone", _batch(lambda: _yielding(1), in_flight, total)),
            Contender("ragguard full stack", "", _batch(ours, in_flight, total)),
            Contender("stock libraries, natural", "",
                      _batch(_stacks.natural_stack(_yielding, max_concurrency=limit), in_flight, total)),
            Contender("stock libraries, lean", "",
                      _batch(_stacks.lean_stack(_yielding, max_concurrency=limit), in_flight, total)),
        ]  # fmt: skip
        if old is not None:
            _, theirs = _stacks.full_stack_guard(old, _yielding, max_concurrency=limit)
            contenders.insert(2, Contender("pre-redesign full stack", "", _batch(theirs, in_flight, total)))
        per_task = max(1, total // in_flight)
        calls = per_task * in_flight
        results = await _bench.run_async(contenders, ops=1, rounds=rounds, yield_every=0, warmup=1)
        for name in results.samples:  # one op was a batch: per call
            results.samples[name] = [ns / calls for ns in results.samples[name]]
        results.ops = calls
        _bench.print_table(
            results, f"2. {in_flight:,} calls in flight (a dependency answering on the next loop turn)",
            against=["ragguard full stack"], unit="call",
        )  # fmt: skip
        if old is not None:
            targets.append(_bench.ratio_target(
                results, f"{in_flight:,} in flight: full stack vs pre-redesign", "ragguard full stack",
                "pre-redesign full stack", 1.10,
            ))  # fmt: skip
    return targets


async def main(ops: int, rounds: int, total: int, against: str, against_only: bool) -> int:
    _bench.header()
    before, note = _baseline.load_commit(against)
    _bench.console.print(note, markup=False)
    targets = await against_commit(ops, rounds, before, against) if before is not None else []
    if against_only:
        _bench.print_targets(targets)
        return 0
    old, note = _baseline.load()
    _bench.console.print(note, markup=False)
    targets += await happy_path(ops, rounds, old)
    targets += await concurrency(max(9, rounds // 2), total, old)  # batches move with the machine: more rounds
    _bench.print_targets(targets)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000, help="calls per contender per round")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--total", type=int, default=20_000, help="calls per batch in the concurrency section")
    parser.add_argument("--against", default=_baseline.PRE_ISSUE_30,
                        help="the commit section 0 compares with (default: main before issue 30)")
    parser.add_argument("--against-only", action="store_true", help="only section 0")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.ops, args.rounds, args.total, args.against, args.against_only)))
