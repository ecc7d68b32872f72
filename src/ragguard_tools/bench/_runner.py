"""``ragguard bench``: the demo's real service under stepped load, four contenders, one run.

Start-up loads WordLlama here (for rerank) and in the backends' child process (embedding service,
faiss vector store), puts the bench's chaos in force on the backends, and starts the four
contenders' services side by side. The dependency's capacity is made explicit and steady: every
embedding call holds the backends' event loop ``block_ms`` milliseconds (a ``block_loop`` chaos
fault: a real ``time.sleep`` on the loop thread, so capacity is about ``1000 / block_ms`` calls a
second whatever else runs on the shared cores); a share ``tail_rate`` of vector-store searches
take ``tail_s`` longer (a latency tail, which hedging is for).

Offered load rises in steps (multiples of that capacity): four well-behaved tenants send a fixed
30% of it, a heavy tenant and a batch job the rest (60/40). At each step every contender gets the
same arrival plan (Poisson, seeded), one after the other in an order rotated per step, so machine
drift hits all alike; each run is a warm-up, a steady window (the only part measured) and a
teardown (in-flight requests end, then the backends are probed until idle). Then the
capacity-change run (:mod:`ragguard_tools.bench._changes`): at 80% of the capacity measured, ``block_ms``
doubles a third of the way through and is back two thirds through, per contender, with the adaptive
contender's ``retrieve`` limit sampled every 100 ms. ``changes_only`` runs that alone, once per seed of
``seeds`` (fresh contenders each time), with the backends and the model started once.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio.to_thread

from ragguard._errors import ConfigError

from ..demo.backends import BackendProcess, ControlClient
from ..demo.corpus import load_passages, load_questions
from ..demo.embedder import load_embedder
from ..demo.loadgen import Arrival, RequestRecord, TenantLoad, plan_arrivals, run_load
from ..demo.pipeline import BackendClients
from ..demo.rerank import Reranker
from ..demo.service import RetrievalClient
from . import _changes
from ._contenders import CONTENDERS, Contender, TenantPlan, build_contender, tenant_plans
from ._report import BenchReport, StepSummary, merge_rounds, summarize_step

__all__ = ["BenchOptions", "cli_main", "run_bench", "run_bench_async"]

FULL_STEPS = (0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0)
QUICK_STEPS = (0.5, 1.0, 1.5, 3.0)
WELL_BEHAVED_SHARE = 0.3


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """Options of a bench run.

    - ``quick``: a CI run (about a minute): 4 steps of 1.2 s, one round, a 3.6 s capacity-change run.
    - ``steps``: offered loads as multiples of the dependency's capacity (default: 0.4 to 3.0).
    - ``warmup_s``, ``steady_s``: seconds of load per contender and step before and during the
      measured window; ``rounds``: how many times each step is run per contender (medians).
    - ``block_ms``: the dependency's bottleneck per embedding call (capacity ~ 1000 / block_ms
      calls/s); ``rtt_ms``: its unloaded latency (the rest is a wait that overlaps, so about
      ``rtt_ms / block_ms`` calls run at once). Halving the capacity doubles ``block_ms`` and keeps
      ``rtt_ms``: the concurrency the dependency can take halves.
    - ``tail_rate``, ``tail_s``: the vector-store latency tail.
    - ``deadline_s``: every request's gRPC deadline (the tenants' deadline).
    - ``halving``: run the capacity-change scenario (``halving_s`` seconds per contender: the
      capacity halves a third of the way through and is back two thirds through).
    - ``changes_only``: run only the capacity changes (no steps), once per seed of ``seeds`` (default
      ``(seed,)``).
    - ``contenders``: which of :data:`CONTENDERS` to run (default: all; only the adaptive one with
      ``changes_only``).
    - ``out_dir``: folder for ``bench.json`` and ``bench.png`` (None: write nothing).
    - ``seed``: seeds the arrival plans, the faults' draws and the Guards' rngs.
    """

    quick: bool = False
    steps: tuple[float, ...] | None = None
    warmup_s: float | None = None
    steady_s: float | None = None
    rounds: int | None = None
    block_ms: float = 15.0
    rtt_ms: float = 60.0
    tail_rate: float = 0.02
    tail_s: float = 0.15
    deadline_s: float = 1.0
    halving: bool = True
    halving_s: float | None = None
    contenders: tuple[str, ...] | None = None
    out_dir: Path | None = Path("ragguard-bench")
    seed: int = 7
    progress: bool = True
    changes_only: bool = False
    seeds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("warmup_s", "steady_s", "halving_s"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int | float) and math.isfinite(v) and 0 < v <= 600):
                raise ConfigError(f"{name} must be in (0, 600] seconds, got {v!r}", field=name)
        if not (isinstance(self.block_ms, int | float) and 1.0 <= self.block_ms <= 1000.0):
            raise ConfigError(f"block_ms must be in [1, 1000], got {self.block_ms!r}", field="block_ms")
        if not (isinstance(self.rtt_ms, int | float) and self.block_ms <= self.rtt_ms <= 10_000.0):
            raise ConfigError(f"rtt_ms must be in [block_ms, 10000], got {self.rtt_ms!r}", field="rtt_ms")
        if not (0 < self.deadline_s <= 60):
            raise ConfigError(f"deadline_s must be in (0, 60], got {self.deadline_s!r}", field="deadline_s")
        if self.steps is not None and (
            len(self.steps) < 2
            or any(not (0 < s <= 20) for s in self.steps)
            or list(self.steps) != sorted(self.steps)
        ):
            raise ConfigError(
                "steps must be at least two rising multiples of capacity in (0, 20]", field="steps"
            )
        if self.rounds is not None and not 1 <= self.rounds <= 20:
            raise ConfigError(f"rounds must be in 1..20, got {self.rounds!r}", field="rounds")
        if self.contenders is None:
            default = ("ragguard-adaptive",) if self.changes_only else CONTENDERS
            object.__setattr__(self, "contenders", default)
        unknown = set(self.contenders or ()) - set(CONTENDERS)
        if unknown or not self.contenders:
            raise ConfigError(
                f"contenders must be among {CONTENDERS}, got {sorted(unknown)}", field="contenders"
            )
        if self.seeds is not None:
            if not self.changes_only:
                raise ConfigError("seeds are for the capacity changes alone: set changes_only", field="seeds")
            if not 1 <= len(self.seeds) <= 20 or len(set(self.seeds)) != len(self.seeds) or not all(
                isinstance(v, int) and 0 <= v < 2**31 for v in self.seeds
            ):
                said = f"seeds must be 1 to 20 distinct integers in [0, 2**31), got {self.seeds!r}"
                raise ConfigError(said, field="seeds")
        if self.changes_only and not self.halving:
            raise ConfigError("changes_only runs the capacity changes: not with halving=False",
                              field="changes_only")

    @property
    def names(self) -> tuple[str, ...]:
        """The contenders that run (see ``contenders``)."""
        assert self.contenders is not None  # filled in at construction
        return self.contenders

    @property
    def seed_list(self) -> tuple[int, ...]:
        """The seeds of the capacity-change runs: ``seeds``, or ``(seed,)``."""
        return self.seeds or (self.seed,)

    @property
    def capacity_rps(self) -> float:
        return 1000.0 / self.block_ms

    def plan(self) -> tuple[tuple[float, ...], float, float, int, float]:
        """(steps, warm-up s, steady s, rounds, halving s) with the quick/full defaults filled in."""
        steps = self.steps or (QUICK_STEPS if self.quick else FULL_STEPS)
        warm = self.warmup_s or (0.4 if self.quick else 2.0)
        steady = self.steady_s or (1.2 if self.quick else 6.0)
        rounds = self.rounds or (1 if self.quick else 2)
        halving = self.halving_s or (3.6 if self.quick else 24.0)
        return steps, warm, steady, rounds, halving


def faults(block_ms: float, options: BenchOptions) -> list[dict[str, Any]]:
    """The chaos in force on the backends: every embedding call holds the backends' loop
    ``block_ms`` (the bottleneck: capacity ~ 1000 / block_ms calls/s) and then waits the rest of
    ``rtt_ms`` without holding anything (network and I/O: calls overlap there), so the dependency's
    unloaded latency is ``rtt_ms`` and it serves about ``rtt_ms / block_ms`` calls at once; and the
    vector-store latency tail."""
    out: list[dict[str, Any]] = [{"kind": "block_loop", "stage": "embedding", "rate": 1.0, "ms": block_ms}]
    wait_ms = options.rtt_ms - block_ms
    if wait_ms > 0:
        out.append({"kind": "latency", "stage": "embedding", "rate": 1.0, "seconds": wait_ms / 1000})
    if options.tail_rate > 0:
        out.append(
            {"kind": "latency", "stage": "vector_store", "rate": options.tail_rate, "seconds": options.tail_s}
        )
    return out


def loads_at(offered_rps: float, capacity_rps: float, plans: Sequence[TenantPlan]) -> list[TenantLoad]:
    """Per tenant its rate at ``offered_rps``: the well-behaved tenants 30% of capacity (or all of
    a lighter load), the rest 60/40 to the heavy tenant and the batch job."""
    wb = [p for p in plans if p.well_behaved]
    share = min(offered_rps, WELL_BEHAVED_SHARE * capacity_rps)
    greedy = offered_rps - share
    out = [TenantLoad(p.name, share / len(wb)) for p in wb]
    if greedy > 0:
        out.append(TenantLoad("hoarder", 0.6 * greedy, greedy=True))
        out.append(TenantLoad("nightly", 0.4 * greedy, greedy=True))
    return out


def change_loads(measured_rps: float, plans: Sequence[TenantPlan]) -> list[TenantLoad]:
    """Per tenant its rate in the capacity-change run, from the capacity measured before it
    (``measured_rps``): :data:`~ragguard_tools.bench._changes.LOAD` of it in all, the well-behaved
    tenants 30% of it (about 60% of the halved capacity), the rest to the heavy tenant and the batch job."""
    return loads_at(_changes.LOAD * measured_rps, measured_rps, plans)


class _Bench:
    def __init__(self, options: BenchOptions, console: Any) -> None:
        self.options = options
        self.console = console
        self.plans = tenant_plans(options.capacity_rps)
        self.well_behaved = {p.name for p in self.plans if p.well_behaved}
        self.priority_of = {p.name: p.priority for p in self.plans}
        self.timings: dict[str, float] = {}
        self.process: BackendProcess | None = None
        self.contenders: dict[str, Contender] = {}
        self.load_clients: dict[str, dict[str, RetrievalClient]] = {}

    async def start(self) -> None:
        t0 = time.monotonic()
        self.process = BackendProcess(seed=self.options.seed_list[0])
        starting = asyncio.create_task(self.process.start())
        try:
            embedder = await anyio.to_thread.run_sync(load_embedder)
            addresses = await starting
        except BaseException:
            starting.cancel()
            await self.process.kill()
            raise
        self.passages = load_passages()
        self.questions = load_questions()
        self.reranker = Reranker(embedder)
        await anyio.to_thread.run_sync(self.reranker.warm, [p.text for p in self.passages])
        self.addresses = addresses
        self.control = ControlClient(addresses.control)
        self.probe = BackendClients(addresses)
        await self.control.set_faults(faults(self.options.block_ms, self.options))
        self.timings["startup"] = time.monotonic() - t0

    async def measure_capacity(self) -> list[float]:
        """What the backends serve at ``block_ms`` and at twice it (calls a second: an embedding
        and a vector-store call each, 16 callers in a loop; see :mod:`ragguard_tools.bench._changes`),
        the backends drained after each."""
        o = self.options
        seconds = 1.0 if o.quick else 3.0
        out = []
        for block in (o.block_ms, 2 * o.block_ms):
            await self.control.set_faults(faults(block, o))
            counting_from = time.monotonic() + 0.3  # the first calls fill the queue: not counted
            done = await asyncio.gather(*(self._call_until(counting_from, seconds) for _ in range(16)))
            out.append(round(sum(done) / seconds, 2))
            await self.drain()
        return out

    async def _call_until(self, counting_from: float, seconds: float) -> int:
        """An embedding and a vector-store call after another until ``seconds`` after
        ``counting_from``; how many ended after ``counting_from``."""
        done = 0
        end = counting_from + seconds
        while time.monotonic() < end:
            vectors = await self.probe.embed(["what the backends serve"], timeout_s=5.0)
            await self.probe.search(vectors[0], 10, timeout_s=5.0)
            done += counting_from <= time.monotonic() < end
        return done

    async def build_contenders(self, seed: int) -> None:
        """Start the contenders (their Guards seeded from ``seed``) and their load clients."""
        for i, name in enumerate(self.options.names):
            c = await build_contender(
                name,
                addresses=self.addresses,
                reranker=self.reranker,
                passages=self.passages,
                tenants=self.plans,
                deadline_s=self.options.deadline_s,
                seed=seed + i,
            )
            self.contenders[name] = c
            self.load_clients[name] = {p.name: RetrievalClient(c.address) for p in self.plans}

    async def close_contenders(self) -> None:
        for clients in self.load_clients.values():
            for client in clients.values():
                await client.close()
        for c in self.contenders.values():
            await c.close()
        self.load_clients.clear()
        self.contenders.clear()

    async def stop(self) -> None:
        await self.close_contenders()
        if hasattr(self, "probe"):
            await self.probe.close()
        if hasattr(self, "control"):
            await self.control.close()
        if self.process is not None:
            await self.process.stop()

    async def drain(self, limit_s: float = 8.0) -> float:
        """Wait until the backends answer an embedding call promptly twice in a row (the queue a
        run left behind is gone); returns the seconds waited."""
        t0 = time.monotonic()
        good = 0
        healthy_s = 3 * self.options.block_ms / 1000 + 0.03
        while time.monotonic() - t0 < limit_s and good < 2:
            started = time.monotonic()
            try:
                await self.probe.embed(["drain probe"], timeout_s=2.0)
            except Exception:  # the backend is still choking on the last run's queue
                good = 0
                continue
            good = good + 1 if time.monotonic() - started < healthy_s else 0
            await asyncio.sleep(0.02)
        return time.monotonic() - t0

    async def one_run(
        self, name: str, arrivals: Sequence[Arrival], on_done: Callable[[RequestRecord], None] | None = None
    ) -> list[RequestRecord]:
        return await run_load(
            self.load_clients[name],
            arrivals,
            self.questions,
            timeout_s=self.options.deadline_s,
            max_in_flight=4096,
            on_done=on_done,
        )

    async def steps(self, progress: Any) -> tuple[list[float], dict[str, list[list[StepSummary]]]]:
        o = self.options
        steps, warm, steady, rounds, _ = o.plan()
        cap = o.capacity_rps
        offered = [round(m * cap, 2) for m in steps]
        per: dict[str, list[list[StepSummary]]] = {n: [[] for _ in steps] for n in o.names}
        names = list(o.names)
        for r in range(rounds):
            for i, load in enumerate(offered):
                rng = random.Random(o.seed * 1000 + r * 100 + i)
                arrivals = plan_arrivals(
                    loads_at(load, cap, self.plans), warm + steady, len(self.questions), rng
                )
                shift = (i + r) % len(names)
                for name in names[shift:] + names[:shift]:
                    if progress is not None:
                        progress.describe(
                            f"round {r + 1}/{rounds} step {i + 1}/{len(offered)}: {load:.0f} rps -> {name}"
                        )
                    records = await self.one_run(name, arrivals)
                    measured = [rec for rec in records if rec.at_s >= warm]
                    step = summarize_step(
                        measured,
                        offered_rps=load,
                        steady_s=steady,
                        well_behaved=self.well_behaved,
                        priority_of=self.priority_of,
                    )
                    per[name][i].append(step)
                    await self.drain()
                    if progress is not None:
                        progress.advance(f"goodput {step.goodput_rps:.1f} rps")
        return offered, per

    async def halving(self, progress: Any, seed: int) -> dict[str, Any]:
        """The capacity-change run (see :mod:`ragguard_tools.bench._changes`) of every contender, on the
        arrival plan of ``seed``; the backends' capacity is measured first."""
        o = self.options
        capacity = await self.measure_capacity()
        *_, duration = o.plan()
        cap = o.capacity_rps
        change_at, restore_at = _changes.timeline(duration)
        loads = change_loads(capacity[0], self.plans)  # the nominal overstates what the backends serve
        arrivals = plan_arrivals(loads, duration, len(self.questions), random.Random(seed * 7919))
        runs: dict[str, Any] = {}
        trace: list[tuple[float, int, float | None, bool]] = []
        for name in o.names:
            if progress is not None:
                progress.describe(f"capacity changes{f' (seed {seed})' if o.changes_only else ''}: {name}")
            c = self.contenders[name]
            await self.control.set_faults(faults(o.block_ms, o))
            start = time.monotonic() + 0.05
            sampler: asyncio.Task[None] | None = None
            samples: list[tuple[float, int, float | None, bool]] = []
            limiter = None
            if c.guard is not None:
                from ragguard.overload import limiters

                limiter = limiters(c.guard).get("retrieve")
            if limiter is not None:
                sampler = asyncio.create_task(_sample_limit(limiter, start, samples))
            changer = asyncio.create_task(self._change_capacity(start, change_at, restore_at))
            try:
                records = await run_load(
                    self.load_clients[name],
                    arrivals,
                    self.questions,
                    timeout_s=o.deadline_s,
                    max_in_flight=4096,
                    start=start,
                )
                await changer
            finally:
                changer.cancel()
                if sampler is not None:
                    sampler.cancel()
            await self.control.set_faults(faults(o.block_ms, o))
            await self.drain()
            runs[name] = _changes.summarize_run(
                records, duration_s=duration, well_behaved=self.well_behaved, capacity_rps=capacity
            )
            if samples:
                trace = samples
            if progress is not None:
                r = runs[name]
                progress.advance(
                    f"goodput {r['before']['goodput_rps']:.1f} rps before, {r['after']['goodput_rps']:.1f} "
                    f"halved, {r['restored']['goodput_rps']:.1f} restored"
                )
        out: dict[str, Any] = {
            "seed": seed,
            "offered_rps": sum(t.rate_per_s for t in loads),
            "well_behaved_rps": sum(t.rate_per_s for t in loads if t.name in self.well_behaved),
            "duration_s": duration,
            "change_at_s": change_at,
            "restore_at_s": restore_at,
            "block_ms": [o.block_ms, 2 * o.block_ms, o.block_ms],
            "capacity_rps": {"nominal": [cap, cap / 2], "measured": capacity},
            "runs": runs,
            "limit_trace": [[round(t, 3), lim, probing] for t, lim, _, probing in trace],
            "min_rtt_trace": [[round(t, 3), m] for t, _, m, _ in trace],
        }
        out.update(_changes.limit_phases(trace, duration))
        return out

    async def _change_capacity(self, start: float, change_at: float, restore_at: float) -> None:
        o = self.options
        for at, block in ((change_at, 2 * o.block_ms), (restore_at, o.block_ms)):
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            await self.control.set_faults(faults(block, o))


