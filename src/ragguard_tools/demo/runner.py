"""``ragguard demo``: run the same load and chaos against the unguarded and the guarded service.

Start-up loads the model twice in parallel (the backends' child process and this process, for
rerank), checks recall@5 of the healthy service on every labelled question, then runs the load
twice. Each run gets fresh servers, a fresh ragguard registry (breakers, quotas, embedding cache)
and the same arrival plan; the scenario driver puts each phase's faults in force on time.
"""

from __future__ import annotations

import asyncio
import math
import random
import reprlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio.to_thread

from ragguard import ConfigError, Guard, Policy, TenantQuota
from ragguard.chaos import FaultProxy, Scenario, default_scenario, load_scenario
from ragguard.events import BreakerTransition, bus
from ragguard.grpc import GuardServerInterceptor, SnappyServerInterceptor, client_interceptors
from ragguard.monitors import LoopStall, StallDetector, record_events
from ragguard.redis import RedisBackend
from ragguard.redis._link import mask_url

from ._status import DemoStatus
from .backends import DEPLOYMENTS, BackendAddresses, BackendProcess, ControlClient, start_in_loop
from .corpus import Passage, Question, load_passages, load_questions
from .embedder import Embedder, load_embedder
from .faults import ChaosPlan, FaultApplier, drive, oom_budget
from .generator import whole_answer
from .guarded import GuardedPipeline, demo_policy
from .keyword import KeywordIndex
from .loadgen import Arrival, TenantLoad, plan_arrivals, run_load
from .pipeline import BackendClients, PipelineSettings, UnguardedPipeline
from .progress import RunProgress, say
from .report import DemoReport, GenerationTally, RunResult, Transition, print_table, summarize
from .rerank import Reranker
from .service import RetrievalClient, RetrievalServer

__all__ = ["DemoOptions", "cli_main", "run_demo", "run_demo_async"]

