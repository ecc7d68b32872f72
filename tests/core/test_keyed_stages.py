"""Keyed stages: one runtime per key (breaker, limits, budgets) under the stage's one policy, keys
taken from the call, bounded in number, idle ones forgotten, the rest sharing the overflow."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import pytest

from ragguard import BreakerOpen, BreakerState, ConfigError, FakeClock, Guard, Overloaded, Policy
from ragguard.options import key_id

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

FLAKY = {"breaker": {"minimum_calls": 2, "window_size": 2, "failure_rate_threshold": 50, "open_for_s": 30}}


def _guard(clock: FakeClock | None = None, **stage: Any) -> Guard:
    options = {**FLAKY, "retry": {"attempts": 1}, **stage}
    return Guard(Policy.parse({"stages": {"gen": options}}), clock=clock or FakeClock())


def _failing(g: Guard, **guard_options: Any) -> Any:
    @g.guard("gen", **guard_options)
    async def call(question: str, model: str) -> str:
        if model.startswith("bad"):
            raise ConnectionResetError(model)
        return model

    return call


async def _fail_twice(call: Any, model: str) -> None:
    for _ in range(2):
        with pytest.raises(ConnectionResetError):
            await call("q", model)


async def test_one_keys_failures_open_its_breaker_and_no_other_keys() -> None:
    g = _guard()
    call = _failing(g, key="model")
    await _fail_twice(call, "bad-a")
    with pytest.raises(BreakerOpen) as refused:
        await call("q", "bad-a")
    assert refused.value.breaker == "gen[bad-a]"
    with pytest.raises(BreakerOpen):  # the key passed by name: the same key
        await call("q", model="bad-a")
    assert await call("q", "good") == "good"  # another key of the same stage and function
    keys = dict(g.stage("gen").keys.items())  # type: ignore[union-attr]
    assert keys["bad-a"].breaker.state is BreakerState.OPEN
    assert keys["good"].breaker.state is BreakerState.CLOSED
    assert g.breaker("gen").state is BreakerState.CLOSED  # the stage's own (the overflow)


async def test_unkeyed_the_same_failures_refuse_every_model() -> None:
    """The control: without a key the stage's one breaker refuses the healthy model too."""
    g = _guard()
    call = _failing(g)
    await _fail_twice(call, "bad-a")
    with pytest.raises(BreakerOpen):
        await call("q", "good")


async def test_the_key_may_be_named_by_the_policy_or_computed_from_the_arguments() -> None:
    g = _guard(key="model")
    by_policy = _failing(g)
    await _fail_twice(by_policy, "bad-a")
    assert await by_policy("q", "good") == "good"
    h = _guard()
    computed = _failing(h, key=lambda question, model: model.split("-")[0])
    await _fail_twice(computed, "bad-a")
    with pytest.raises(BreakerOpen):  # bad-b has the same key: "bad"
        await computed("q", "bad-b")
    assert [k for k, _ in h.stage("gen").keys.items()] == ["bad"]  # type: ignore[union-attr]


async def test_a_call_whose_key_is_not_a_str_runs_on_the_stages_own_instance() -> None:
    g = _guard()

    @g.guard("gen", key="model")
    async def call(model: Any = None) -> Any:
        return model

    assert await call() is None
    assert await call(model=7) == 7
    assert await call(["unhashable"]) == ["unhashable"]
    assert await call(model={"un": "hashable"}) == {"un": "hashable"}
    assert len(g.stage("gen").keys) == 0  # type: ignore[arg-type]


async def test_each_key_takes_its_own_options_over_the_stages() -> None:
    g = _guard(keys={"fragile": {"breaker": {"minimum_calls": 1, "window_size": 1}}})
    call = _failing(g, key="model")

    @g.guard("gen", key="model")
    async def fragile(question: str, model: str) -> str:
        raise ConnectionResetError(model)

    with pytest.raises(ConnectionResetError):
        await fragile("q", "fragile")
    with pytest.raises(BreakerOpen):  # one failure opened it
        await fragile("q", "fragile")
    with pytest.raises(ConnectionResetError):  # another key keeps the stage's two
        await call("q", "bad-x")
    with pytest.raises(ConnectionResetError):
        await call("q", "bad-x")
    keys = dict(g.stage("gen").keys.items())  # type: ignore[union-attr]
    assert keys["fragile"].breaker.config.minimum_calls == 1
    assert keys["bad-x"].breaker.config.minimum_calls == 2
    assert keys["fragile"].breaker.config.open_for_s == 30  # the stage's, not overridden


