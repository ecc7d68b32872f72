"""Model groups of plain callables: the strategies, the cooldown, limits skipped, the deadline,
streams failing over before their first item only, the error when every deployment is out, and a
group configured in YAML and TOML bound by name in code."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

import ragguard
from ragguard import (
    BreakerState,
    ConfigError,
    DeadlineExceeded,
    FakeClock,
    Guard,
    NoDeploymentAvailable,
    Policy,
    QuotaExceeded,
    TenantQuota,
)
from ragguard.outcomes import Kind, classify

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

BREAKER = {"minimum_calls": 2, "window_size": 2, "failure_rate_threshold": 50, "open_for_s": 30}


def _guard(group: dict[str, Any], clock: FakeClock | None = None, **policy: Any) -> Guard:
    stages = {"chat": {"breaker": BREAKER, "retry": {"attempts": 1}}}
    data = {"stages": stages, "groups": {"chat": group}, **policy}
    return Guard(Policy.parse(data), clock=clock or FakeClock(), rng=__import__("random").Random(7))


def _two(**group: Any) -> dict[str, Any]:
    return {"deployments": [{"name": "a", "model": "model-a"}, {"name": "b", "model": "model-b"}], **group}


class Model:
    """A deployment that counts its calls and fails while ``down``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0
        self.down: BaseException | None = None

    async def __call__(self, question: str, *, model: str | None = None) -> str:
        self.calls += 1
        if self.down is not None:
            raise self.down
        return f"{self.name}:{model}:{question}"


Bind = Callable[[Mapping[str, Model]], dict[str, Any]]


@pytest.fixture(params=["callable object", "coroutine function"])
def bound(request: pytest.FixtureRequest) -> Bind:
    """How a test binds its models: each :class:`Model` itself (a callable object: its calls go
    through the function the group guarded), or its ``__call__`` method (a coroutine function:
    the ordered strategy's first choice runs its key's chain with no frame of the group's, a
    failure handed to the failover loop by the chain's outermost layer)."""
    if request.param == "callable object":
        return dict
    return lambda models: {name: model.__call__ for name, model in models.items()}


async def test_a_storm_on_one_deployment_is_answered_by_the_other_and_cools_it_down(bound: Bind) -> None:
    clock = FakeClock()
    g = _guard(_two(), clock)
    a, b = Model("a"), Model("b")
    a.down = ConnectionResetError("a is down")
    group = g.group("chat", bound({"a": a, "b": b}))
    answers = [await group(f"q{i}") for i in range(10)]
    assert answers == [f"b:model-b:q{i}" for i in range(10)]
    assert a.calls == 2  # two failures opened its breaker: the next eight never reached it
    runtimes = dict(group.deployments())
    assert runtimes["a"].breaker.state is BreakerState.OPEN
    assert runtimes["b"].breaker.state is BreakerState.CLOSED
    a.down = None
    clock.advance(29)
    assert await group("still cooling") == "b:model-b:still cooling"
    clock.advance(2)  # its cooldown is over: the next call is its trial
    assert await group("again") == "a:model-a:again"
    assert a.calls == 3


async def test_when_every_deployment_is_out_one_error_says_when_the_first_comes_back(bound: Bind) -> None:
    clock = FakeClock()
    g = _guard(_two(), clock)
    a, b = Model("a"), Model("b")
    a.down = b.down = ConnectionResetError("down")
    group = g.group("chat", bound({"a": a, "b": b}))
    with pytest.raises(NoDeploymentAvailable) as first:
        await group("q")
    assert first.value.out == {"a": "failure", "b": "failure"}
    assert first.value.retry_after_s is None  # both failed with their breakers closed
    assert isinstance(first.value.__cause__, ConnectionResetError)
    with pytest.raises(NoDeploymentAvailable):
        await group("q")  # the second failure of each opens both
    clock.advance(10)
    with pytest.raises(NoDeploymentAvailable) as out:
        await group("q")
    assert out.value.out == {"a": "open", "b": "open"}
    assert out.value.retry_after_s == pytest.approx(20, abs=1)  # the soonest of the two cooldowns
    assert a.calls == b.calls == 2
    outcome = classify(out.value)
    assert outcome.kind is Kind.REFUSED and outcome.retry_after_s == out.value.retry_after_s
    again = pickle.loads(pickle.dumps(out.value))
    assert (again.group, again.out, again.retry_after_s) == ("chat", out.value.out, out.value.retry_after_s)
    assert "no deployment of model group 'chat'" in str(out.value)


