"""Per deployment, through the real ``openai`` and ``anthropic`` SDKs against the wire servers:
a model group of two deployments riding out a 500 storm on one of them, a context-length refusal
answered by the larger model, one provider's faults never refusing another's calls, and one
model's faults never refusing another model's."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import yaml
from _door import deployment_breaker

import ragguard
from ragguard import BreakerOpen, BreakerState, FakeClock, Guard, NoDeploymentAvailable, Policy
from wire import AnthropicWire, Fault, OpenAIWire

pytestmark = pytest.mark.anyio

ASK = [{"role": "user", "content": "hi"}]
BREAKER = {"minimum_calls": 4, "window_size": 4, "failure_rate_threshold": 50, "open_for_s": 30}


def _policy(**more: Any) -> Policy:
    return Policy.parse({"stages": {"generation": {"breaker": BREAKER, "retry": {"attempts": 1}}}, **more})


@pytest.fixture
def wrap(closing: list[Any]) -> Any:
    """``wrap(wire, guard, provider)``: the real SDK client of ``wire``, guarded, closed after the test."""
    from ragguard.integrations.anthropic import guard_anthropic
    from ragguard.integrations.openai import guard_openai

    def make(wire: Any, guard: Guard, provider: str = "openai", **options: Any) -> Any:
        if provider == "openai":
            raw: Any = openai.AsyncOpenAI(base_url=f"{wire.url}/v1", api_key="k")
            guarded: Any = guard_openai(raw, guard=guard, **options)
        else:
            raw = anthropic.AsyncAnthropic(base_url=wire.url, api_key="k")
            guarded = guard_anthropic(raw, guard=guard, **options)
        closing.extend((raw, guarded.client))
        return guarded

    return make


async def _text(answer: Any) -> str:
    if hasattr(answer, "choices") and not hasattr(answer, "__aiter__"):
        return str(answer.choices[0].message.content)
    parts = []
    async for chunk in answer:
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
    return "".join(parts)


# -- a model group of two deployments ------------------------------------------------------


def _two(**a: Any) -> tuple[Guard, FakeClock]:
    """A Guard (on a FakeClock it alone advances) with the group ``chat`` of deployments ``a``
    (model gpt-a, and ``a``'s options) and ``b`` (gpt-b)."""
    clock = FakeClock(auto_advance=False)
    deployments = [{"name": "a", "model": "gpt-a", **a}, {"name": "b", "model": "gpt-b"}]
    return Guard(_policy(groups={"chat": {"deployments": deployments}}), clock=clock), clock


async def test_a_500_storm_on_deployment_a_is_answered_by_b_and_a_comes_back_after_its_cooldown(
    wrap: Any, openai_wire: OpenAIWire, backup_wire: OpenAIWire
) -> None:
    g, clock = _two()
    a, b = wrap(openai_wire, g), wrap(backup_wire, g)
    group = g.group("chat", {"a": a, "b": b})
    openai_wire.faults.always("chat", Fault(status=500))
    took: list[float] = []
    for i in range(12):
        started = time.perf_counter()
        async with g.deadline(2.0):
            answer = await group(messages=ASK, stream=i % 2 == 0)
            assert await _text(answer) == "Backup answer"
        took.append(time.perf_counter() - started)
    assert max(took) < 2.0  # each call answered by B well within its 2 s deadline (wall clock)
    assert openai_wire.faults.seen["chat"] == 4  # A's breaker opened on its fourth 500: nothing since
    assert [r["json"]["model"] for r in backup_wire.requests] == ["gpt-b"] * 12
    a_breaker = deployment_breaker(a.chat.completions.create, "gpt-a")
    b_breaker = deployment_breaker(b.chat.completions.create, "gpt-b")
    assert a_breaker.state is BreakerState.OPEN and b_breaker.state is BreakerState.CLOSED
    openai_wire.faults.clear()  # A is back, but cooling down: still B
    assert await _text(await group(messages=ASK)) == "Backup answer"
    assert openai_wire.faults.seen["chat"] == 4
    clock.advance(30.5)  # A's cooldown is over: the next call is its trial
    assert await _text(await group(messages=ASK, stream=True)) == "Hello from the wire"
    assert openai_wire.faults.seen["chat"] == 5
    assert a_breaker.state is not BreakerState.OPEN


async def test_when_both_deployments_are_out_the_error_says_when_one_comes_back(
    wrap: Any, openai_wire: OpenAIWire, backup_wire: OpenAIWire
) -> None:
    g, clock = _two()
    group = g.group("chat", {"a": wrap(openai_wire, g), "b": wrap(backup_wire, g)})
    openai_wire.faults.always("chat", Fault(status=500))
    backup_wire.faults.always("chat", Fault(status=503))
    for _ in range(4):
        with pytest.raises(NoDeploymentAvailable) as failed:
            await group(messages=ASK)
    assert isinstance(failed.value.__cause__, openai.APIStatusError)
    clock.advance(5)
    with pytest.raises(NoDeploymentAvailable) as out:
        await group(messages=ASK, stream=True)
    assert out.value.out == {"a": "open", "b": "open"}
    assert out.value.retry_after_s == pytest.approx(25, abs=0.5)
    assert (openai_wire.faults.seen["chat"], backup_wire.faults.seen["chat"]) == (4, 4)


async def test_a_context_length_error_on_the_small_model_is_answered_by_the_large_one(wrap: Any) -> None:
    wire = OpenAIWire(context_limits={"small": 64, "large": 100_000})
    group_policy = {"deployments": [
        {"name": "small", "model": "small", "context_window": 64},
        {"name": "large", "model": "large", "context_window": 100_000},
    ]}  # fmt: skip
    g = Guard(_policy(groups={"chat": group_policy}))
    with wire.running():
        client = wrap(wire, g)
        group = g.group("chat", {"small": client, "large": client})
        long_ask = [{"role": "user", "content": "passage " * 200}]
        for stream in (False, True):
            answer = await group(messages=long_ask, max_tokens=16, stream=stream)
            assert await _text(answer) == "Hello from the wire"
        assert await _text(await group(messages=ASK, max_tokens=16)) == "Hello from the wire"
        assert [r["json"]["model"] for r in wire.requests] == ["small", "large", "small", "large", "small"]
        small = deployment_breaker(client.chat.completions.create, "small")
        assert small.state is BreakerState.CLOSED and small.metrics().failed_calls == 0  # the caller's error
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            await group(messages=[{"role": "user", "content": "x" * 500_000}], max_tokens=16)


# -- one provider's, or one model's, faults refuse nobody else's -----------------------------


async def test_openais_faults_never_open_anthropics_breaker_with_the_default_stages(
    wrap: Any, openai_wire: OpenAIWire, anthropic_wire: AnthropicWire
) -> None:
    g = Guard(_policy())
    gpt, claude = wrap(openai_wire, g), wrap(anthropic_wire, g, "anthropic")
    openai_wire.faults.always("chat", Fault(status=500))
    for _ in range(4):
        with pytest.raises(openai.InternalServerError):
            await gpt.chat.completions.create(model="gpt-4o", messages=ASK, stream=True)
    with pytest.raises(BreakerOpen):
        await gpt.chat.completions.create(model="gpt-4o", messages=ASK)
    for stream in (True, False):
        answer = await claude.messages.create(model="claude", max_tokens=64, messages=ASK, stream=stream)
        if stream:
            await answer.close()
    assert deployment_breaker(claude.messages.create, "claude").state is BreakerState.CLOSED
    assert g.breaker("anthropic").state is BreakerState.CLOSED
    assert g.breaker("generation").state is BreakerState.CLOSED
    assert anthropic_wire.faults.seen["messages"] == 2


async def test_the_control_one_shared_stage_lets_openais_faults_refuse_anthropic(
    wrap: Any, openai_wire: OpenAIWire, anthropic_wire: AnthropicWire
) -> None:
    """What issue 28 found: both on the stage ``generation`` with one breaker, OpenAI's 500s
    opened it, and a healthy Anthropic call came back BreakerOpen."""
    g = Guard(_policy())
    gpt = wrap(openai_wire, g, generation_stage="generation", keyed=False)
    claude = wrap(anthropic_wire, g, "anthropic", generation_stage="generation", keyed=False)
    openai_wire.faults.always("chat", Fault(status=500))
    for _ in range(4):
        with pytest.raises(openai.InternalServerError):
            await gpt.chat.completions.create(model="gpt-4o", messages=ASK)
    with pytest.raises(BreakerOpen):
        await claude.messages.create(model="claude", max_tokens=64, messages=ASK)
    assert anthropic_wire.faults.seen["messages"] == 0


async def test_one_models_faults_never_refuse_another_model_of_the_same_client(
    wrap: Any, openai_wire: OpenAIWire
) -> None:
    g = Guard(_policy())
    client = wrap(openai_wire, g)
    openai_wire.faults.push("chat", Fault(status=500), times=4)
    for _ in range(4):
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="broken", messages=ASK)
    with pytest.raises(BreakerOpen) as refused:
        await client.chat.completions.create(model="broken", messages=ASK)
    assert refused.value.breaker == f"openai[127.0.0.1:{openai_wire.url.rsplit(':', 1)[1]}/broken]"
    answer = await client.chat.completions.create(model="healthy", messages=ASK)
    assert answer.choices[0].message.content == "Hello from the wire"
    embedded = await client.embeddings.create(model="text-embedding-3-small", input=["a"])
    assert len(embedded.data) == 1
    assert ragguard.degraded() == ()