async def _sample_limit(limiter: Any, start: float, out: list[tuple[float, int, float | None, bool]]) -> None:
    while True:
        g = limiter.gradient
        out.append((time.monotonic() - start, limiter.limit, g.min_rtt, g.probing))
        await asyncio.sleep(0.1)


class _Progress:
    """The bench's progress: a live bar on a terminal; in a log or a pipe, where a bar is printed
    only when it stops, one plain line as each contender's step (or halving run) ends."""

    def __init__(self, console: Any, total: int) -> None:
        self.console = console
        self.total = total
        self.finished = 0
        self.text = "starting"
        self.bar: Any = None
        if console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("[bold]bench[/bold]"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=console,
            )
            self.task = self.bar.add_task("starting", total=total)

    def start(self) -> None:
        if self.bar is not None:
            self.bar.start()

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()

    def say(self, text: str) -> None:
        """One plain line in a log or a pipe (nothing on a terminal: the bar says it)."""
        if self.bar is None:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def describe(self, text: str) -> None:
        self.text = text
        if self.bar is not None:
            self.bar.update(self.task, description=text)

    def advance(self, result: str = "") -> None:
        """The step described last is done; ``result`` says how it went (plain lines only)."""
        self.finished += 1
        if self.bar is not None:
            self.bar.advance(self.task)
        else:
            self.say(f"bench {self.finished}/{self.total} {self.text}" + (f": {result}" if result else ""))