async def test_a_callers_error_and_the_tenants_quota_are_not_failed_over(bound: Bind) -> None:
    g = _guard(_two(), tenants={"acme": TenantQuota(max_concurrency=1)})
    a, b = Model("a"), Model("b")
    a.down = ValueError("bad request")
    group = g.group("chat", bound({"a": a, "b": b}))
    with pytest.raises(ValueError, match="bad request"):
        await group("q")
    assert b.calls == 0
    a.down = QuotaExceeded("acme", 1.0, "rate")
    with pytest.raises(QuotaExceeded):
        await group("q")
    assert b.calls == 0


async def test_each_deployment_gets_its_own_model_and_one_without_keeps_the_callers(bound: Bind) -> None:
    g = _guard({"deployments": [{"name": "a", "model": "model-a"}, {"name": "b"}]})
    a, b = Model("a"), Model("b")
    a.down = ConnectionResetError()
    group = g.group("chat", bound({"a": a, "b": b}))
    assert await group("q", model="callers") == "b:callers:q"  # a's model never leaks to b
    assert await group("q") == "b:None:q"


async def test_priorities_come_first_and_ordered_keeps_the_declared_order(bound: Bind) -> None:
    deployments = [
        {"name": "backup", "priority": 1},
        {"name": "second"},
        {"name": "first"},
    ]
    g = _guard({"deployments": deployments})
    models = {name: Model(name) for name in ("backup", "second", "first")}
    group = g.group("chat", bound(models))
    assert (await group("q")).startswith("second:")
    models["second"].down = ConnectionResetError()
    assert (await group("q")).startswith("first:")
    models["first"].down = ConnectionResetError()
    assert (await group("q")).startswith("backup:")


async def test_weighted_sends_each_deployment_its_share() -> None:
    weighted = [{"name": "a", "weight": 3}, {"name": "b", "weight": 1}]
    g = _guard({"deployments": weighted, "strategy": "weighted"})
    a, b = Model("a"), Model("b")
    group = g.group("chat", {"a": a, "b": b})
    for _ in range(2000):
        await group("q")
    assert a.calls + b.calls == 2000
    assert 0.70 < a.calls / 2000 < 0.80  # 3:1


async def test_least_busy_sends_the_next_call_to_the_deployment_with_fewest_in_flight() -> None:
    import anyio

    g = _guard({**_two(), "strategy": "least_busy"})
    release = anyio.Event()
    started: list[str] = []

    def slow(name: str) -> Any:
        async def call(question: str, *, model: str | None = None) -> str:
            started.append(name)
            await release.wait()
            return name

        return call

    group = g.group("chat", {"a": slow("a"), "b": slow("b")})
    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(group, "q")
            await anyio.sleep(0)
        await anyio.sleep(0.01)
        release.set()
    assert sorted(started) == ["a", "a", "b", "b"]  # alternated: each went to the idler one


async def test_latency_prefers_the_faster_deployment_once_measured() -> None:
    clock = FakeClock()
    g = _guard({**_two(), "strategy": "latency"}, clock)

    def timed(name: str, took_s: float) -> Any:
        async def call(question: str, *, model: str | None = None) -> str:
            clock.advance(took_s)
            return name

        return call

    group = g.group("chat", {"a": timed("a", 0.5), "b": timed("b", 0.1)})
    first = [await group("q") for _ in range(2)]
    assert first == ["a", "b"]  # a has a figure now: b, without one, goes next
    assert [await group("q") for _ in range(5)] == ["b"] * 5


async def test_a_deployment_whose_limits_are_spent_is_skipped_until_they_refill(bound: Bind) -> None:
    clock = FakeClock()
    deployments = [{"name": "a", "limits": {"rpm": 2}}, {"name": "b", "limits": {"rpm": 1}}]
    g = _guard({"deployments": deployments}, clock)
    a, b = Model("a"), Model("b")
    group = g.group("chat", bound({"a": a, "b": b}))
    answers = [(await group("q")).split(":")[0] for _ in range(3)]
    assert answers == ["a", "a", "b"]
    with pytest.raises(NoDeploymentAvailable) as out:
        await group("q")
    assert out.value.out == {"a": "limits", "b": "limits"}
    assert out.value.retry_after_s == pytest.approx(30, abs=0.1)  # a's next request: 60 s / 2
    assert (a.calls, b.calls) == (2, 1)  # a spent limit sent nothing
    clock.advance(30)
    assert (await group("q")).startswith("a:")


