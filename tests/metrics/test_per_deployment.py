"""Per deployment, as an operator sees it (issue 28): ``Guard.status()`` lists a keyed stage's keys
and each model group's deployments, ``ragguard top`` draws them, the Prometheus scrape has each
key's series (bounded by ``max_keys``, whatever the callers send) and counts failovers, and a
key's breaker opened on one replica shows open in another replica's status through a real
redis-server."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from ragguard import BreakerOpen, FakeClock, Guard, Policy
from ragguard.metrics import PrometheusExporter
from ragguard.redis import RedisBackend
from ragguard_tools.top import Top

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

BREAKER = {"minimum_calls": 2, "window_size": 2, "failure_rate_threshold": 50, "open_for_s": 30}


@pytest.fixture(autouse=True)
def _isolated(isolated_registry: None) -> None:
    pass


def _group_guard(**stage: Any) -> tuple[Guard, Any]:
    """A Guard with the model group ``chat`` (``primary`` refuses every call, ``backup`` answers)
    on the keyed stage ``chat``, and the group bound."""
    policy = Policy.parse({
        "stages": {"chat": {"breaker": BREAKER, "retry": {"attempts": 1}, "max_keys": 4, **stage}},
        "groups": {"chat": {"deployments": [{"name": "primary"}, {"name": "backup", "priority": 1}]}},
    })  # fmt: skip
    g = Guard(policy, clock=FakeClock(auto_advance=False))

    async def primary(question: str) -> str:
        raise ConnectionRefusedError("primary is down")

    async def backup(question: str) -> str:
        return "from backup"

    return g, g.group("chat", {"primary": primary, "backup": backup})


def _samples(exporter: PrometheusExporter, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples called ``name`` of a real scrape, by their sorted labels."""
    out = {}
    for family in text_string_to_metric_families(exporter.scrape().decode()):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = float(s.value)
    return out


async def _settle() -> None:
    for _ in range(3):  # events reach listeners on a later loop iteration
        await asyncio.sleep(0)


async def test_status_lists_each_key_and_each_groups_deployments_with_their_breakers() -> None:
    g, chat = _group_guard()
    for i in range(4):
        assert await chat(str(i)) == "from backup"
    now = g.status()
    assert now["ok"] is False and now["open"] == ["chat[primary]"]  # the key, by its breaker's name
    stage = now["stages"]["chat"]
    assert stage["breaker"]["state"] == "closed"  # the stage's own instance: nothing ran on it
    assert stage["keyed"] == {"max_keys": 4, "kept": 2, "overflowed": 0, "evicted": 0}
    primary, backup = stage["keys"]["primary"], stage["keys"]["backup"]
    assert primary["breaker"]["name"] == "chat[primary]" and primary["breaker"]["state"] == "open"
    assert primary["breaker"]["retry_after_s"] == 30.0
    assert backup["breaker"]["state"] == "closed"
    assert primary["declared"] is True and primary["in_flight"] == 0
    assert now["groups"] == {
        "chat": {
            "stage": "chat",
            "strategy": "ordered",
            "deployments": {
                "primary": {"key": "primary", "state": "open"},
                "backup": {"key": "backup", "state": "closed"},
            },
        }
    }


async def test_a_keys_limits_and_calls_in_flight_are_in_its_status_and_its_gauge() -> None:
    policy = Policy.parse({"stages": {"gen": {
        "max_keys": 2, "adaptive": {"min_limit": 1, "max_limit": 8, "initial_limit": 4},
        "limits": {"rpm": 600}}}})  # fmt: skip
    g = Guard(policy)
    exporter = PrometheusExporter(guards=g)
    held = asyncio.Event()

    @g.guard("gen", key="model")
    async def call(model: str) -> str:
        await held.wait()
        return model

    task = asyncio.create_task(call("gpt-a"))
    await _settle()
    entry = g.status()["stages"]["gen"]["keys"]["gpt-a"]
    assert entry["in_flight"] == 1
    assert (entry["limit"]["min_limit"], entry["limit"]["max_limit"]) == (1, 8)
    at = (("key", "gpt-a"), ("stage", "gen"))
    assert _samples(exporter, "ragguard_adaptive_limit")[at] == entry["limit"]["limit"]
    assert entry["limits"] == {"rpm": 600, "tpm": None, "window_s": 60.0}
    assert _samples(exporter, "ragguard_key_in_flight") == {at: 1.0}
    assert _samples(exporter, "ragguard_adaptive_in_flight")[at] == 1.0
    held.set()
    assert await task == "gpt-a"
    assert _samples(exporter, "ragguard_key_in_flight") == {at: 0.0}