async def run_bench_async(options: BenchOptions) -> BenchReport:
    """Run the bench (see the module docstring); writes ``bench.json`` and ``bench.png`` to
    ``out_dir`` and prints the tables when ``progress``."""
    console = None
    if options.progress:
        from rich.console import Console

        console = Console()  # the tables read whole at 80 columns, a log's or a pipe's width too
    started = time.monotonic()
    steps, warm, steady, rounds, duration = options.plan()
    names, seeds = options.names, options.seed_list
    if options.changes_only:
        total = len(names) * len(seeds)
    else:
        total = len(steps) * len(names) * rounds + (len(names) if options.halving else 0)
    bench = _Bench(options, console)
    progress = _Progress(console, total) if console is not None else None
    if progress is not None:
        progress.start()
        if options.changes_only:
            progress.say(f"bench: loading the model; then the capacity changes ({duration:g} s) of "
                         f"{', '.join(names)} for seed{'s' if len(seeds) > 1 else ''} "
                         f"{', '.join(map(str, seeds))}")
        else:
            progress.say(f"bench: loading the model and starting {len(names)} services; then "
                         f"{len(steps)} steps x {len(names)} contenders x {rounds} round(s) of "
                         f"{warm + steady:g} s" + (", then the capacity changes" if options.halving else ""))
    offered: list[float] = []
    per: dict[str, list[list[StepSummary]]] = {}
    changes: list[dict[str, Any]] = []
    try:
        await bench.start()
        for seed in seeds if options.changes_only else (options.seed,):
            await bench.build_contenders(seed)
            if not options.changes_only:
                t0 = time.monotonic()
                offered, per = await bench.steps(progress)
                bench.timings["steps"] = time.monotonic() - t0
            if options.halving:
                t0 = time.monotonic()
                changes.append(await bench.halving(progress, seed))
                bench.timings["changes"] = bench.timings.get("changes", 0.0) + time.monotonic() - t0
            await bench.close_contenders()
            if progress is not None and options.changes_only:
                progress.say("\n".join(BenchReport(options={}, capacity_rps=0.0, offered_rps=[], steps={},
                                                    rounds={}, changes=changes[-1:]).changes_lines()))
    finally:
        if progress is not None:
            progress.stop()
        await bench.stop()
    bench.timings["total"] = time.monotonic() - started
    opts = asdict(options)
    opts["out_dir"] = None if options.out_dir is None else str(options.out_dir)
    opts.update(
        {
            "steps": [] if options.changes_only else list(steps),
            "warmup_s": warm,
            "steady_s": steady,
            "rounds": rounds,
            "halving_s": duration,
            "tenants": [asdict(p) for p in bench.plans],
        }
    )
    report = BenchReport(
        options=opts,
        capacity_rps=options.capacity_rps,
        offered_rps=offered,
        steps={n: [merge_rounds(r) for r in per[n]] for n in per},
        rounds={n: [[r[i] for r in per[n]] for i in range(rounds)] for n in per},
        changes=changes,
        timings_s={k: round(v, 2) for k, v in bench.timings.items()},
    )
    if options.out_dir is not None:
        report.write_json(options.out_dir / "bench.json")
        await anyio.to_thread.run_sync(report.write_chart, options.out_dir / "bench.png")
    if console is not None:
        _print(console, report, bench.timings)
    return report


def _print(console: Any, report: BenchReport, timings: dict[str, float]) -> None:
    """The run's tables, targets and capacity changes, as ``ragguard bench`` prints them."""
    if report.steps:
        console.print(report.table())
        console.print(report.tenants_table())
    elif report.changes:
        console.print(report.changes_table())
    console.print(report.targets_table())
    if report.steps and report.changes:
        for line in report.changes_lines():
            console.print(line)
    if report.json_path is not None:
        console.print(f"report: {report.json_path}   chart: {report.chart_path}")
    done = ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
    console.print(done.replace("startup", "start-up"))


def run_bench(options: BenchOptions | None = None) -> BenchReport:
    """Run the bench in a fresh event loop (see :func:`run_bench_async`)."""
    return asyncio.run(run_bench_async(options or BenchOptions()))


def cli_main(**kwargs: Any) -> int:
    """What ``ragguard bench`` calls: runs the bench; returns the exit code (0). Raises
    ConfigError for a bad option (``field`` names the BenchOptions field)."""
    run_bench(BenchOptions(**kwargs))
    return 0