async def test_failover_stays_within_the_deadline() -> None:
    clock = FakeClock()
    g = _guard(_two(), clock)
    b = Model("b")

    async def slow_failure(question: str, *, model: str | None = None) -> str:
        clock.advance(2.0)
        raise ConnectionResetError("slow and down")

    group = g.group("chat", {"a": slow_failure, "b": b})
    with pytest.raises(DeadlineExceeded):
        async with g.deadline(1.0):
            await group("q")
    assert b.calls == 0  # the deadline was spent before b could answer
    async with g.deadline(5.0):
        assert (await group("q")).startswith("b:")


async def test_a_stream_fails_over_before_its_first_item_and_never_after() -> None:
    g = _guard(_two())
    sent: list[str] = []

    def streaming(name: str, fail_after: int | None) -> Any:
        async def stream(question: str, *, model: str | None = None) -> Any:
            for i in range(3):
                if fail_after is not None and i == fail_after:
                    raise ConnectionResetError(f"{name} broke")
                sent.append(f"{name}{i}")
                yield f"{name}{i}"

        return stream

    group = g.group("chat", {"a": streaming("a", 0), "b": streaming("b", None)})
    assert [item async for item in group.stream("q")] == ["b0", "b1", "b2"]
    committed = g.group("chat", {"a": streaming("a", 1), "b": streaming("b", None)})
    got: list[str] = []
    with pytest.raises(ConnectionResetError):
        async for item in committed.stream("q"):
            got.append(item)
    assert got == ["a0"]  # the first item came: committed to a, b never asked
    assert "b0" not in sent[3:]


async def test_a_context_length_refusal_goes_to_a_deployment_with_a_larger_window() -> None:
    deployments = [
        {"name": "small", "model": "s", "context_window": 8192},
        {"name": "medium", "model": "m", "context_window": 9000},
        {"name": "large", "model": "l", "context_window": 131072},
    ]
    g = _guard({"deployments": deployments})

    class TooLong(ValueError):
        pass

    calls: list[str] = []

    def refusing(window: int) -> Any:
        async def call(question: str, *, model: str | None = None) -> str:
            calls.append(str(model))
            if len(question) > window:
                raise TooLong(
                    f"This model's maximum context length is {window} tokens. However, your messages "
                    f"resulted in {len(question)} tokens. Please reduce the length of the messages."
                )
            return str(model)

        return call

    targets = {"small": refusing(8192), "medium": refusing(9000), "large": refusing(131072)}
    group = g.group("chat", targets)
    assert await group("x" * 10_000) == "l"
    assert calls == ["s", "l"]  # the refusal said 10,000 tokens: medium's 9,000 was never asked
    runtimes = dict(group.deployments())
    assert runtimes["small"].breaker.metrics().failed_calls == 0  # a caller's error: not counted
    calls.clear()
    with pytest.raises(TooLong):  # longer than every window: the refusal itself, nobody else asked
        await group("x" * 200_000)
    assert calls == ["s"]


async def test_a_group_is_configured_in_yaml_or_toml_and_bound_by_name(tmp_path: Path) -> None:
    yaml_file = tmp_path / "policy.yaml"
    yaml_file.write_text(
        "groups:\n"
        "  chat:\n"
        "    strategy: ordered\n"
        "    deployments:\n"
        "      - {name: primary, model: gpt-4o, context_window: 128000, limits: {rpm: 600, tpm: 100000}}\n"
        "      - {name: backup, model: gpt-4o-mini, priority: 1}\n"
    )
    toml_file = tmp_path / "policy.toml"
    toml_file.write_text(
        "[[groups.chat.deployments]]\nname = 'primary'\nmodel = 'gpt-4o'\ncontext_window = 128000\n"
        "limits = {rpm = 600, tpm = 100000}\n"
        "[[groups.chat.deployments]]\nname = 'backup'\nmodel = 'gpt-4o-mini'\npriority = 1\n"
    )
    yaml_policy, toml_policy = Policy.from_file(yaml_file), Policy.from_file(toml_file)
    assert yaml_policy.groups == toml_policy.groups
    assert yaml_policy.groups["chat"].deployment("primary").limits.tpm == 100_000  # type: ignore[union-attr]
    g = Guard(yaml_policy)
    with pytest.raises(ConfigError, match="backup"):
        g.group("chat", {"primary": Model("p")})
    with pytest.raises(ConfigError, match="tpm"):  # tokens are counted by the generation preset's streams
        g.group("chat", {"primary": Model("p"), "backup": Model("b")})
    with pytest.raises(ConfigError, match="no model group"):
        g.group("nope", {})