async def test_the_scrape_has_each_keys_breaker_and_counts_the_groups_failovers() -> None:
    g, chat = _group_guard()
    exporter = PrometheusExporter(guards=g, max_breakers=1).start()  # one breaker label: the rest "other"
    try:
        for i in range(4):
            assert await chat(str(i)) == "from backup"
        await _settle()
        states = _samples(exporter, "ragguard_breaker_state")
        # a kept key's breaker has its series past the max_breakers cap: bounded by max_keys
        assert states[(("breaker", "chat[primary]"), ("state", "open"))] == 1.0
        assert states[(("breaker", "chat[backup]"), ("state", "closed"))] == 1.0
        failovers = _samples(exporter, "ragguard_failovers_total")
        assert failovers == {
            (("deployment", "primary"), ("group", "chat"), ("reason", "failure"), ("to", "backup")): 2.0,
            (("deployment", "primary"), ("group", "chat"), ("reason", "open"), ("to", "backup")): 2.0,
        }  # two calls failed on primary, then its breaker opened and two skipped it without a call
        assert _samples(exporter, "ragguard_keys") == {(("stage", "chat"),): 2.0}
        assert set(_samples(exporter, "ragguard_key_in_flight")) == {
            (("key", "primary"), ("stage", "chat")),
            (("key", "backup"), ("stage", "chat")),
        }
    finally:
        exporter.close()


async def test_a_callers_many_keys_never_grow_the_series_past_max_keys() -> None:
    stage = {"max_keys": 4, "breaker": BREAKER, "retry": {"attempts": 1}}
    g = Guard(Policy.parse({"stages": {"gen": stage}}), clock=FakeClock(auto_advance=False))
    exporter = PrometheusExporter(guards=g, max_breakers=2).start()

    @g.guard("gen", key="model")
    async def call(model: str) -> str:
        raise ConnectionResetError(model)

    async def hostile(first: int, n: int) -> None:
        for i in range(first, first + n):
            for _ in range(2):  # each key's breaker opens
                with pytest.raises((ConnectionResetError, BreakerOpen)):
                    await call(f"bad-{i}")
            await asyncio.sleep(0)

    def series(text: str) -> int:
        return sum(1 for line in text.splitlines() if line and not line.startswith("#"))

    try:
        await hostile(0, 50)
        await _settle()
        warm = exporter.scrape().decode()
        await hostile(50, 1000)
        await _settle()
        after = exporter.scrape().decode()
        keys = g.stage("gen").keys
        assert keys is not None and len(keys) == 4
        assert _samples(exporter, "ragguard_key_overflow_total")[(("stage", "gen"),)] >= 1900
        assert len(_samples(exporter, "ragguard_key_in_flight")) <= 4
        states = _samples(exporter, "ragguard_breaker_state")
        # 5 states a breaker: the keys kept now, and the names of a label of their own (max_breakers)
        assert len(states) <= (4 + 2) * 5
        assert series(after) <= series(warm)  # keys come and go, their series with them
        assert len(exporter._last_states) <= 3  # transitions kept only for the labelled names
    finally:
        exporter.close()