async def test_streams_are_keyed_too_and_hold_their_key_until_they_end() -> None:
    g = _guard()

    @g.guard("gen", key="model")
    async def stream(model: str) -> Any:
        if model == "bad":
            raise ConnectionResetError(model)
        yield "a"
        yield "b"

    for _ in range(2):
        with pytest.raises(ConnectionResetError):
            async for _ in stream("bad"):
                pass
    with pytest.raises(BreakerOpen):
        async for _ in stream("bad"):
            pass
    items = stream("good")
    assert await items.__anext__() == "a"
    good = dict(g.stage("gen").keys.items())["good"]  # type: ignore[union-attr]
    assert good.in_flight == 1
    assert [x async for x in items] == ["b"]
    assert good.in_flight == 0


def test_sync_functions_are_keyed_in_their_worker_threads() -> None:
    import anyio

    g = _guard()

    @g.guard("gen", key=0)
    def call(model: str) -> str:
        if model == "bad":
            raise ConnectionResetError(model)
        return model

    async def run() -> None:
        for _ in range(2):
            with pytest.raises(ConnectionResetError):
                await call("bad")
        with pytest.raises(BreakerOpen):
            await call("bad")
        assert await call("good") == "good"

    anyio.run(run)


async def test_past_max_keys_new_keys_share_the_overflow_the_stages_own_instance() -> None:
    g = _guard(max_keys=2)
    call = _failing(g, key="model")
    assert await call("q", "a") == "a"
    assert await call("q", "b") == "b"
    await _fail_twice(call, "bad-c")  # no room: the overflow counts it
    keys = g.stage("gen").keys
    assert keys is not None and sorted(k for k, _ in keys.items()) == ["a", "b"]
    assert keys.overflowed == 2
    assert g.breaker("gen").state is BreakerState.OPEN  # the overflow's breaker
    with pytest.raises(BreakerOpen):  # every key past the bound shares it
        await call("q", "d")
    assert await call("q", "a") == "a"  # the kept keys do not


async def test_idle_keys_are_forgotten_when_room_is_needed_but_not_busy_or_open_ones() -> None:
    clock = FakeClock()
    g = _guard(clock, max_keys=3, key_idle_s=60)
    call = _failing(g, key="model")
    await call("q", "idle")
    await _fail_twice(call, "bad-open")
    await call("q", "recent")
    keys = g.stage("gen").keys
    assert keys is not None
    idle = dict(keys.items())["idle"]
    clock.advance(61)
    assert await call("q", "new") == "new"  # no room: the overflow; the map looks at its keys
    assert keys.evicted == 0  # calls are counted, not timed: each key is quiet from that look on
    clock.advance(30)
    await call("q", "recent")  # used again
    clock.advance(31)  # 61 s since that look, with no call since but recent's
    assert await call("q", "new") == "new"
    assert sorted(k for k, _ in keys.items()) == ["bad-open", "new", "recent"]  # open and recent stay
    assert keys.evicted == 1 and not idle.alive
    assert await call("q", "idle") == "idle"  # comes back afresh (the map is full: overflow)
    assert keys.overflowed == 2


async def test_an_idle_key_in_flight_is_never_forgotten() -> None:
    clock = FakeClock()
    g = _guard(clock, max_keys=1, key_idle_s=10)

    @g.guard("gen", key="model")
    async def stream(model: str) -> Any:
        yield model

    held = stream("long")
    await held.__anext__()
    other = _failing(g, key="model")
    for _ in range(3):  # looks 100 s apart: the stream is in flight at each
        clock.advance(100)
        await other("q", "other")  # no room: overflow
    keys = g.stage("gen").keys
    assert keys is not None and [k for k, _ in keys.items()] == ["long"]
    await held.aclose()
    clock.advance(100)
    await other("q", "other")
    assert sorted(k for k, _ in keys.items()) == ["other"]


