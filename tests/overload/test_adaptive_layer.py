"""The adaptive limit as a layer of a Guard: shedding with Overloaded, priority from the tenant's
quota or the context, out-of-memory pressure, cancellation, the front doors' statuses, the policy."""

from __future__ import annotations

import asyncio
import pickle
import random
from typing import Any

import grpc
import pytest
from grpc import aio
from overload_helpers import settle

import ragguard
from ragguard import (
    AdaptivePolicy,
    ConfigError,
    FakeClock,
    Guard,
    Overloaded,
    Policy,
    StagePolicy,
    TenantQuota,
    ThrottlePolicy,
)
from ragguard.asgi._status import http_status_for
from ragguard.grpc import GuardServerInterceptor
from ragguard.grpc._status import status_for
from ragguard.overload import limiters, status


def _policy(**adaptive: Any) -> Policy:
    opts: dict[str, Any] = {"min_limit": 1, "initial_limit": 2, "max_limit": 2, "probe_limit": 2,
                            "probe_samples": 1, "max_queue": 1.0, "early_queue": 1.0}
    opts.update(adaptive)
    return Policy(
        stages={"search": StagePolicy(adaptive=AdaptivePolicy(**opts))},
        tenants={"nightly": TenantQuota(priority="batch"), "ops": TenantQuota(priority="critical")},
    )


class Gate:
    """A dependency the test opens call by call."""

    def __init__(self) -> None:
        self.waiting: list[asyncio.Future[str]] = []

    async def __call__(self, q: str) -> str:
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        return await fut

    def open_one(self, value: str = "ok") -> None:
        self.waiting.pop(0).set_result(value)


async def _as(g: Guard, tenant: str, fn: Any, *args: Any) -> Any:
    async with g.tenant(tenant):
        return await fn(*args)


@pytest.mark.anyio
async def test_calls_over_the_limit_queue_by_priority_and_the_overflow_is_shed() -> None:
    g = Guard(_policy(), clock=FakeClock(auto_advance=False), rng=random.Random(1))
    dep = Gate()
    search = g.guard("search")(dep)
    running = [asyncio.create_task(_as(g, "acme", search, "q")) for _ in range(2)]
    await settle()
    assert len(dep.waiting) == 2  # the limit: 2 in flight
    batch = asyncio.create_task(_as(g, "nightly", search, "q"))
    await settle()
    critical = asyncio.create_task(_as(g, "ops", search, "q"))  # the queue (2 x 1.0) is full...
    interactive = asyncio.create_task(_as(g, "acme", search, "q"))
    await settle()
    with pytest.raises(Overloaded) as shed:  # ...so the batch call was shed first
        await batch
    assert (shed.value.reason, shed.value.priority, shed.value.tenant) == ("queue", "batch", "nightly")
    dep.open_one("first")
    await settle()
    assert await running[0] == "first"
    assert len(dep.waiting) == 2  # the critical call took the freed slot
    dep.open_one("second")
    dep.open_one("critical")
    await settle()
    assert await critical == "critical"
    dep.open_one("last")
    await settle()
    assert {await running[1], await interactive} == {"second", "last"}
    snap = status(g)["search"]["limit"]
    assert snap["shed"]["batch"] == 1 and snap["in_flight"] == 0 and snap["queued"] == 0


@pytest.mark.anyio
async def test_a_header_or_context_priority_overrides_the_tenants() -> None:
    clock = FakeClock(auto_advance=False)
    g = Guard(_policy(max_queue=0.5, early_queue=0.5), clock=clock, rng=random.Random(1))
    dep = Gate()
    search = g.guard("search")(dep)
    held = [asyncio.create_task(_as(g, "acme", search, "q")) for _ in range(2)]
    await settle()

    async def as_critical() -> Any:
        with ragguard.priority("critical"):
            return await _as(g, "nightly", search, "q")

    queued = asyncio.create_task(_as(g, "acme", search, "q"))
    await settle()
    boss = asyncio.create_task(as_critical())  # a batch tenant, but this call is critical
    await settle()
    with pytest.raises(Overloaded):
        await queued  # the interactive call made room for the critical one
    for _ in range(3):
        dep.open_one()
        await settle()
    assert await boss == "ok"
    await asyncio.gather(*held)
    with pytest.raises(ragguard.InvalidInput, match="priority must be one of"):
        with ragguard.priority("urgent"):
            pass