async def test_bad_group_policies_are_refused_naming_the_field() -> None:
    for bad, field in (
        ({"deployments": []}, "groups.chat.deployments"),
        ({"deployments": [{"name": "a b"}]}, "groups.chat.deployments.0.name"),
        ({"deployments": [{"name": "a", "weight": 0}]}, "groups.chat.deployments.0.weight"),
        ({"deployments": [{"name": "a"}], "strategy": "fastest"}, "groups.chat.strategy"),
    ):
        with pytest.raises(ConfigError) as caught:
            Policy.parse({"groups": {"chat": bad}})
        assert caught.value.field == field


async def test_degraded_names_the_deployment_that_answered_after_a_failover(bound: Bind) -> None:
    g = _guard(_two())
    a, b = Model("a"), Model("b")
    group = g.group("chat", bound({"a": a, "b": b}))
    async with g.tenant("acme"):
        await group("q")
        assert ragguard.degraded() == ()
    a.down = ConnectionResetError()
    async with g.tenant("acme"):
        await group("q")
        assert ragguard.degraded() == ("chat/b",)



async def test_a_streams_early_close_closes_the_deployments_stream_at_once() -> None:
    """``group.stream()`` is an async generator (``aclosing()`` takes it, as the demo's answer
    does): closing it after its first item closes the deployment's stream before ``aclose()``
    returns (its call cancelled there and then, not left to the garbage collector), and the
    deployment's breaker counts no failure."""
    from contextlib import aclosing

    g = _guard(_two())
    closed: list[str] = []

    async def a(question: str, *, model: str | None = None) -> Any:
        try:
            for i in range(100):
                yield f"a{i}"
        finally:
            closed.append("a")

    group = g.group("chat", {"a": a, "b": Model("b")})
    async with aclosing(group.stream("q")) as items:
        async for item in items:
            assert item == "a0"
            break
        assert closed == []
    assert closed == ["a"]
    assert g.breaker("chat", "a").state is BreakerState.CLOSED
    assert g.breaker("chat", "a").metrics().failed_calls == 0


async def test_a_group_is_a_coroutine_function_to_whoever_asks(anyio_backend: str) -> None:
    """``guard()`` and LangChain's RunnableLambda ask ``inspect.iscoroutinefunction`` of a
    callable's ``__call__``: a group wrapped by either is awaited, not run in a worker thread."""
    import inspect

    from langchain_core.runnables import RunnableLambda

    g = _guard(_two())

    async def a(question: str, *, model: str | None = None) -> str:
        return f"a:{model}:{question}"

    group = g.group("chat", {"a": a, "b": Model("b")})
    assert inspect.iscoroutinefunction(group.__call__)
    assert inspect.iscoroutinefunction(group.create)
    assert await group.create("q") == await group.__call__("q") == "a:model-a:q"
    outer = g.guard("outer", breaker=False)(group)
    assert await outer("q") == "a:model-a:q"
    if anyio_backend == "asyncio":  # LangChain's callbacks run on asyncio
        assert await RunnableLambda(group).ainvoke("q") == "a:model-a:q"


async def test_a_fault_injected_after_the_first_calls_reaches_the_first_choice(bound: Bind) -> None:
    """Injecting faults rebuilds the chains (the injection epoch): the first choice's too."""
    from ragguard.chaos import Chaos, Error

    clock = FakeClock()
    g = _guard(_two(), clock)
    a, b = Model("a"), Model("b")
    group = g.group("chat", bound({"a": a, "b": b}))
    assert await group("q") == "a:model-a:q"
    chaos = Chaos(rng=__import__("random").Random(1))
    chaos.inject(Error(ConnectionResetError), stage="chat")
    chaos.install()
    try:
        with pytest.raises(NoDeploymentAvailable) as out:
            await group("q")
        assert out.value.out == {"a": "failure", "b": "failure"}
    finally:
        chaos.close()
    clock.advance(31)  # a's breaker opened (a success and a failure: 50%); its trial now
    assert await group("q") == "a:model-a:q"
    assert (a.calls, b.calls) == (2, 0)  # the faults answered in their place


async def test_a_group_no_longer_used_leaves_the_guards_groups_at_once(bound: Bind) -> None:
    """Nothing a call leaves behind (the first choice's chain, ``group.__call__``) holds the
    group in a cycle: Guard.groups() lists only the groups still in use, without waiting for
    the garbage collector."""
    import gc

    g = _guard(_two())
    a = Model("a")
    a.down = ConnectionResetError()  # the failover loop runs too
    group = g.group("chat", bound({"a": a, "b": Model("b")}))
    assert await group("q") == "b:model-b:q"
    assert await group.create("q") == "b:model-b:q"
    assert list(g.groups()) == ["chat"]
    a.down = None  # its traceback's frames: the calls'
    gc.disable()
    try:
        del group
        assert g.groups() == {}
    finally:
        gc.enable()
