"""The ``@guard`` composition: fallbacks, the typed fallbacks, streams, registries, hooks."""

from __future__ import annotations

import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from core_helpers import Recorder, virtual_time_backends

import ragguard
from ragguard import (
    BreakerOpen,
    BreakerPolicy,
    BreakerState,
    ConfigError,
    DeadlineExceeded,
    Guard,
    Policy,
    QuotaExceeded,
    StagePolicy,
    TenantQuota,
    VectorStoreUnavailable,
    _inject,
    deadline,
    degraded,
)
from ragguard.events import FallbackServed

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


def _trip_on_first(**extra: Any) -> BreakerPolicy:
    return BreakerPolicy(kind="generic", minimum_calls=1, failure_rate_threshold=100, open_for_s=60, **extra)


# -- fallbacks ----------------------------------------------------------------------------------


async def test_fallback_serves_breaker_failures_and_open_breaker_not_value_error(events: Recorder) -> None:
    clock = ragguard.FakeClock()
    g = Guard(Policy(), clock=clock)
    served: list[tuple[str, int]] = []
    behaviour: list[BaseException | None] = []

    async def keyword_search(query: str, k: int) -> list[str]:
        served.append((query, k))
        return [f"bm25:{query}"]

    @g.guard("vector_store", fallback=keyword_search)
    async def search(query: str, k: int) -> list[str]:
        exc = behaviour.pop(0)
        if exc is not None:
            raise exc
        return [f"vec:{query}"]

    behaviour[:] = [None]
    assert await search("q", 3) == ["vec:q"]
    assert degraded() == ()

    behaviour[:] = [ConnectionRefusedError("down"), ConnectionRefusedError("down")]  # retried once
    assert await search("q", 3) == ["bm25:q"]
    assert served == [("q", 3)]
    assert degraded() == ("keyword_search",)

    behaviour[:] = [ValueError("bad k")]
    with pytest.raises(ValueError, match="bad k"):
        await search("q", -1)
    assert len(served) == 1

    g.breaker("vector_store").force_open()
    behaviour[:] = []  # the search is not called while the breaker is open
    assert await search("q2", 5) == ["bm25:q2"]
    await events.settle()
    fallbacks = events.of(FallbackServed)
    assert [(e.stage, e.fallback, e.tenant, e.cause) for e in fallbacks] == [
        ("vector_store", "keyword_search", "default", "ConnectionRefusedError"),
        ("vector_store", "keyword_search", "default", "VectorStoreUnavailable"),
    ]


async def test_without_fallback_an_open_breaker_raises_its_typed_error() -> None:
    g = Guard()

    @g.guard("vector_store")
    async def search() -> None:
        raise AssertionError("not called while open")

    g.breaker("vector_store").force_open()
    with pytest.raises(VectorStoreUnavailable) as info:
        await search()
    assert isinstance(info.value, BreakerOpen)


async def test_quota_exceeded_is_not_served_by_the_fallback() -> None:
    g = Guard(Policy(default_quota=TenantQuota(max_concurrency=1)))
    gate = anyio.Event()

    async def fallback() -> str:
        return "fallback"

    @g.guard("vector_store", fallback=fallback)
    async def search() -> str:
        await gate.wait()
        return "real"

    async with anyio.create_task_group() as tg:
        tg.start_soon(search)
        for _ in range(100):
            if g.quotas.in_flight("default"):
                break
            await anyio.sleep(0)
        with pytest.raises(QuotaExceeded):
            await search()
        gate.set()


async def test_degraded_covers_child_tasks_of_a_tenant_request() -> None:
    g = Guard()

    async def cached() -> str:
        return "stale"

    @g.guard("vector_store", fallback=cached)
    async def search() -> str:
        raise ConnectionResetError()

    async with g.tenant("acme"):
        assert degraded() == ()
        async with anyio.create_task_group() as tg:
            tg.start_soon(search)
        assert degraded() == ("cached",)
    assert degraded() == ()


async def test_outside_a_request_degraded_names_each_fallback_once_and_tenant_starts_afresh() -> None:
    g = Guard()

    async def cached() -> str:
        return "stale"

    @g.guard("vector_store", fallback=cached)
    async def search() -> str:
        raise ConnectionResetError()

    @g.guard("answer")
    async def answer() -> str:
        return "fine"

    for _ in range(50):  # a script calling in a loop, no request scope: each name once, not 50
        await search()
        await answer()
    assert degraded() == ("cached",)
    async with g.tenant("acme"):  # what docs/integrations.md asks for: a scope per request
        assert degraded() == ()
        await answer()
        assert degraded() == ()