def test_top_draws_each_key_under_its_stage_and_each_groups_deployments() -> None:
    async def run() -> dict[str, Any]:
        g, chat = _group_guard(adaptive={"min_limit": 1, "max_limit": 8, "initial_limit": 3})
        for i in range(4):
            await chat(str(i))
        return g.status()

    snapshot = asyncio.run(run())
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(
        Top("http://x/status", fetcher=lambda url: snapshot).frame()
    )
    lines = out.getvalue().splitlines()
    breakers = lines[lines.index(next(line for line in lines if line.startswith("Breakers"))) :]
    chat_at = next(i for i, line in enumerate(breakers) if line.split()[:2] == ["chat", "closed"])
    assert breakers[chat_at + 1].split()[:3] == ["primary", "open", "30.0s"]  # not closed: first
    assert breakers[chat_at + 2].split()[:2] == ["backup", "closed"]
    limits = [line.split() for line in lines if line.startswith("  primary") or line.startswith("  backup")]
    assert ["primary", "3", "1-8", "0", "0"] in limits  # each key's own adaptive limit
    assert any("chat: 2 of 4 kept, 0 on the overflow, 0 evicted" in line for line in lines)
    assert any("chat: primary open, backup closed" in line for line in lines)


async def test_a_keys_breaker_opened_by_one_replica_shows_open_in_anothers_status(redis_server: Any) -> None:
    policy = Policy.parse({"stages": {"gen": {"max_keys": 8, "breaker": BREAKER, "retry": {"attempts": 1}}}})
    clients = [aioredis.Redis(host=redis_server.host, port=redis_server.port, socket_timeout=2.0)
               for _ in range(2)]  # fmt: skip
    replicas = [Guard(policy, backend=RedisBackend(c, prefix="keyed-status")) for c in clients]
    calls = []
    for g in replicas:

        @g.guard("gen", key="model")
        async def call(model: str, fail: bool = False) -> str:
            if fail:
                raise ConnectionResetError(model)
            return model

        calls.append(call)
    one, two = calls
    try:
        assert await two("gpt-a") == "gpt-a"  # the second replica keeps the key too, closed
        assert replicas[1].status()["stages"]["gen"]["keys"]["gpt-a"]["breaker"]["state"] == "closed"
        for _ in range(2):
            with pytest.raises(ConnectionResetError):
                await one("gpt-a", fail=True)
        for _ in range(300):  # the second replica reads the shared state at its next sync
            if "gen[gpt-a]" in replicas[1].status()["open"]:
                break
            await asyncio.sleep(0.01)
        now = replicas[1].status()
        assert now["open"] == ["gen[gpt-a]"] and now["ok"] is False
        assert now["stages"]["gen"]["keys"]["gpt-a"]["breaker"]["state"] == "open"
    finally:
        for g in replicas:
            await g.aclose()
        for c in clients:
            await c.aclose()


async def test_the_overflow_is_key_other_and_an_unkeyed_stages_limit_key_empty() -> None:
    g = Guard(Policy.parse({"stages": {"gen": {"max_keys": 1, "adaptive": {}}, "plain": {"adaptive": {}}}}))
    exporter = PrometheusExporter(guards=g)

    @g.guard("gen", key="model")
    async def call(model: str) -> str:
        return model

    @g.guard("plain")
    async def plain(x: int) -> int:
        return x

    assert [await call("a"), await call("b"), await plain(1)] == ["a", "b", 1]  # b: past max_keys
    assert set(_samples(exporter, "ragguard_adaptive_limit")) == {
        (("key", "a"), ("stage", "gen")),
        (("key", "__other__"), ("stage", "gen")),
        (("key", ""), ("stage", "plain")),
    }
    assert _samples(exporter, "ragguard_key_overflow_total") == {(("stage", "gen"),): 1.0}


async def test_a_failover_is_an_event_on_the_callers_span_and_an_otel_count() -> None:
    sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from ragguard import metrics

    spans = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    recorder = metrics.OTelMetrics(MeterProvider(metric_readers=[reader])).start()
    metrics.enable_tracing(provider)
    try:
        _, chat = _group_guard()
        with provider.get_tracer("test").start_as_current_span("request"):
            assert await chat("q") == "from backup"
        await _settle()
    finally:
        metrics.disable_tracing()
        recorder.close()
    (request,) = [s for s in spans.get_finished_spans() if s.name == "request"]
    (event,) = [e for e in request.events if e.name == "ragguard.failover"]
    assert dict(event.attributes or {}) == {
        "ragguard.group": "chat", "ragguard.deployment": "primary", "ragguard.reason": "failure",
        "ragguard.to": "backup", "error.type": "ConnectionRefusedError", "ragguard.breaker": "chat[primary]",
    }  # fmt: skip
    data = reader.get_metrics_data()
    points = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
              if m.name == "ragguard.failovers" for p in m.data.data_points]  # fmt: skip
    assert [(dict(p.attributes), p.value) for p in points] == [({
        "ragguard.group": "chat", "ragguard.deployment": "primary", "ragguard.reason": "failure",
        "ragguard.to": "backup"}, 1)]  # fmt: skip