FULL_DURATION_S = 40.0
QUICK_DURATION_S = 9.0
HEALTHY_RERANK_BUDGET = 64 * 2**20
REDIS_PREFIX = "ragguard-demo"
STAGE_BREAKERS = ("embedding", "vector_store", "rerank")
# the stages' breakers, then each deployment's of the model (a key of the stage "model")
BREAKERS = (*STAGE_BREAKERS, *(f"model[{d}]" for d in DEPLOYMENTS))
# The greedy tenant's generated tokens are paced to this rate (burst: tokens handed over back to
# back above it); a well-behaved tenant asks for about 130 tokens/s.
GREEDY_TOKENS_PER_S = 600.0
GREEDY_TOKEN_BURST = 120


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """Options of a demo run.

    - ``duration_s``: seconds of load per run (each of the two runs); None: 40, or 9 with ``quick``.
    - ``concurrency``: the load generator's cap on requests in flight (>= 1).
    - ``capacity``: RPCs the retrieval service serves at once (>= 1): unguarded, gRPC refuses the
      excess; guarded, the interceptor does, the tenant holding the most first.
    - ``scenario``: a :mod:`ragguard.chaos` scenario YAML file (None: the toolkit's default,
      ``ragguard/chaos/scenarios/default.yaml``); its phases are stretched over ``duration_s``.
    - ``redis_url``: keep the guarded run's tenant quotas and breakers in this Redis, shared by
      every demo replica pointed at it (keys under ``{ragguard-demo:...}``).
    - ``out_dir``: folder for ``report.json`` and ``latency.png`` (None: write nothing).
    - ``seed``: seeds the arrival plan, the questions drawn and the faults' draws.
    - ``tenants`` well-behaved tenants at ``rate_per_s`` each, plus ``greedy_tenant`` at
      ``greedy_factor`` times that rate.
    - ``greedy_tokens_per_s``: the greedy tenant's generated tokens are paced to this rate in the
      guarded run (beyond a burst of ``GREEDY_TOKEN_BURST``; > 0, default 600).
    - ``client_timeout_s``: every request's gRPC deadline; ``slo_s``: goodput counts answers
      within it.
    - ``backends_in_process``: run the backends in this event loop instead of a child process.
    - ``progress``: draw progress bars and the table on the console.
    - ``status_port``: serve the guarded run's status (``/status``, what ``ragguard top
      http://127.0.0.1:PORT/status`` shows) on 127.0.0.1 at this port (None: not), from start-up
      to exit: before the guarded run it answers with no stages and a note saying so
      (:mod:`ragguard_tools.demo._status`).
    """

    duration_s: float | None = None
    concurrency: int = 64
    capacity: int = 16
    scenario: Path | None = None
    redis_url: str | None = None
    quick: bool = False
    out_dir: Path | None = Path("ragguard-report")
    seed: int = 7
    tenants: tuple[str, ...] = ("acme", "globex", "initech", "umbrella")
    rate_per_s: float = 2.5
    greedy_tenant: str = "hoarder"
    greedy_factor: float = 10.0
    greedy_tokens_per_s: float = GREEDY_TOKENS_PER_S
    client_timeout_s: float = 5.0
    slo_s: float = 1.0
    backends_in_process: bool = False
    progress: bool = True
    status_port: int | None = None

    def __post_init__(self) -> None:
        d = self.duration_s
        if d is not None and not (isinstance(d, int | float) and math.isfinite(d) and 1.0 <= d <= 3600):
            raise ConfigError(
                f"duration_s must be between 1 and 3600 seconds, got {d!r}", field="duration_s"
            )
        for name in ("concurrency", "capacity"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000:
                raise ConfigError(f"{name} must be an int in 1..10000, got {reprlib.repr(value)}", field=name)
        for name in ("rate_per_s", "greedy_factor", "greedy_tokens_per_s", "client_timeout_s", "slo_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
                raise ConfigError(f"{name} must be a positive number, got {reprlib.repr(value)}", field=name)
        port = self.status_port
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
            said = f"status_port must be a port 1..65535, got {reprlib.repr(port)}"
            raise ConfigError(said, field="status_port")
        if not self.tenants:
            raise ConfigError("tenants must name at least one well-behaved tenant")
        if self.greedy_tenant in self.tenants:
            raise ConfigError(f"greedy_tenant {self.greedy_tenant!r} is also listed in tenants")
        if self.redis_url is not None:
            _check_redis_url(self.redis_url)

    @property
    def run_duration_s(self) -> float:
        if self.duration_s is not None:
            return float(self.duration_s)
        return QUICK_DURATION_S if self.quick else FULL_DURATION_S

    def loads(self) -> list[TenantLoad]:
        return [TenantLoad(t, self.rate_per_s) for t in self.tenants] + [
            TenantLoad(self.greedy_tenant, self.rate_per_s * self.greedy_factor, greedy=True)
        ]


@dataclass(slots=True)
class _Shared:
    """What both runs use: corpus, model, indexes and the backends."""

    passages: list[Passage]
    questions: list[Question]
    embedder: Embedder
    reranker: Reranker
    keyword: KeywordIndex
    addresses: BackendAddresses
    control: ControlClient
    applier: FaultApplier
    stop_backends: Callable[[], Awaitable[None]]
    timings: dict[str, float] = field(default_factory=dict)


def run_demo(options: DemoOptions | None = None) -> DemoReport:
    """Run the demo (blocking; starts its own event loop). Returns the report; writes
    ``report.json`` and ``latency.png`` to ``options.out_dir`` unless it is None."""
    return asyncio.run(run_demo_async(options or DemoOptions()))


async def run_demo_async(options: DemoOptions) -> DemoReport:
    """The demo inside a running asyncio loop (see :func:`run_demo`)."""
    started = time.monotonic()
    scenario = _scenario(options.scenario)
    console = _console(options)
    status = None if options.status_port is None else DemoStatus(options.status_port).open()
    try:
        if status is not None and console is not None:
            said = (f"demo: status on {status.url} until the demo ends (ragguard top {status.url}): "
                    "the guarded run's breakers, limits and tenants; before that run it says nothing "
                    "is guarded yet")  # fmt: skip
            console.print(said, markup=False, highlight=False, soft_wrap=True)
        return await _demo(options, started, scenario, console, status)
    finally:
        if status is not None:
            await status.aclose()


async def _demo(
    options: DemoOptions, started: float, scenario: Scenario, console: Any, status: DemoStatus | None
) -> DemoReport:
    plan = ChaosPlan(scenario)
    redis = _redis_client(options.redis_url)
    say(console, "demo: loading the model and starting the backends")
    shared = await _start(options)
    recorder = _record_events(options.out_dir)
    try:
        say(console, f"demo: started in {shared.timings['startup']:.1f} s; asking the healthy service "
            f"all {len(shared.questions)} questions once (recall@5 baseline)")  # fmt: skip
        if status is not None:
            status.phase("the healthy baseline")
        hits = await _baseline_hits(shared, options)
        baseline = sum(hits.values()) / len(hits)
        duration = options.run_duration_s
        rng = random.Random(options.seed)
        arrivals = plan_arrivals(options.loads(), duration, len(shared.questions), rng)
        say(console, f"demo: baseline recall@5 {baseline:.1%}; now the scenario {scenario.name!r} "
            f"twice, {duration:g} s of load each: unguarded, then guarded")  # fmt: skip
        runs: dict[str, RunResult] = {}
        for mode in ("unguarded", "guarded"):
            await shared.applier.heal()
            if recorder is not None:
                recorder.mark_run(mode)  # ragguard doctor reports each run's events apart
            t0 = time.monotonic()
            runs[mode] = await _run(mode, shared, options, plan, arrivals, redis, console, status)
            shared.timings[f"{mode}_run"] = time.monotonic() - t0
    finally:
        await shared.stop_backends()
        if redis is not None:
            await redis.aclose()
        if recorder is not None:
            await asyncio.sleep(0)  # let the last queued events reach the recorder
            recorder.close()
    shared.timings["total"] = time.monotonic() - started
    greedy = [options.greedy_tenant]
    summaries = {m: summarize(r, greedy=greedy, slo_s=options.slo_s, healthy=hits) for m, r in runs.items()}
    report = DemoReport(
        options=_options_dict(options, duration, scenario),
        baseline_recall_at_5=baseline,
        questions=len(shared.questions),
        passages=len(shared.passages),
        timings_s={k: round(v, 3) for k, v in shared.timings.items()},
        runs=runs,
        summaries=summaries,
        greedy=greedy,
        baseline_hits=hits,
    )
    if options.out_dir is not None:
        say(console, f"demo: writing {options.out_dir / 'report.json'} and the chart")
        report.write_json(options.out_dir / "report.json")
        await anyio.to_thread.run_sync(report.write_chart, options.out_dir / "latency.png")
    if console is not None:
        print_table(console, report.table())
        if report.json_path is not None:
            console.print(f"report: {report.json_path}   chart: {report.chart_path}")
        if recorder is not None and options.out_dir is not None:
            console.print(f"events: {options.out_dir / 'events.jsonl'}   "
                          f"(explain them: ragguard doctor --events {options.out_dir / 'events.jsonl'})")
        t = shared.timings
        console.print(
            f"model load {t['model_load']:.1f} s, start-up {t['startup']:.1f} s, total {t['total']:.1f} s"
        )
    return report


def cli_main(
    *,
    duration_s: float | None = None,
    concurrency: int = 64,
    scenario: Path | None = None,
    redis_url: str | None = None,
    quick: bool = False,
    out_dir: Path | None = Path("ragguard-report"),
    seed: int = 7,
    status_port: int | None = None,
) -> int:
    """What ``ragguard demo`` calls: runs the demo, prints the table; returns the exit code (0).

    Raises ConfigError for a bad option or scenario (``field`` names the DemoOptions field, which
    ``ragguard demo`` words as its command-line option)."""
    options = DemoOptions(
        duration_s=duration_s,
        concurrency=concurrency,
        scenario=scenario,
        redis_url=redis_url,
        quick=quick,
        out_dir=out_dir,
        seed=seed,
        status_port=status_port,
    )
    run_demo(options)
    return 0


# -- start-up -------------------------------------------------------------------------------------


def _scenario(path: Path | None) -> Scenario:
    if path is None:
        return default_scenario()
    try:
        return load_scenario(path)
    except OSError as exc:
        raise ConfigError(f"cannot read scenario {path}: {exc.strerror or exc}") from None


async def _start(options: DemoOptions) -> _Shared:
    t0 = time.monotonic()
    process: BackendProcess | None = None
    in_loop: Any = None
    if options.backends_in_process:
        embedder = await anyio.to_thread.run_sync(load_embedder)
        model_s = time.monotonic() - t0
        in_loop = await start_in_loop(seed=options.seed, embedder=embedder)
        addresses = in_loop.addresses
    else:
        process = BackendProcess(seed=options.seed)
        starting = asyncio.create_task(process.start())
        try:
            embedder = await anyio.to_thread.run_sync(load_embedder)
            model_s = time.monotonic() - t0
            addresses = await starting
        except BaseException:
            starting.cancel()
            await process.kill()
            raise
    passages = load_passages()
    reranker = Reranker(embedder, memory_budget_bytes=HEALTHY_RERANK_BUDGET)
    await anyio.to_thread.run_sync(reranker.warm, [p.text for p in passages])
    keyword = await anyio.to_thread.run_sync(KeywordIndex, passages)
    control = ControlClient(addresses.control)
    # The retrieval service reaches each backend through a fault proxy (for the scenario's
    # network faults: stop, refuse, reset, latency...), each deployment of the generator too.
    behind = {"embedding": addresses.embedding, "vector_store": addresses.vector_store}
    behind |= {f"generator_{d}": addresses.generator(d) for d in DEPLOYMENTS}
    proxies = {name: await FaultProxy(_port(address)).open() for name, address in behind.items()}
    budgets: dict[tuple[int, float], int] = {}
    texts = [p.text for p in passages]

    def budget_for(min_batch: int, rate: float) -> int:
        key = (min_batch, rate)
        if key not in budgets:
            budgets[key] = oom_budget(reranker, texts, min_batch, rate, rng=random.Random(options.seed))
        return budgets[key]

    applier = FaultApplier(control, proxies, reranker, healthy_budget=HEALTHY_RERANK_BUDGET,
                           budget_for=budget_for)

    async def stop() -> None:
        for proxy in proxies.values():
            await proxy.aclose()
        await control.close()
        if process is not None:
            await process.stop()
        if in_loop is not None:
            await in_loop.stop()

    return _Shared(
        passages=passages,
        questions=load_questions(),
        embedder=embedder,
        reranker=reranker,
        keyword=keyword,
        addresses=BackendAddresses(
            embedding=proxies["embedding"].target,
            vector_store=proxies["vector_store"].target,
            control=addresses.control,
            generation=proxies["generator_a"].target,
            generation_b=proxies["generator_b"].target,
        ),
        control=control,
        applier=applier,
        stop_backends=stop,
        timings={"model_load": model_s, "startup": time.monotonic() - t0},
    )


async def _baseline_hits(shared: _Shared, options: DemoOptions) -> dict[int, bool]:
    """Whether the healthy unguarded service's top 5 held a passage of each labelled question's
    topics (its recall@5 hit), every question asked once: question index -> hit."""
    t0 = time.monotonic()
    clients = BackendClients(shared.addresses)
    server = RetrievalServer(UnguardedPipeline(clients, shared.reranker, shared.passages), shared.passages,
                             capacity=options.capacity)
    client = RetrievalClient(await server.start())
    try:
        arrivals = [Arrival(0.0, options.tenants[0], i) for i in range(len(shared.questions))]
        records = await run_load({options.tenants[0]: client}, arrivals, shared.questions,
                                 timeout_s=options.client_timeout_s, max_in_flight=8, rpc="answer")
    finally:
        await client.close()
        await server.stop(None)
        await clients.close()
    shared.timings["baseline"] = time.monotonic() - t0
    return {r.question: bool(r.hit) for r in records}


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _check_redis_url(url: object) -> None:
    """Refuse a ``--redis`` value that is no Redis URL, naming it with its password masked."""
    shown = reprlib.repr(mask_url(url)) if isinstance(url, str) else reprlib.repr(url)
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(f"redis_url must be a redis://, rediss:// or unix:// URL, got {shown}",
                          field="redis_url")
    from redis.asyncio.connection import parse_url

    try:
        parse_url(url)
    except ValueError as exc:
        reason = reprlib.repr(mask_url(url, str(exc)))
        raise ConfigError(f"redis_url is not a valid Redis URL ({reason}): got {shown}",
                          field="redis_url") from None


def _redis_client(url: str | None) -> Any:
    """A redis.asyncio client for ``--redis``: short timeouts and no retries of its own (ragguard
    falls back to local state when Redis is slow or down)."""
    if url is None:
        return None
    import redis.asyncio as aredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return aredis.Redis.from_url(
        url, socket_timeout=0.5, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0), max_connections=64
    )


# -- one run --------------------------------------------------------------------------------------


async def _run(
    mode: str,
    shared: _Shared,
    options: DemoOptions,
    plan: ChaosPlan,
    arrivals: Sequence[Arrival],
    redis: Any,
    console: Any,
    status: DemoStatus | None,
) -> RunResult:
    duration = options.run_duration_s
    transitions: list[Transition] = []
    stalls: list[dict[str, Any]] = []
    breakers: list[str] = []
    rerank_floor: int | None = None
    generation: GenerationTally | None = None
    if mode == "guarded":
        server, closers, guard = _guarded_service(shared, options, duration, redis)
        if status is not None:
            status.guarding(guard)
            closers.insert(0, _ending(status))  # its last snapshot before the Guard closes
        breakers = list(BREAKERS)
        rerank_floor = guard.policy.stage("rerank").rerank_min_batch
        paced = {t: q.tokens_per_s for t, q in guard.policy.tenants.items() if q.tokens_per_s is not None}
        generation = GenerationTally(paced_to=paced)
    else:
        server, closers = _unguarded_service(shared, options)
        if status is not None:
            status.phase("the unguarded run")
    address = await server.start()
    snappy = mode == "guarded"
    load_clients = {t.name: RetrievalClient(address, snappy=snappy) for t in options.loads()}
    start = time.monotonic() + 0.2

    def on_event(event: Any) -> None:
        if isinstance(event, BreakerTransition):
            transitions.append(Transition(round(event.at - start, 4), event.breaker, event.old, event.new))
        elif isinstance(event, LoopStall):
            stalls.append({"at_s": round(event.at - start, 3), "duration_s": round(event.duration_s, 4),
                           "frame": event.frame})
        elif generation is not None:
            generation.on_event(event)

    unsubscribe = bus.subscribe(on_event)
    detector = _stall_detector()
    phases = [(name, round(a, 3), round(b, 3)) for name, a, b in plan.spans(duration)]
    progress = None if console is None else RunProgress(console, mode, duration, len(arrivals), phases)
    driver = asyncio.create_task(drive(plan, shared.applier, duration_s=duration, start=start))
    wall0 = time.monotonic()
    try:
        if progress is not None:
            progress.start()
        ticker = asyncio.create_task(_tick(progress, start)) if progress is not None else None
        records = await run_load(
            load_clients, arrivals, shared.questions, timeout_s=options.client_timeout_s,
            max_in_flight=options.concurrency, start=start,
            on_done=progress.done if progress is not None else None, rpc="answer",
            judge=_judge(shared.passages),
        )
        await driver
        if ticker is not None:
            ticker.cancel()
    finally:
        driver.cancel()
        if progress is not None:
            progress.stop()
        detector.stop()
        for c in load_clients.values():
            await c.close()
        await server.stop(None)
        for close in closers:
            await close()
        await asyncio.sleep(0)  # let queued events reach the listener
        unsubscribe()
    return RunResult(mode=mode, duration_s=duration, records=records, phases=phases, transitions=transitions,
                     stalls=stalls, wall_s=time.monotonic() - wall0, breakers=breakers,
                     rerank_floor=rerank_floor, generation=generation)


Closer = Callable[[], Awaitable[None]]


def _judge(passages: Sequence[Passage]) -> Callable[[Sequence[str], dict[str, Any]], bool | None]:
    """Whether an answer's words are its whole answer, from the passages its last message names."""
    words = PipelineSettings().answer_words

    def judge(texts: Sequence[str], reply: dict[str, Any]) -> bool | None:
        hits = reply.get("hits")
        if not isinstance(hits, list):
            return None
        top = [passages[h["pid"]].text for h in hits if 0 <= h.get("pid", -1) < len(passages)]
        return whole_answer("".join(texts), top, words)

    return judge


def _ending(status: DemoStatus) -> Closer:
    async def end() -> None:
        status.ended()

    return end


def _unguarded_service(shared: _Shared, options: DemoOptions) -> tuple[RetrievalServer, list[Closer]]:
    clients = BackendClients(shared.addresses)
    pipeline = UnguardedPipeline(clients, shared.reranker, shared.passages, PipelineSettings())
    return RetrievalServer(pipeline, shared.passages, capacity=options.capacity), [clients.close]


def _guarded_service(
    shared: _Shared, options: DemoOptions, duration: float, redis: Any
) -> tuple[RetrievalServer, list[Closer], Guard]:
    greedy_rate = options.rate_per_s * options.greedy_factor
    policy = demo_policy(
        open_for_s=max(1.0, duration / 20),
        tenant_timeout_s=2.0,
        known=options.tenants,  # the well-behaved tenants: each keeps its own default quota
        greedy={
            options.greedy_tenant: TenantQuota(
                max_concurrency=4, rate_per_s=greedy_rate * 0.6, burst=max(1, math.ceil(greedy_rate * 0.2)),
                max_wait_s=0.05, timeout_s=2.0,
                tokens_per_s=options.greedy_tokens_per_s, token_burst=GREEDY_TOKEN_BURST,
            )
        },
    )
    rng = random.Random(options.seed)
    closers: list[Closer] = []
    if redis is None:
        guard = Guard(policy, rng=rng)
    else:
        guard, closers = _shared_guard(policy, redis, rng)
    clients = BackendClients(shared.addresses, interceptors=client_interceptors(), snappy=True)
    pipeline = GuardedPipeline(clients, shared.reranker, shared.passages, shared.keyword, guard)
    # The interceptor alone bounds the RPCs in flight to the capacity, the tenant holding the
    # most giving way first: gRPC's own limit, tenant-blind, would count the refusals in flight
    # and refuse the well-behaved tenants' calls before their tenant is known.
    door = GuardServerInterceptor(guard=guard, max_concurrent_rpcs=options.capacity)
    server = RetrievalServer(
        pipeline, shared.passages, capacity=None, interceptors=[door, SnappyServerInterceptor()]
    )
    return server, [clients.close, *closers], guard


def _shared_guard(policy: Policy, redis: Any, rng: random.Random) -> tuple[Guard, list[Closer]]:
    """A Guard whose quotas and five breakers live in Redis (``--redis``), shared by every demo
    replica using the same server (token pacing stays in the process): the stages' three, built
    here, and each deployment's of the model, which its group declares."""
    guard = Guard(policy, rng=rng, backend=RedisBackend(redis, prefix=REDIS_PREFIX))
    for stage in STAGE_BREAKERS:
        guard.breaker(stage)  # build (and share) them up front
    return guard, [guard.aclose]


def _record_events(out_dir: Path | None) -> Any:
    """Record the runs' notable events (breaker transitions, fallbacks, quota rejections, loop
    stalls) as JSON lines beside the report, for ``ragguard doctor``; None without an out_dir."""
    if out_dir is None:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "events.jsonl"
    for old in (path, path.with_name(path.name + ".1")):
        old.unlink(missing_ok=True)  # this run's events only
    return record_events(path)


def _stall_detector() -> StallDetector:
    return StallDetector(threshold_s=0.02).start()


# -- console --------------------------------------------------------------------------------------


def _console(options: DemoOptions) -> Any:
    if not options.progress:
        return None
    from rich.console import Console

    return Console()


async def _tick(progress: RunProgress, start: float) -> None:
    while True:
        progress.elapsed(max(0.0, time.monotonic() - start))
        await asyncio.sleep(0.25)


def _options_dict(options: DemoOptions, duration: float, scenario: Scenario) -> dict[str, Any]:
    out = asdict(replace(options, duration_s=duration))
    out["scenario"] = str(options.scenario) if options.scenario else f"ragguard.chaos: {scenario.name}"
    out["out_dir"] = None if options.out_dir is None else str(options.out_dir)
    out["tenants"] = list(options.tenants)
    out["redis_url"] = None if options.redis_url is None else mask_url(options.redis_url)
    return out