# -- the embedding cache -------------------------------------------------------------------------


def _embedding_guard(clock: ragguard.FakeClock, **stage: Any) -> Guard:
    policy = Policy(stages={"embedding": StagePolicy(**stage)} if stage else {})
    return Guard(policy, clock=clock)


async def test_embedding_cache_is_filled_on_success_and_served_on_failure() -> None:
    clock = ragguard.FakeClock()
    g = _embedding_guard(clock)
    fail = [False]

    @g.guard("embedding")
    async def embed(texts: list[str]) -> np.ndarray:
        if fail[0]:
            raise TimeoutError("embedding service timed out")
        return np.array([[len(t), i, 1.0] for i, t in enumerate(texts)], dtype=np.float32)

    first = await embed(["Hello   World", "Foo", "bar"])
    fail[0] = True
    got = await embed([" hello world", "FOO\t"])  # keys are normalised: case and white space
    assert isinstance(got, np.ndarray) and got.shape == (2, 3) and got.dtype == np.float32
    np.testing.assert_array_equal(got, first[:2])
    assert degraded() == ("embedding_cache",)
    with pytest.raises(TimeoutError):  # one text never seen: no partial answer
        await embed(["foo", "never seen"])


async def test_embedding_cache_entries_expire(events: Recorder) -> None:
    clock = ragguard.FakeClock()
    g = _embedding_guard(clock, cache_ttl_s=10.0)
    fail = [False]

    @g.guard("embedding")
    async def embed(texts: list[str]) -> list[list[float]]:
        if fail[0]:
            raise TimeoutError()
        return [[float(len(t))] for t in texts]

    await embed(["a", "bb"])
    fail[0] = True
    clock.advance(9.9)
    assert await embed(["bb", "a"]) == [[2.0], [1.0]]  # list results come back as lists
    clock.advance(0.2)
    with pytest.raises(TimeoutError):
        await embed(["a"])


async def test_embedding_cache_with_texts_passed_by_keyword() -> None:
    clock = ragguard.FakeClock()
    g = _embedding_guard(clock)
    fail = [False]

    @g.guard("embedding")
    async def embed(texts: list[str], *, model: str = "m") -> np.ndarray:
        if fail[0]:
            raise TimeoutError()
        return np.ones((len(texts), 4), dtype=np.float32)

    await embed(texts=["x", "y"])
    fail[0] = True
    got = await embed(texts=["x", "y"])
    assert got.shape == (2, 4)


async def test_embedding_cache_then_user_fallback_then_error() -> None:
    clock = ragguard.FakeClock()
    g = _embedding_guard(clock)

    async def zeros(texts: list[str]) -> np.ndarray:
        return np.zeros((len(texts), 2), dtype=np.float32)

    @g.guard("embedding", fallback=zeros)
    async def embed(texts: list[str]) -> np.ndarray:
        raise TimeoutError()

    got = await embed(["new"])
    assert got.shape == (1, 2) and not got.any()
    assert degraded() == ("zeros",)


async def test_embedding_errors_the_breaker_does_not_count_pass_through() -> None:
    clock = ragguard.FakeClock()
    g = _embedding_guard(clock)

    @g.guard("embedding")
    async def embed(texts: list[str]) -> list[list[float]]:
        if texts == ["boom"]:
            raise ValueError("input too long")
        return [[1.0] for _ in texts]

    await embed(["boom2"])
    with pytest.raises(ValueError):
        await embed(["boom"])


# -- rerank: chunked under a learnt batch limit, then skip -----------------------------------------


class Hit:
    """A retrieved candidate; ``score`` is set by the reranker."""

    def __init__(self, pid: int, score: float = 0.0) -> None:
        self.pid = pid
        self.score = score

    def __repr__(self) -> str:
        return f"Hit({self.pid}, {self.score})"