async def test_keys_named_in_the_policy_are_always_kept_and_do_not_count() -> None:
    clock = FakeClock()
    g = _guard(clock, max_keys=1, key_idle_s=1, keys={"gpt-4o": {}})
    call = _failing(g, key="model")
    await call("q", "gpt-4o")
    await call("q", "other")
    for _ in range(2):  # a look, then one a while later: other is forgotten, gpt-4o never
        clock.advance(1000)
        await call("q", "third")
    keys = g.stage("gen").keys
    assert keys is not None
    assert sorted(k for k, _ in keys.items()) == ["gpt-4o", "third"]


async def test_a_keys_name_is_bounded_in_length_and_charset_whatever_the_caller_sent() -> None:
    g = _guard()
    call = _failing(g, key="model")
    hostile = "a" * 10_000 + "{}\n\x00"
    await call("q", hostile)
    await call("q", "gpt 4o")
    names = [k for k, _ in g.stage("gen").keys.items()]  # type: ignore[union-attr]
    assert all(len(n) <= 100 for n in names)
    safe = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:/@+=-~")
    assert all(set(n) <= safe for n in names)
    assert key_id("gpt 4o") != key_id("gpt_4o") and key_id("gpt-4o") == "gpt-4o"
    assert len({key_id("x" * 200 + str(i)) for i in range(100)}) == 100  # no two share a name


async def test_a_keyed_function_cannot_bring_its_own_breaker_and_must_have_the_parameter() -> None:
    from ragguard import CircuitBreaker

    g = _guard()
    with pytest.raises(ConfigError, match="breaker"):

        @g.guard("gen", key="model", breaker=CircuitBreaker("mine"))
        async def own(model: str) -> str:
            return model

    with pytest.raises(ConfigError, match="key"):

        @g.guard("gen", key="model")
        async def no_model(question: str) -> str:
            return question

    h = _guard(key="model")
    with pytest.raises(ConfigError, match=r"stages\.gen\.key"):

        @h.guard("gen")
        async def nor_here(question: str) -> str:
            return question


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # its cost is the same on trio
async def test_a_hostile_caller_sending_100000_keys_leaves_memory_bounded(anyio_backend: str) -> None:
    clock = FakeClock()
    g = _guard(clock, max_keys=64)
    call = _failing(g, key="model")
    for i in range(1000):  # warm up: the map full, the overflow path compiled
        await call("q", f"warm-{i}")
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(100_000):
        await call("q", f"hostile-{i}")
        if i % 10_000 == 0:
            clock.advance(1000)  # time passes: idle keys are forgotten and replaced
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    keys = g.stage("gen").keys
    assert keys is not None and len(keys) <= 64
    assert keys.evicted <= 11 * 64  # forgotten only as idle keys made room, once per sweep
    print(f"100,000 hostile keys: {len(keys)} kept, {keys.evicted} forgotten, "
          f"{keys.overflowed} calls on the overflow, memory grown {grown / 1024:.0f} KiB")
    assert grown < 2_000_000


async def test_a_keys_limits_are_its_own() -> None:
    policy = {"stages": {"gen": {"retry": {"attempts": 1}, "limits": {"rpm": 2}}}}
    g = Guard(Policy.parse(policy), clock=FakeClock())

    @g.guard("gen", key="model")
    async def call(model: str) -> str:
        return model

    for _ in range(2):
        await call("a")
    with pytest.raises(Overloaded) as refused:
        await call("a")
    assert refused.value.reason == "requests" and refused.value.retry_after_s > 0
    assert await call("b") == "b"  # another key has its own two


def test_the_keyed_stage_of_docs_layers_md_means_what_the_page_says() -> None:
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).parents[2] / "docs" / "layers.md").read_text()
    section = text[text.index("## Keyed stages"):]
    found = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert found is not None
    stage = Policy.parse(yaml.safe_load(found.group(1))).stage("generation")
    assert (stage.key, stage.max_keys, stage.limits.rpm) == ("model", 64, 600)  # type: ignore[union-attr]
    gpt = stage.for_key("gpt-4o")
    assert gpt.breaker.open_for_s == 60 and gpt.breaker.consecutive_failures_threshold == 5
    assert (gpt.limits.rpm, gpt.limits.tpm) == (600, 90_000)  # type: ignore[union-attr]
    assert stage.for_key("other") is stage