async def test_the_links_name_each_keys_shared_breaker_bounded_as_the_keys(redis_server: Any) -> None:
    """``links`` lists each Redis link: the stage's breaker and each key's the stage keeps now (a
    model group's deployments, declared, and a caller's keys, at most ``max_keys``), no more."""
    client = aioredis.Redis(host=redis_server.host, port=redis_server.port, socket_timeout=2.0)
    policy = Policy.parse({
        "stages": {"chat": {"breaker": BREAKER, "retry": {"attempts": 1}, "max_keys": 4}},
        "groups": {"chat": {"deployments": [{"name": "primary"}, {"name": "backup", "priority": 1}]}},
    })  # fmt: skip
    g = Guard(policy, backend=RedisBackend(client, prefix="key-links"))
    exporter = PrometheusExporter(guards=g)

    async def answer(question: str) -> str:
        return "ok"

    chat = g.group("chat", {"primary": answer, "backup": answer})

    @g.guard("chat", key="model")
    async def direct(model: str) -> str:
        return model

    try:
        assert await chat("hi") == "ok"
        for i in range(40):  # a caller naming many models: the stage keeps at most max_keys
            assert await direct(f"m{i}") == f"m{i}"
        pending = {"component": "breaker:chat[backup]", "shared": False, "pending": True}
        for _ in range(300):  # a shared breaker joins Redis with its first sync, in the background
            now = g.status()
            if all(link["shared"] for link in now["links"] if link != pending):
                break
            await asyncio.sleep(0.01)
        kept = set(now["stages"]["chat"]["keys"])
        assert {"primary", "backup"} <= kept and len(kept) <= 4 + 2
        named = [link["component"] for link in now["links"]]
        assert len(named) == len(set(named)), named  # each once
        assert set(named) == {"quotas", "breaker:chat", *(f"breaker:chat[{key}]" for key in kept)}, named
        # the backup deployment never ran: its breaker has not read Redis, and has not lost it either
        assert pending in now["links"]
        assert all(link["shared"] is True for link in now["links"] if link != pending), now["links"]
        assert _samples(exporter, "ragguard_shared_state_degraded") == {
            (("component", link["component"]),): 0.0 for link in now["links"]
        }  # nothing was lost: no alarm for the key never used

        out = io.StringIO()
        Console(file=out, width=1000, color_system=None).print(
            Top("http://x/status", fetcher=lambda url: now).frame()
        )
        drawn = out.getvalue()
        assert "breaker:chat[primary]: redis" in drawn, drawn
        assert "breaker:chat[backup]: not used yet" in drawn, drawn
        assert f"+{len(named) - 6} more, none lost" in drawn, drawn  # 6 named, the rest counted
    finally:
        await g.aclose()
        await client.aclose()


def test_top_names_the_links_on_local_state_first_and_counts_the_rest() -> None:
    links = [{"component": f"breaker:gen[m{i}]", "shared": True} for i in range(20)]
    links.append({"component": "breaker:gen[m-lost]", "shared": False})
    links.append({"component": "breaker:gen[m-lost-too]", "shared": False})
    snapshot: dict[str, Any] = {"ok": True, "open": [], "stages": {}, "links": links}
    out = io.StringIO()
    Console(file=out, width=1000, color_system=None).print(
        Top("http://x/status", fetcher=lambda url: snapshot).frame()
    )
    line = next(line for line in out.getvalue().splitlines() if line.startswith("Links"))
    assert line.index("breaker:gen[m-lost]: LOCAL") < line.index("breaker:gen[m0]: redis"), line
    assert "breaker:gen[m-lost-too]: LOCAL" in line and "+16 more, none lost" in line, line
