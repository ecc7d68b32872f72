"""One deadline, shared (``StagePolicy.deadline_share``): a stage spends at most its share of the
time the request has left when it starts, so the stages after it keep theirs. On a FakeClock:
the times asserted are the Guard's clock, nothing sleeps."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

import ragguard
from ragguard import ConfigError, DeadlineExceeded, FakeClock, Guard, Policy, RetryPolicy, StagePolicy
from ragguard.layers import Bound
from ragguard.testing import fresh_guard

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # FakeClock's attempt timers cancel asyncio tasks


def _guard(**stages: StagePolicy) -> tuple[Guard, FakeClock]:
    clock = FakeClock()
    return fresh_guard(Policy(stages=stages), clock=clock), clock


# -- the promise: a later stage keeps its time ------------------------------------------------------


async def _pipeline(guard: Guard, clock: FakeClock, rerank_stage: str) -> tuple[list[str], str]:
    """A reranker that hangs (its fallback keeps the retrieved order), then a generation that
    needs 0.5 s, under a 1 s deadline."""

    def keep_order(query: str, passages: list[str]) -> list[str]:
        return passages

    @guard.guard(rerank_stage, fallback=keep_order)
    async def rerank(query: str, passages: list[str]) -> list[str]:
        await clock.sleep(60)
        return passages[::-1]

    @guard.guard("answer")
    async def generate(query: str, passages: list[str]) -> str:
        await clock.sleep(0.5)
        return f"answer from {passages[0]}"

    async with guard.deadline(1.0):
        ranked = await rerank("q", ["p1", "p2"])
        return ranked, await generate("q", ranked)


async def test_a_later_stage_keeps_its_time_because_an_earlier_drew_only_its_share() -> None:
    guard, clock = _guard(slow_rerank=StagePolicy(deadline_share=0.3, reserve=0))
    started = clock()
    ranked, answer = await _pipeline(guard, clock, "slow_rerank")
    assert ranked == ["p1", "p2"] and answer == "answer from p1"
    assert clock() - started == pytest.approx(0.3 + 0.5)  # the rerank stopped at its 30%


async def test_the_standard_rerank_stage_draws_30_percent_by_default() -> None:
    guard, clock = _guard()
    started = clock()
    _, answer = await _pipeline(guard, clock, "rerank")
    assert answer == "answer from p1"
    # 30% of the second, less the reserve its fallback keeps within that (0.25 of 0.3 at most)
    assert clock() - started == pytest.approx(0.3 - 0.05 + 0.5)
    assert guard.stage("rerank").policy.deadline_share == 0.3


async def test_without_a_share_the_hung_stage_spends_the_generations_time() -> None:
    guard, clock = _guard(slow_rerank=StagePolicy(reserve=0))  # what every stage did before shares
    with pytest.raises(DeadlineExceeded):
        await _pipeline(guard, clock, "slow_rerank")


# -- what is left when it starts -------------------------------------------------------------------


async def test_the_share_is_of_the_time_left_when_the_stage_starts() -> None:
    guard, clock = _guard(embed=StagePolicy(deadline_share=0.25))
    seen: list[float | None] = []

    @guard.guard("embed")
    async def embed(text: str) -> list[float]:
        seen.append(ragguard.remaining())  # the stage's code sees its own deadline
        return [0.0]

    async with guard.deadline(2.0):
        clock.advance(1.2)
        await embed("x")
        assert ragguard.remaining() == pytest.approx(0.8)  # and the caller the request's again
    assert seen == [pytest.approx(0.25 * 0.8)]


async def test_a_guarded_call_inside_the_stage_gets_the_stages_deadline() -> None:
    guard, _ = _guard(outer=StagePolicy(deadline_share=0.5))
    seen: list[float | None] = []

    @guard.guard("inner")
    async def inner() -> None:
        seen.append(ragguard.remaining())

    @guard.guard("outer")
    async def outer() -> None:
        await inner()

    async with guard.deadline(1.0):
        await outer()
    assert seen == [pytest.approx(0.5)]


@pytest.mark.parametrize("reserve", [None, 0], ids=["with-reserve", "reserve-off"])
async def test_the_fallback_serves_under_the_stages_share(reserve: float | None) -> None:
    """The share stands outside the fallback (docs/layers.md): the fallback, as much as the
    primary, sees the stage's share of the deadline, and the caller the request's again after
    (with a fallback, the share is fused into the reserve's gate: the fallback applies it itself)."""
    stage = StagePolicy(deadline_share=0.5) if reserve is None else StagePolicy(deadline_share=0.5, reserve=0)
    guard, _ = _guard(s=stage)
    seen: dict[str, float | None] = {}

    async def fallback(x: int) -> int:
        seen["fallback"] = ragguard.remaining()
        return -x

    @guard.guard("s", fallback=fallback)
    async def primary(x: int) -> int:
        seen["primary"] = ragguard.remaining()
        raise ConnectionRefusedError("down")

    async with guard.deadline(1.0):
        assert await primary(1) == -1
        seen["after"] = ragguard.remaining()
    primary = seen["primary"]
    assert primary is not None
    kept = 0.5 - primary  # what the reserve keeps of the share for the fallback
    assert (kept > 0.0) is (reserve is None) and (kept == pytest.approx(0.0)) is (reserve == 0)
    assert seen["fallback"] == pytest.approx(0.5) and seen["after"] == pytest.approx(1.0)


async def test_a_streams_fallback_reads_its_first_item_under_the_share() -> None:
    guard, _ = _guard(s=StagePolicy(deadline_share=0.5))
    seen: list[float | None] = []

    async def fallback(x: int) -> AsyncIterator[int]:
        seen.append(ragguard.remaining())
        yield -x

    @guard.guard("s", fallback=fallback)
    async def primary(x: int) -> AsyncIterator[int]:
        raise ConnectionRefusedError("down")
        yield x

    async with guard.deadline(1.0):
        assert [item async for item in primary(1)] == [-1]
    assert seen == [pytest.approx(0.5)]


async def test_retries_and_their_backoff_stay_within_the_share() -> None:
    retry = RetryPolicy(
        attempts=20, initial_backoff_s=0.1, multiplier=1.0, jitter_s=0.0, budget_min_per_s=100
    )
    guard, clock = _guard(search=StagePolicy(deadline_share=0.4, retry=retry, idempotent=True))
    attempts: list[float] = []

    @guard.guard("search")
    async def search(query: str) -> list[str]:
        attempts.append(clock())
        await clock.sleep(0.1)
        raise ConnectionResetError("reset")

    with pytest.raises(DeadlineExceeded):  # the last attempt, started at 0.399, cut at 0.4
        async with guard.deadline(1.0):
            await search("q")
    assert attempts == pytest.approx([0.0, 0.2, 0.399])
    assert clock() == pytest.approx(0.4)


async def test_running_out_of_the_share_says_so() -> None:
    guard, clock = _guard(search=StagePolicy(deadline_share=0.2))

    @guard.guard("search")
    async def search(query: str) -> list[str]:
        await clock.sleep(60)
        return []

    with pytest.raises(DeadlineExceeded) as info:
        async with guard.deadline(1.0):
            await search("q")
    assert clock() == pytest.approx(0.2)
    assert any("deadline_share (0.2" in note for note in info.value.__notes__)
    # when the request's own deadline is what ran out, no such note
    with pytest.raises(DeadlineExceeded) as spent:
        async with guard.deadline(1.0):
            clock.advance(1.0)
            await search("q")
    assert not getattr(spent.value, "__notes__", None)


async def test_without_a_deadline_a_share_changes_nothing() -> None:
    guard, clock = _guard(search=StagePolicy(deadline_share=0.1, timeout_s=3.0))

    @guard.guard("search")
    async def search(query: str) -> str:
        await clock.sleep(2.0)
        assert ragguard.remaining() is None
        return "hits"

    assert await search("q") == "hits"
    assert clock() == pytest.approx(2.0)


# -- streams ---------------------------------------------------------------------------------------


async def test_a_streams_share_is_fixed_as_it_opens_and_current_only_while_it_reads() -> None:
    guard, clock = _guard(tokens=StagePolicy(deadline_share=0.5))
    inside: list[float | None] = []

    @guard.guard("tokens")
    async def tokens() -> AsyncIterator[int]:
        for i in range(10):
            inside.append(ragguard.remaining())
            await clock.sleep(0.1)
            yield i

    got: list[int] = []
    outside: list[float | None] = []
    with pytest.raises(DeadlineExceeded) as info:
        async with guard.deadline(2.0):
            async for item in tokens():
                got.append(item)
                outside.append(ragguard.remaining())  # the caller's code: the request's deadline
                await clock.sleep(0.05)
    # each item 0.1 s, the caller 0.05 s between them: the stage's own deadline (1.0) cuts it
    assert got == [0, 1, 2, 3, 4, 5] and info.value.items == 6
    assert clock() == pytest.approx(1.0)
    assert inside[0] == pytest.approx(1.0) and inside[1] == pytest.approx(1.0 - 0.15)
    assert outside[0] == pytest.approx(2.0 - 0.1)


# -- the option ------------------------------------------------------------------------------------


def test_the_share_is_validated_naming_the_field() -> None:
    for bad in (0, -0.1, 1.5, "half", float("nan")):
        with pytest.raises(ConfigError) as info:
            Policy.parse({"stages": {"search": {"deadline_share": bad}}})
        assert info.value.field == "stages.search.deadline_share", bad
    assert StagePolicy(deadline_share=1).deadline_share == 1.0
    assert StagePolicy().deadline_share is None


def test_the_rag_presets_have_shares_and_a_policy_may_change_them() -> None:
    policy = Policy()
    shares = {name: policy.stage(name).deadline_share for name in ragguard.options._policy.STANDARD_STAGES}
    assert shares == {"embedding": 0.25, "vector_store": 0.25, "rerank": 0.3, "generation": 1.0}
    changed = Policy(stages={"rerank": StagePolicy(deadline_share=0.5)}).stage("rerank")
    assert changed.deadline_share == 0.5 and changed.preset == "rerank"
    env = Policy.from_env(environ={"RAGGUARD_STAGES__EMBEDDING__DEADLINE_SHARE": "1"})
    assert env.stage("embedding").deadline_share == 1.0


def test_a_stage_with_the_whole_deadline_has_no_share_layer() -> None:
    guard = fresh_guard(Policy(stages={"all": StagePolicy(deadline_share=1.0)}))

    async def fn(query: str, passages: list[str]) -> list[str]:
        return passages

    whole = guard.stage("all").chain(Bound("all", fn, stream=False))
    shared = guard.stage("rerank").chain(Bound("rerank", fn, stream=False))
    # the share's gate: a ShareLayer, or (a stage with a fallback) the reserve's gate it is fused into
    assert [getattr(layer, "share", 1.0) for layer in whole.layers] == [1.0] * len(whole.layers)
    assert "ShareLayer" not in repr(whole)
    assert [layer.share for layer in shared.layers if getattr(layer, "share", 1.0) < 1.0] == [0.3]


async def test_with_every_earlier_stage_hung_the_generation_keeps_39_percent() -> None:
    guard, clock = _guard()  # the standard stages, with the shares they draw by default

    async def hang() -> None:
        await clock.sleep(600)

    @guard.guard("embedding", fallback=lambda texts: [[0.0] for _ in texts])
    async def embed(texts: list[str]) -> list[list[float]]:
        await hang()
        return []

    @guard.guard("vector_store", fallback=lambda vector: ["keyword hit"])
    async def search(vector: list[float]) -> list[str]:
        await hang()
        return []

    @guard.guard("rerank", fallback=lambda query, passages: passages)
    async def rerank(query: str, passages: list[str]) -> list[str]:
        await hang()
        return []

    left_for_generation: list[float | None] = []

    @guard.guard("generation")
    async def generate(passages: list[str]) -> AsyncIterator[str]:
        left_for_generation.append(ragguard.remaining())
        yield "answer"

    async with guard.deadline(10.0):
        passages = await rerank("q", await search((await embed(["q"]))[0]))
        assert [token async for token in generate(passages)] == ["answer"]
    assert passages == ["keyword hit"]
    (left,) = left_for_generation
    assert left is not None and left >= 0.75 * 0.75 * 0.7 * 10.0  # without shares: nothing left


def test_the_policy_in_the_docs_loads_and_means_what_it_says() -> None:
    text = (Path(__file__).parents[2] / "docs" / "layers.md").read_text(encoding="utf-8")
    section = text.split("### One deadline shared by the stages", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    policy = Policy.parse(yaml.safe_load(block))
    rerank, embedding, web = (policy.stage(n) for n in ("rerank", "embedding", "web_search"))
    assert rerank.deadline_share == 0.2 and rerank.preset == "rerank"  # keeps its preset and breaker
    assert rerank.breaker.kind == "rerank_oom"
    assert embedding.deadline_share == 1.0
    assert web.deadline_share == 0.4 and web.reserve.max_s == 0.5 and web.reserve.min_s == 0.05