# -- docs/integrations.md's model-group recipe, run as the page shows it ------------------------

DOC = Path(__file__).parents[2] / "docs" / "integrations.md"


def _block(after: str, lang: str) -> str:
    text = DOC.read_text()
    found = re.search(rf"```{lang}\n(.*?)```", text[text.index(after):], re.S)
    assert found is not None
    return found.group(1)


async def test_the_model_group_recipe_runs_as_the_page_shows_it(
    tmp_path: Path, openai_wire: OpenAIWire, backup_wire: OpenAIWire, closing: list[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "ragguard.yaml").write_text(_block("## A model group", "yaml"))
    monkeypatch.chdir(tmp_path)
    for name, value in {
        "AZURE_OPENAI_URL": f"{openai_wire.url}/v1", "AZURE_OPENAI_KEY": "k",
        "OPENAI_URL": f"{backup_wire.url}/v1", "OPENAI_KEY": "k",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    namespace: dict[str, Any] = {"__name__": "chat"}  # imported, not run as a script
    exec(_block("executed by tests/integrations/test_deployments.py", "python"), namespace)
    closing.extend(c for name in ("azure", "openai") for c in (namespace[name].client,))
    ask = [{"role": "user", "content": "hi"}]
    assert await namespace["answer"](ask) == "Hello from the wire"  # primary, while it answers
    openai_wire.faults.always("chat", Fault(status=500))
    for _ in range(5):
        assert await namespace["answer"](ask) == "Backup answer"
    assert openai_wire.faults.seen["chat"] == 3  # an answer, two 500s: half of 3 calls failed, it opened
    assert [r["json"]["model"] for r in backup_wire.requests] == ["gpt-4o-mini"] * 5
    assert backup_wire.requests[0]["json"]["max_tokens"] == 512


def test_the_model_group_recipe_runs_as_a_script_as_the_page_says(
    tmp_path: Path, openai_wire: OpenAIWire, backup_wire: OpenAIWire
) -> None:
    """``python chat.py`` beside ragguard.yaml, with the four variables set, as a new user runs it:
    the primary down (500s), the answer comes from the backup, named."""
    (tmp_path / "ragguard.yaml").write_text(_block("## A model group", "yaml"))
    (tmp_path / "chat.py").write_text(_block("executed by tests/integrations/test_deployments.py", "python"))
    openai_wire.faults.always("chat", Fault(status=500))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAGGUARD_", "PYTEST_"))}
    env |= {"AZURE_OPENAI_URL": f"{openai_wire.url}/v1", "AZURE_OPENAI_KEY": "k",
            "OPENAI_URL": f"{backup_wire.url}/v1", "OPENAI_KEY": "k"}  # fmt: skip
    done = subprocess.run([sys.executable, "chat.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["Backup answer", "served by chat/backup"], done.stdout


async def test_the_litellm_configuration_translated_means_what_the_table_says() -> None:
    policy = Policy.parse(yaml.safe_load(_block("parsed by tests/integrations/test_deployments.py", "yaml")))
    group = policy.groups["chat"]
    assert group.strategy == "weighted"  # simple-shuffle
    assert [(d.name, d.model, d.priority) for d in group.deployments] == [
        ("eu", "gpt-4o", 0), ("mini", "gpt-4o-mini", 1), ("long", "gpt-4.1", 2),
    ]  # fmt: skip
    eu = group.deployment("eu")
    assert eu is not None and eu.limits is not None and (eu.limits.rpm, eu.limits.tpm) == (500, 90_000)
    openai_stage = policy.stage("openai")
    assert openai_stage.retry.attempts == 1  # num_retries: 0
    config = openai_stage.breaker.config()
    assert config is not None
    assert (config.consecutive_failures_threshold, config.minimum_calls, config.open_for_s) == (4, 4, 30.0)
    assert config.failure_rate_threshold == 100
    g = Guard(policy, clock=FakeClock(auto_advance=False))

    @g.guard("openai", key="model")
    async def create(model: str, fail: bool) -> str:
        if fail:
            raise ConnectionResetError(model)
        return model

    for fail in (True, True, True, False) * 5 + (True, True, True):  # allowed_fails: 3 never cools it
        with pytest.raises(ConnectionResetError) if fail else contextlib.nullcontext():
            await create("gpt-4o", fail)
    assert g.breaker("openai", "gpt-4o").state is BreakerState.CLOSED
    with pytest.raises(ConnectionResetError):
        await create("gpt-4o", True)  # the fourth in a row
    assert g.breaker("openai", "gpt-4o").state is BreakerState.OPEN
    assert g.breaker("openai", "gpt-4o").retry_after_s == 30  # cooldown_time
    assert policy.stage("openai").preset == "generation"  # it starts from the generation stage


@pytest.mark.parametrize("limits", [{"rpm": 1}, {"tpm": 24}])
async def test_a_deployment_whose_limits_are_spent_is_skipped_and_nothing_is_sent_to_it(
    wrap: Any, openai_wire: OpenAIWire, backup_wire: OpenAIWire, limits: dict[str, int]
) -> None:
    """A call reserves max_tokens (16) and its input's text / 4 from ``tpm`` and settles with the
    usage reported (3 + 4 tokens): 24 tokens a minute admit the first call, and what the first
    left (17) cannot hold the second's estimate (17 or more)."""
    g, _ = _two(limits=limits)
    group = g.group("chat", {"a": wrap(openai_wire, g), "b": wrap(backup_wire, g)})
    ask = [{"role": "user", "content": "a question of a few words"}]
    answers = [await _text(await group(messages=ask, max_tokens=16, stream=i == 1)) for i in range(3)]
    assert answers == ["Hello from the wire", "Backup answer", "Backup answer"]
    assert openai_wire.faults.seen["chat"] == 1  # the spent deployment was sent nothing
    assert ragguard.degraded() == ("chat/b",)


def test_what_served_a_request_is_read_inside_asyncio_run_not_after_it() -> None:
    """As the page says: ``asyncio.run()`` runs its coroutine in a copy of the context, so the
    fallbacks named inside it are gone once it returns."""
    g = Guard(Policy())

    async def keyword(query: str) -> str:
        return "keyword"

    @g.guard("search", fallback=keyword)
    async def search(query: str) -> str:
        raise ConnectionRefusedError("down")

    async def main() -> tuple[str, ...]:
        assert await search("q") == "keyword"
        return ragguard.degraded()

    assert asyncio.run(main()) == ("keyword",)
    assert ragguard.degraded() == ()