@pytest.mark.anyio
async def test_cancelling_a_queued_call_releases_its_place_and_a_running_one_its_slot() -> None:
    g = Guard(_policy(), clock=FakeClock(auto_advance=False), rng=random.Random(1))
    dep = Gate()
    search = g.guard("search")(dep)
    running = [asyncio.create_task(_as(g, "acme", search, "q")) for _ in range(2)]
    queued = asyncio.create_task(_as(g, "acme", search, "q"))
    await settle()
    lim = limiters(g)["search"]
    assert (lim.in_flight, len(lim.waiters)) == (2, 1)
    queued.cancel()
    running[0].cancel()
    await settle()
    assert (lim.in_flight, len(lim.waiters)) == (1, 0)
    dep.waiting[-1].set_result("x")
    await settle()
    assert lim.in_flight == 0


@pytest.mark.anyio
async def test_latency_samples_move_the_limit_and_out_of_memory_backs_it_off() -> None:
    clock = FakeClock()
    g = Guard(Policy(stages={"rerank": StagePolicy(preset=None, adaptive=AdaptivePolicy(
        min_limit=1, initial_limit=20, max_limit=100, probe_samples=5, probe_limit=3, min_samples=5,
        window_s=0.1, backoff=0.5))}), clock=clock, rng=random.Random(1))
    latency = [0.01]
    oom = [False]

    @g.guard("rerank")
    async def rerank(q: str) -> str:
        await clock.sleep(latency[0])
        if oom[0]:
            raise MemoryError("out of memory")
        return q

    for _ in range(5):
        await rerank("q")  # the first baseline probe
    lim = limiters(g)["rerank"]
    assert lim.gradient.min_rtt == pytest.approx(0.01) and lim.limit == 20
    latency[0] = 0.05  # five times slower: the limit shrinks
    for _ in range(40):
        await rerank("q")
    assert lim.limit < 20
    before = lim.limit
    oom[0] = True
    clock.advance(1.0)
    with pytest.raises(MemoryError):
        await rerank("q")
    assert lim.limit <= max(1, before // 2) and lim.pressed == {"out_of_memory": 1}


def test_overloaded_maps_to_unavailable_and_503_with_retry_after() -> None:
    exc = Overloaded("search", 0.25, "queue", priority="batch", tenant="nightly")
    code, details, trailers = status_for(exc)  # type: ignore[misc]
    assert code == grpc.StatusCode.UNAVAILABLE and "overloaded" in details
    assert dict(trailers) == {"retry-after": "0.250", "grpc-retry-pushback-ms": "250"}
    http = http_status_for(exc)
    assert http is not None
    status_code, headers, body = http
    assert status_code == 503 and dict(headers)[b"retry-after"] == b"1"
    assert body["error"] == "Overloaded" and body["retry_after_s"] == 0.25
    again = pickle.loads(pickle.dumps(exc))
    assert (again.stage, again.reason) == ("search", "queue")
    assert (again.priority, again.tenant) == ("batch", "nightly")


@pytest.mark.anyio
async def test_a_grpc_front_door_reads_the_priority_header_and_answers_unavailable() -> None:
    g = Guard(_policy(max_queue=0.5, early_queue=0.5), rng=random.Random(1))
    dep = Gate()
    search = g.guard("search")(dep)

    async def handler(request: bytes, context: aio.ServicerContext[Any, Any]) -> bytes:
        return (await search(request.decode())).encode()

    server = aio.server(interceptors=[GuardServerInterceptor(guard=g)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "t.Svc", {"Call": grpc.unary_unary_rpc_method_handler(handler)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = aio.insecure_channel(f"127.0.0.1:{port}")
    rpc = channel.unary_unary("/t.Svc/Call")

    async def call(request: bytes, metadata: Any) -> bytes:
        return await rpc(request, metadata=metadata)  # type: ignore[no-any-return]
    try:
        held = [asyncio.create_task(call(b"q", metadata=(("x-tenant-id", "acme"),))) for _ in range(2)]
        while len(dep.waiting) < 2:
            await asyncio.sleep(0.01)
        batch = asyncio.create_task(call(b"q", metadata=(("x-tenant-id", "acme"), ("x-priority", "batch"))))
        while not limiters(g)["search"].waiters:
            await asyncio.sleep(0.01)
        urgent = (("x-tenant-id", "acme"), ("x-priority", "critical"))
        critical = asyncio.create_task(call(b"q", metadata=urgent))
        with pytest.raises(aio.AioRpcError) as info:
            await batch
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert dict(info.value.trailing_metadata())["retry-after"]
        for _ in range(3):
            while not dep.waiting:
                await asyncio.sleep(0.01)
            dep.open_one()
        assert await critical == b"ok"
        await asyncio.gather(*held)
        with pytest.raises(aio.AioRpcError) as bad:
            await call(b"q", metadata=(("x-priority", "urgent"),))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await channel.close()
        await server.stop(None)


@pytest.mark.parametrize(("field", "value"), [
    ("min_limit", 0), ("backoff", 1.0), ("tolerance", -1), ("percentile", 0), ("max_wait_s", -1),
])
def test_adaptive_policy_ranges(field: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        AdaptivePolicy(**{field: value})
    assert info.value.field == field


def test_adaptive_policy_order_and_file_loading() -> None:
    with pytest.raises(ConfigError, match="min_limit <= initial_limit <= max_limit"):
        AdaptivePolicy(min_limit=10, initial_limit=5)
    with pytest.raises(ConfigError, match="early_queue"):
        AdaptivePolicy(max_queue=1.0, early_queue=2.0)
    p = Policy.parse({"stages": {"vector_store": {"adaptive": {"max_limit": 32}, "hedge": {"quantile": 0.9}}},
                      "tenants": {"nightly": {"priority": "batch", "weight": 0.5}}})
    st = p.stage("vector_store")
    assert st.adaptive is not None and st.adaptive.max_limit == 32
    assert st.breaker.kind == "vector_store_unavailable"  # the standard stage keeps its breaker
    assert st.hedge is not None and st.hedge.quantile == 0.9
    assert p.quota("nightly").priority == "batch" and p.quota("nightly").weight == 0.5
    with pytest.raises(ConfigError, match="priority"):
        Policy.parse({"tenants": {"x": {"priority": "urgent"}}})


def test_a_generic_breaker_does_not_count_a_nested_stages_shedding() -> None:
    from ragguard.breakers import counts_by_default

    assert not counts_by_default(Overloaded("inner", 0.1, "limit"))
    assert counts_by_default(RuntimeError("the dependency failed"))


@pytest.mark.anyio
async def test_each_overloaded_reason_is_given_when_its_docstring_says() -> None:
    """limit: no place to queue on arrival (max_queue 0, max_wait_s 0); queue: waited out max_wait_s;
    deadline: the deadline left no time to queue, or the wait it allowed ran out; throttled: refused
    by client-side throttling. Each reason is documented with its case."""
    clock = FakeClock(auto_advance=False)

    async def reason_of(g: Guard, *, deadline_s: float | None = None, advance_s: float = 0.0) -> str:
        dep = Gate()
        search = g.guard("search")(dep)
        held = [asyncio.create_task(_as(g, "acme", search, "q")) for _ in range(2)]  # the limit: 2
        await settle()

        async def one() -> Any:
            with g.deadline(deadline_s):
                return await _as(g, "acme", search, "q")

        over = asyncio.create_task(one())
        await settle()
        clock.advance(advance_s)
        await settle()
        with pytest.raises(Overloaded) as shed:
            await over
        for _ in held:
            dep.open_one()
        await asyncio.gather(*held)
        return shed.value.reason

    assert await reason_of(Guard(_policy(max_queue=0.0, early_queue=0.0), clock=clock)) == "limit"
    assert await reason_of(Guard(_policy(max_wait_s=0.0), clock=clock)) == "limit"
    assert await reason_of(Guard(_policy(max_wait_s=0.5), clock=clock), advance_s=0.6) == "queue"
    cut = Guard(_policy(max_wait_s=0.5), clock=clock)
    assert await reason_of(cut, deadline_s=0.2, advance_s=0.3) == "deadline"
    no_time = Guard(Policy(stages={"search": StagePolicy(min_attempt_s=0.1, adaptive=AdaptivePolicy(
        min_limit=1, initial_limit=2, max_limit=2, probe_limit=2, probe_samples=1))}), clock=clock)
    assert await reason_of(no_time, deadline_s=0.05) == "deadline"

    throttled = Guard(Policy(stages={"llm": StagePolicy(throttle=ThrottlePolicy(max_reject=0.9))}),
                      clock=clock, rng=random.Random(1))

    @throttled.guard("llm")
    async def llm() -> str:
        raise Overloaded("provider", 1.0, "limit")  # the dependency rejects every call

    reasons = set()
    for _ in range(50):
        with pytest.raises(Overloaded) as refused:
            await llm()
        reasons.add(refused.value.reason)
    assert "throttled" in reasons

    doc = Overloaded.__doc__ or ""
    for reason in ("limit", "queue", "deadline", "throttled"):
        assert f'- ``"{reason}"``: ' in doc, reason


def _slow_stage(clock: FakeClock, **adaptive: Any) -> tuple[Guard, Any, list[float]]:
    """A Guard with stage ``embed`` (a 50 ms attempt timer, an adaptive limit whose baseline probe
    takes one call) over a dependency taking ``latency[0]`` seconds."""
    opts: dict[str, Any] = {"min_limit": 1, "initial_limit": 16, "max_limit": 16, "probe_samples": 1,
                            "window_s": 0.01, "min_samples": 4, "max_queue": 0.0, "early_queue": 0.0}
    g = Guard(Policy(stages={"embed": StagePolicy(preset=None, timeout_s=0.05, adaptive=AdaptivePolicy(
        **{**opts, **adaptive}))}), clock=clock, rng=random.Random(1))
    latency = [0.01]

    @g.guard("embed")
    async def embed(q: str) -> str:
        await clock.sleep(latency[0])
        return q

    return g, embed, latency


@pytest.mark.anyio
async def test_attempts_cut_by_their_timer_shrink_a_limit_whose_tolerance_reaches_past_the_timer() -> None:
    """A baseline of 10 ms with a tolerance of 6 tolerates 70 ms, past the stage's 50 ms timer: an
    attempt cut there is counted as out of time (longer than its caller allowed), not as a 50 ms
    latency within the tolerance, so a dependency that times out every call brings the limit down."""
    clock = FakeClock()
    g, embed, latency = _slow_stage(clock, tolerance=6.0)
    await embed("q")  # the baseline probe: 10 ms
    lim = limiters(g)["embed"]
    assert lim.gradient.min_rtt == pytest.approx(0.01) and lim.limit == 16

    async def hurried() -> str:
        with g.deadline(0.005):
            return await embed("q")  # type: ignore[no-any-return]

    results = await asyncio.gather(*(hurried() for _ in range(8)), return_exceptions=True)
    assert all(isinstance(r, ragguard.DeadlineExceeded) for r in results), results
    await asyncio.gather(*(embed("q") for _ in range(4)))  # four answers in 10 ms end the window
    assert lim.limit == 16  # cut before the baseline's 10 ms, the eight said nothing of the dependency
    latency[0] = 1.0  # the dependency hangs: every attempt runs into the 50 ms timer
    for _ in range(3):
        results = await asyncio.gather(*(embed("q") for _ in range(lim.limit)), return_exceptions=True)
        assert all(isinstance(r, ragguard.StageTimeout) for r in results), results
    assert lim.limit <= 2


@pytest.mark.anyio
async def test_an_attempt_cancelled_once_the_deadline_passed_counts_as_out_of_time() -> None:
    """A front door cancels a handler when the request's deadline passes (gRPC, ASGI); an attempt
    cancelled then was as slow as one its own timer cut. Cancelled before the deadline, it says
    nothing of the dependency."""
    clock = FakeClock(auto_advance=False)
    g, _, _ = _slow_stage(clock, min_samples=1, window_s=0.01)
    dep = Gate()
    search = g.guard("embed")(dep)
    first = asyncio.create_task(search("q"))
    await settle()
    dep.open_one()  # the baseline probe: an answer at once
    await first
    lim = limiters(g)["embed"]
    assert lim.limit == 16 and not lim.gradient.probing

    async def request(budget_s: float) -> Any:
        with g.deadline(budget_s):
            return await search("q")

    early = asyncio.create_task(request(1.0))
    await settle()
    clock.advance(0.02)
    early.cancel()  # the caller went away within its deadline: no sample
    await settle()
    assert lim.limit == 16 and lim.in_flight == 0

    late = asyncio.create_task(request(0.03))
    await settle()
    clock.advance(0.04)  # the deadline passes, and the front door cancels as the attempt timer fires
    late.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late
    assert lim.in_flight == 0
    assert lim.limit == 1  # out of time: the window's median ran out of time, the limit halved