class Reranker:
    """A pointwise reranker (each candidate scored on its own: closeness to 7), sorted best
    first; runs out of memory above ``capacity`` candidates. Accepts ints (scored the same way)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.sizes: list[int] = []

    async def __call__(self, query: str, hits: list[Any]) -> list[Any]:
        self.sizes.append(len(hits))
        if len(hits) > self.capacity:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if hits and isinstance(hits[0], int):
            return sorted(hits, key=lambda p: abs(p - 7))
        return sorted((Hit(h.pid, -abs(h.pid - 7)) for h in hits), key=lambda h: h.score, reverse=True)


def _pids(hits: list[Hit]) -> list[int]:
    return [h.pid for h in hits]


async def test_rerank_oom_scores_every_candidate_in_chunks(events: Recorder) -> None:
    g = Guard(clock=ragguard.FakeClock())
    model = Reranker(capacity=6)
    rerank = g.guard("rerank")(model)
    hits = [Hit(p) for p in range(20)]
    one_batch = _pids(await Reranker(capacity=100)("q", hits))

    got = await rerank("q", hits)
    assert model.sizes == [20, 10, 5, 5, 5, 5]  # 20 and 10 ran out of memory; 4 chunks of 5 fit
    assert _pids(got) == one_batch  # every candidate scored: the same order as one big batch
    assert degraded() == ("chunked_rerank",)
    assert g.breaker("rerank").state is BreakerState.CLOSED  # OOMs above the floor are not counted

    model.sizes.clear()
    await rerank("q", hits)
    assert model.sizes == [5, 5, 5, 5]  # the limit is remembered
    await events.settle()
    assert all(e.fallback == "chunked_rerank" for e in events.of(FallbackServed))


async def test_rerank_limit_grows_back_slowly_so_oom_does_not_recur_every_few_requests() -> None:
    g = Guard(clock=ragguard.FakeClock())
    model = Reranker(capacity=6)
    rerank = g.guard("rerank")(model)
    hits = [Hit(p) for p in range(12)]
    for _ in range(40):
        got = await rerank("q", hits)
        assert len(got) == 12
    ooms = sum(1 for size in model.sizes if size > 6)
    assert ooms <= 3  # 12 and 6 fit after the first; growth to 7 waits for a run of 20 successes


async def test_rerank_tries_the_floor_before_skipping() -> None:
    g = Guard(Policy(stages={"rerank": StagePolicy(rerank_min_batch=4)}), clock=ragguard.FakeClock())
    model = Reranker(capacity=4)
    rerank = g.guard("rerank")(model)
    hits = [Hit(p) for p in range(7)]
    got = await rerank("q", hits)
    assert model.sizes == [7, 4, 3]  # half of 7 is below the floor: the floor itself, then the rest
    assert _pids(got) == _pids(await Reranker(capacity=100)("q", hits))


async def test_rerank_returns_a_top_k_when_the_reranker_keeps_one() -> None:
    g = Guard(clock=ragguard.FakeClock())

    @g.guard("rerank")
    async def rerank(query: str, hits: list[Hit], top_k: int = 3) -> list[Hit]:
        if len(hits) > 5:
            raise MemoryError()
        scored = sorted((Hit(h.pid, -abs(h.pid - 7)) for h in hits), key=lambda h: h.score, reverse=True)
        return scored[:top_k]

    got = await rerank("q", [Hit(p) for p in range(10)])
    assert _pids(got) == [7, 6, 8]  # the best 3 of all 10, not 3 per chunk


async def test_rerank_candidates_are_declared_not_guessed() -> None:
    g = Guard(clock=ragguard.FakeClock())
    sizes: list[int] = []

    async def rerank(docs: list[Hit]) -> list[Hit]:
        sizes.append(len(docs))
        if len(docs) > 8:
            raise MemoryError()
        return sorted((Hit(h.pid, h.pid) for h in docs), key=lambda h: h.score, reverse=True)

    with pytest.raises(ConfigError, match="candidates"):
        g.guard("rerank")(rerank)  # the default (the second parameter) does not exist here
    with pytest.raises(ConfigError, match="no such parameter"):
        g.guard("rerank", candidates="hits")(rerank)
    guarded = g.guard("rerank", candidates="docs")(rerank)
    got = await guarded(docs=[Hit(p) for p in range(16)])  # by keyword, found by its declared name
    assert sizes == [16, 8, 8]
    assert _pids(got) == list(range(15, -1, -1))


async def test_rerank_score_function_for_items_without_a_score() -> None:
    g = Guard(clock=ragguard.FakeClock())

    @g.guard("rerank", score=lambda pair: pair[1])
    async def rerank(query: str, pids: list[int]) -> list[tuple[int, float]]:
        if len(pids) > 4:
            raise MemoryError()
        return sorted(((p, float(p % 5)) for p in pids), key=lambda pair: pair[1], reverse=True)

    got = await rerank("q", list(range(8)))
    assert [s for _, s in got] == sorted((float(p % 5) for p in range(8)), reverse=True)


async def test_rerank_always_oom_skips_rerank_in_retrieval_order() -> None:
    g = Guard(clock=ragguard.FakeClock())
    model = Reranker(capacity=0)
    rerank = g.guard("rerank")(model)
    hits = [9, 3, 7, 1, 5, 8, 2, 6, 4, 0, 11, 10, 12, 13, 14, 15]
    for request in range(3):
        got = await rerank("q", hits)
        assert got == hits and got is not hits
        assert degraded()[-1] == "skip_rerank"
        # only an OOM at the floor counts: 16 and 8 were too big, 4 says the reranker is unwell
        expected = BreakerState.OPEN if request == 2 else BreakerState.CLOSED
        assert g.breaker("rerank").state is expected
    model.sizes.clear()
    assert await rerank("q", hits) == hits  # open: not even tried
    assert model.sizes == []


async def test_oom_on_batches_above_the_floor_does_not_open_the_breaker() -> None:
    g = Guard(clock=ragguard.FakeClock())
    model = Reranker(capacity=4)
    rerank = g.guard("rerank")(model)
    for _ in range(5):
        model.sizes.clear()
        got = await rerank("q", list(range(32)))
        assert len(got) == 32
    assert g.breaker("rerank").state is BreakerState.CLOSED
    assert model.sizes[0] <= 8  # the remembered limit keeps later calls small


async def test_rerank_errors_other_than_oom_pass_through() -> None:
    g = Guard(clock=ragguard.FakeClock())

    @g.guard("rerank")
    async def rerank(query: str, hits: list[int]) -> list[int]:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        await rerank("q", [1, 2, 3])


# -- streams ------------------------------------------------------------------------------------


async def test_a_stream_holds_its_slot_until_it_closes() -> None:
    g = Guard(Policy(default_quota=TenantQuota(max_concurrency=1)))

    @g.guard("tokens")
    async def tokens(n: int) -> Any:
        for i in range(n):
            yield i
            await anyio.sleep(0)

    @g.guard("other")
    async def other() -> str:
        return "ok"

    async with aclosing(tokens(5)) as stream:
        assert await stream.__anext__() == 0
        assert g.quotas.in_flight("default") == 1
        with pytest.raises(QuotaExceeded):
            await other()
    assert g.quotas.in_flight("default") == 0
    assert await other() == "ok"
    assert [i async for i in tokens(3)] == [0, 1, 2]
    assert g.quotas.in_flight("default") == 0


# On virtual time (the loop's or trio's clock, which the Guard reads too): the items and the
# deadline fall when they are due whatever the machine's load. On the real clock a CPU stall made
# each 20 ms sleep overrun, and the stream ran out of time after one item.
@pytest.mark.parametrize("anyio_backend", virtual_time_backends())
async def test_the_deadline_covers_the_whole_stream() -> None:
    g = Guard(Policy(stages={"tokens": StagePolicy(timeout_s=1.0, breaker=_trip_on_first())}),
              clock=anyio.current_time)

    @g.guard("tokens")
    async def tokens() -> Any:
        for i in range(100):
            await anyio.sleep(0.02)
            yield i

    got: list[int] = []
    started = anyio.current_time()
    with pytest.raises(DeadlineExceeded):
        async with g.deadline(0.11):
            async with aclosing(tokens()) as stream:
                async for item in stream:
                    got.append(item)
    # at the deadline (asyncio's timer wheel fires within its 1 ms bucket)
    assert anyio.current_time() - started == pytest.approx(0.11, abs=0.002)
    assert got == [0, 1, 2, 3, 4]  # each item is quick; the whole stream ran out of time
    assert g.breaker("tokens").state is BreakerState.CLOSED
    assert g.breaker("tokens").metrics().calls == 0


async def test_an_error_mid_stream_counts_against_the_breaker() -> None:
    g = Guard(Policy(stages={"tokens": StagePolicy(breaker=_trip_on_first())}))

    async def fallback() -> Any:
        yield "fallback"

    @g.guard("tokens", fallback=fallback)
    async def tokens() -> Any:
        yield 1
        raise ConnectionResetError("peer went away")

    got = []
    with pytest.raises(ConnectionResetError):
        async with aclosing(tokens()) as stream:
            async for item in stream:
                got.append(item)
    assert got == [1]  # no fallback once items were yielded
    assert g.breaker("tokens").state is BreakerState.OPEN
    assert [i async for i in tokens()] == ["fallback"]  # open: the fallback stream serves
    assert degraded() == ("incomplete: tokens after 1 item", "fallback")


async def test_a_failing_stream_before_any_item_is_served_by_the_fallback() -> None:
    g = Guard(Policy(stages={"tokens": StagePolicy(breaker=_trip_on_first())}))

    def fallback() -> list[str]:
        return ["a", "b"]

    @g.guard("tokens", fallback=fallback)
    async def tokens() -> Any:
        raise ConnectionRefusedError()
        yield  # pragma: no cover

    assert [i async for i in tokens()] == ["a", "b"]
    assert g.breaker("tokens").metrics().failed_calls == 1


async def test_early_close_releases_without_a_verdict() -> None:
    clock = ragguard.FakeClock()
    policy = Policy(stages={"tokens": StagePolicy(breaker=_trip_on_first(half_open_permits=1))})
    g = Guard(policy, clock=clock)
    closed = []

    @g.guard("tokens")
    async def tokens() -> Any:
        try:
            for i in range(10):
                yield i
        finally:
            closed.append(True)

    breaker = g.breaker("tokens")
    async with aclosing(tokens()) as stream:
        await stream.__anext__()
    assert closed == [True]
    assert breaker.metrics().calls == 0  # neither success nor failure

    breaker.force_open()
    breaker.reset()
    # half-open with one permit: a consumer that closes early must give the permit back
    breaker._to(BreakerState.OPEN, clock(), "test")
    clock.advance(61)
    async with aclosing(tokens()) as stream:
        await stream.__anext__()
    assert breaker.state is BreakerState.HALF_OPEN
    assert [i async for i in tokens()] == list(range(10))  # the permit came back for this trial
    assert breaker.state is BreakerState.CLOSED


# -- registries and configuration ---------------------------------------------------------------


async def test_configure_with_a_policy_a_mapping_and_files(tmp_path: Path) -> None:
    @ragguard.guard("search")
    async def slow() -> None:
        await anyio.sleep(10)

    yaml_file = tmp_path / "policy.yaml"
    yaml_file.write_text("stages:\n  search:\n    timeout_s: 0.03\n    breaker: {kind: none}\n")
    toml_file = tmp_path / "policy.toml"
    toml_file.write_text("[stages.search]\ntimeout_s = 0.03\n[stages.search.breaker]\nkind = 'none'\n")
    sources: list[Any] = [
        Policy(stages={"search": StagePolicy(timeout_s=0.03, breaker=BreakerPolicy(kind="none"))}),
        {"stages": {"search": {"timeout_s": 0.03, "breaker": {"kind": "none"}}}},
        yaml_file,
        str(toml_file),
    ]
    for source in sources:
        g = ragguard.configure(source)
        assert ragguard.default_guard() is g
        assert g.stage("search").timeout_s == 0.03
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await slow()  # decorated before configure(): follows the new default registry
        assert time.monotonic() - started < 1.0
        assert g.breaker("search") is None


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ({"stages": {"search": {"timeout_s": -1}}}, ["stages.search.timeout_s", "greater than 0"]),
        (
            {"default_quota": {"max_concurrency": 0}},
            ["default_quota.max_concurrency", "greater than or equal to 1"],
        ),
        (
            {"stages": {"x": {"breaker": {"failure_rate_threshold": 150}}}},
            ["stages.x.breaker.failure_rate_threshold", "a percentage in (0, 100]"],
        ),
        ({"stages": {"x": {"timeout": 1}}}, ["stages.x.timeout"]),
        (42, ["Policy"]),
    ],
)
async def test_configure_rejects_bad_policies_naming_the_field(source: Any, names: list[str]) -> None:
    before = ragguard.default_guard()
    with pytest.raises(ConfigError) as info:
        ragguard.configure(source)
    for name in names:
        assert name in str(info.value)
    assert ragguard.default_guard() is before  # a bad policy leaves the registry alone


async def test_guard_instances_are_independent() -> None:
    a = Guard(Policy(tenants={"acme": TenantQuota(max_concurrency=1)}))
    b = Guard(Policy(tenants={"acme": TenantQuota(max_concurrency=1)}))

    async def work() -> str:
        return "ok"

    on_a, on_b = a.guard("vector_store")(work), b.guard("vector_store")(work)
    a.breaker("vector_store").force_open()
    with pytest.raises(VectorStoreUnavailable):
        await on_a()
    assert await on_b() == "ok"
    assert a.breaker("vector_store") is not b.breaker("vector_store")
    async with a.tenant("acme"), b.tenant("acme"):  # separate quotas: both admitted
        assert a.quotas.in_flight("acme") == b.quotas.in_flight("acme") == 1


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"fallbak": lambda: None}, ["fallbak"]),
        ({"fallback": 3}, ["fallback"]),
        ({"breaker": "tight"}, ["breaker"]),
    ],
)
async def test_bad_guard_options_raise_config_error_naming_them(
    options: dict[str, Any], names: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        Guard().guard("s", **options)
    for name in names:
        assert name in str(info.value)


async def test_guard_rejects_bad_stage_names_and_sync_generator_functions() -> None:
    for bad in ("", None, 3):
        with pytest.raises(ConfigError):
            Guard().guard(bad)  # type: ignore[arg-type]

    def sync(x: int) -> Any:
        yield x

    with pytest.raises(ConfigError, match="async generator"):
        Guard().guard("s")(sync)


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"clock": 5}, "clock"),
        ({"sleep": "soon"}, "sleep"),
        ({"rng": 7}, "rng"),
        ({"quotas": object()}, "quotas"),
    ],
)
async def test_bad_guard_constructor_options_raise_config_error(options: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Guard(Policy(), **options)


async def test_guard_rejects_a_policy_of_the_wrong_type() -> None:
    with pytest.raises(ConfigError, match="Policy"):
        Guard({"stages": {}})  # type: ignore[arg-type]


# -- events and the chaos hook -------------------------------------------------------------------


async def test_a_listener_that_raises_never_breaks_the_call(events: Recorder) -> None:
    patient = BreakerPolicy(kind="vector_store_unavailable", minimum_calls=100, window_size=100)
    g = Guard(Policy(stages={"vector_store": StagePolicy(breaker=patient)}))

    def bad_listener(event: Any) -> None:
        raise RuntimeError("listener bug")

    async def bad_async_listener(event: Any) -> None:
        raise RuntimeError("async listener bug")

    ragguard.events.bus.subscribe(bad_listener)
    ragguard.events.bus.subscribe(bad_async_listener)
    g.breaker("vector_store").bus.subscribe(bad_listener)

    async def fallback(fail: bool) -> str:
        return "fallback"

    @g.guard("vector_store", fallback=fallback)
    async def search(fail: bool) -> str:
        if fail:
            raise ConnectionRefusedError()
        return "ok"

    for _ in range(3):
        assert await search(False) == "ok"
        assert await search(True) == "fallback"
        await events.settle()
    assert len(events.of(FallbackServed)) == 3  # the good listener still gets every event


async def test_the_chaos_injector_sees_stage_and_tenant() -> None:
    g = Guard(Policy(stages={"search": StagePolicy(breaker=_trip_on_first())}))
    seen: list[tuple[str, str]] = []

    async def injector(stage: str, tenant: str, call: Any) -> Any:
        seen.append((stage, tenant))
        if tenant == "victim":
            raise ConnectionResetError("injected")
        return await call()

    @g.guard("search")
    async def search(q: str) -> str:
        return f"hit:{q}"

    _inject.install(injector)
    assert await search("a") == "hit:a"
    async with g.tenant("acme"):
        assert await search("b") == "hit:b"
    async with g.tenant("victim"):
        with pytest.raises(ConnectionResetError):
            await search("c")
    assert seen == [("search", "default"), ("search", "acme"), ("search", "victim")]
    assert g.breaker("search").metrics().failed_calls == 1  # injected faults count like real ones
    _inject.uninstall(injector)
    assert _inject.active is None


async def test_a_cancelled_consumer_releases_the_stream_slot_and_permit() -> None:
    clock = ragguard.FakeClock()
    policy = Policy(
        default_quota=TenantQuota(max_concurrency=1),
        stages={"tokens": StagePolicy(breaker=_trip_on_first(half_open_permits=1))},
    )
    g = Guard(policy, clock=clock)
    breaker = g.breaker("tokens")
    breaker._to(BreakerState.OPEN, clock(), "test")
    clock.advance(61)

    @g.guard("tokens")
    async def tokens(pause: float) -> Any:
        yield 0
        await anyio.sleep(pause)
        yield 1

    with anyio.move_on_after(0.05) as scope:
        async with aclosing(tokens(10)) as stream:
            async for _ in stream:
                pass
    assert scope.cancelled_caught
    assert g.quotas.in_flight("default") == 0
    assert breaker.state is BreakerState.HALF_OPEN
    assert [i async for i in tokens(0)] == [0, 1]  # the trial permit was given back
    assert breaker.state is BreakerState.CLOSED


async def test_a_cancelled_rate_wait_gives_its_token_back() -> None:
    clock = ragguard.FakeClock(auto_advance=False)  # the rate wait lasts until the test moves time
    g = Guard(Policy(tenants={"acme": TenantQuota(rate_per_s=20, burst=1, max_wait_s=1)}), clock=clock)
    async with g.tenant("acme"):
        pass
    with pytest.raises(QuotaExceeded) as before:
        async with deadline(0.01), g.tenant("acme"):  # the wait (50 ms) would outlast the deadline
            pass
    with anyio.move_on_after(0.01) as scope:  # waits for its token, then gives up
        async with g.tenant("acme"):
            raise AssertionError("not admitted in time")
    assert scope.cancelled_caught
    with pytest.raises(QuotaExceeded) as after:
        async with deadline(0.01), g.tenant("acme"):
            pass
    assert after.value.reason == "deadline"
    assert after.value.retry_after_s == pytest.approx(before.value.retry_after_s)  # nothing spent


async def test_fallbacks_outside_a_request_do_not_accumulate() -> None:
    g = Guard()

    async def keyword(q: int) -> int:
        return -q

    @g.guard("vector_store", fallback=keyword)
    async def search(q: int) -> int:
        raise AssertionError("breaker is open")

    g.breaker("vector_store").force_open()
    started = time.monotonic()
    for i in range(20_000):
        assert await search(i) == -i
    assert time.monotonic() - started < 5.0
    assert degraded() == ("keyword",)  # named once, not once per call: no unbounded growth


async def test_a_hung_vector_store_trips_its_breaker_through_stage_timeouts() -> None:
    g = Guard(Policy(stages={"vector_store": StagePolicy(timeout_s=0.02)}))
    calls = 0

    async def hung(vec: list[float], k: int) -> list[str]:
        nonlocal calls
        calls += 1
        await anyio.sleep(10)
        return []

    async def keyword(vec: list[float], k: int) -> list[str]:
        return ["kw"]

    search = g.guard("vector_store", fallback=keyword)(hung)
    for _ in range(6):
        assert await search([0.0], 3) == ["kw"]
    assert g.breaker("vector_store").state is BreakerState.OPEN
    before = calls
    assert await search([0.0], 3) == ["kw"]  # open: the hung store is not even called
    assert calls == before


async def test_breaker_false_gives_a_composite_step_no_breaker_of_its_own() -> None:
    """A step that composes guarded stages takes ``breaker=False``: its inner stages' breakers count
    their dependencies; its own fallback answers when they fail, and nothing counts twice."""
    g = Guard(Policy(stages={"embedding": StagePolicy(breaker=_trip_on_first(), timeout_s=1.0)}))

    @g.guard("embedding")
    async def embed(texts: list[str]) -> list[list[float]]:
        raise ConnectionRefusedError("embedding service down")

    async def keyword_only(query: str) -> list[str]:
        return [f"bm25:{query}"]

    @g.guard("retrieval", fallback=keyword_only, breaker=False)
    async def retrieve(query: str) -> list[str]:
        await embed([query])
        return [f"vec:{query}"]

    for _ in range(5):
        assert await retrieve("q") == ["bm25:q"]
    assert g.breaker("retrieval") is None
    assert g.breaker("embedding").state is BreakerState.OPEN
    with pytest.raises(ConfigError, match="breaker=False"):
        g.guard("embedding", breaker=False)(embed)
