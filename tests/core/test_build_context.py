"""Issue 20: layers are built from a build context, not the Guard; a stage owns its parts and the
Guard has one close path; nothing below guard.py imports it."""

from __future__ import annotations

import ast
import random
from pathlib import Path
from typing import Any, ClassVar

import pytest

import ragguard
from ragguard import BreakerPolicy, FakeClock, Guard, Policy, StagePolicy
from ragguard.layers import Bound, Stage, register_layer
from ragguard.layers._registry import unregister_layer
from ragguard.pipeline import BuildContext, Call

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

SRC = Path(ragguard.__file__).parent


class Counted:
    """A user layer's per-stage state: how many calls of the stage it saw."""

    def __init__(self) -> None:
        self.calls = 0


class CountingGate:
    scope: ClassVar[str] = "call"
    exits: ClassVar[bool] = False

    def __init__(self, counted: Counted) -> None:
        self.counted = counted

    def enter(self, call: Call) -> Any:
        self.counted.calls += 1
        return None

    async def enter_async(self, call: Call) -> Any:  # never asked
        return None

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        return None


built_with: list[BuildContext] = []
closed: list[str] = []


def build_counting(stage: Stage, bound: Bound) -> CountingGate:
    built_with.append(stage.context)

    def make() -> Counted:
        async def close() -> None:
            closed.append(stage.name)

        stage.context.on_close(close)  # what must be stopped goes to the one close path
        return Counted()

    return CountingGate(stage.part("counting", make))


@pytest.fixture
def counting_layer() -> Any:
    built_with.clear()
    closed.clear()
    register_layer("counting", build_counting, after="observe")
    yield
    unregister_layer("counting")


async def _ok(x: int = 0) -> int:
    return x


async def test_a_stage_part_is_made_once_and_shared_by_every_function_of_the_stage(
    counting_layer: None,
) -> None:
    g = Guard(Policy(default_stage=StagePolicy(breaker=BreakerPolicy(kind="none"))), clock=FakeClock())
    one, two = g.guard("search")(_ok), g.guard("search")(_ok)
    other = g.guard("embed")(_ok)
    await one()
    await two()
    await two()
    await other()
    assert g.stage("search").part("counting", Counted).calls == 3
    assert g.stage("embed").part("counting", Counted).calls == 1
    assert set(g.stage("search").parts()) == {"counting"}


async def test_layers_are_built_from_the_guards_context_and_never_see_the_guard(counting_layer: None) -> None:
    clock, rng = FakeClock(), random.Random(7)

    async def sleep(s: float) -> None:
        return None

    g = Guard(clock=clock, rng=rng, sleep=sleep)
    g.guard("search")(_ok)
    ctx = built_with[-1]
    assert ctx is g.context and ctx.clock is clock and ctx.rng is rng and ctx.sleep is sleep
    assert ctx.quotas is g.quotas
    assert not hasattr(g.stage("search"), "guard")


async def test_aclose_closes_what_the_layers_registered_once(counting_layer: None) -> None:
    g = Guard(clock=FakeClock())
    g.guard("search")(_ok)
    g.guard("search")(_ok)  # the stage's part exists already: nothing registered twice
    g.guard("embed")(_ok)
    await g.aclose()
    assert sorted(closed) == ["embed", "search"]
    await g.aclose()
    assert sorted(closed) == ["embed", "search"]


async def test_a_forgotten_stage_forgets_its_parts(counting_layer: None) -> None:
    g = Guard(Policy(default_stage=StagePolicy(breaker=BreakerPolicy(kind="none"))), max_stages=10)
    first = g.stage("s-0").part("counting", Counted)
    for i in range(1, 20):
        g.stage(f"s-{i}")
    assert "s-0" not in g.stage_names()
    assert g.stage("s-0").part("counting", Counted) is not first


def _runtime_imports(path: Path) -> set[str]:
    """The ragguard modules ``path`` imports outside ``if TYPE_CHECKING:`` (functions included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        names = (getattr(test, "id", ""), getattr(test, "attr", ""))
        if isinstance(node, ast.If) and "TYPE_CHECKING" in names:
            typing_only.update(id(n) for sub in node.body for n in ast.walk(sub))
    package = list(path.relative_to(SRC.parent).with_suffix("").parts)[:-1]  # a package's __init__: itself
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base)
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


# the core below the Guard, and the wings that need no Guard (the RAG presets register into the
# layers; the Redis backend is handed to one); tests/packaging/test_layout.py checks the rest
BELOW_THE_GUARD = ("_deadline", "_status", "events", "layers", "pipeline", "overload", "rag",
                   "redis", "quotas", "options", "breakers", "outcomes", "_decorate", "_services")


@pytest.mark.parametrize("area", BELOW_THE_GUARD)
def test_nothing_below_guard_py_imports_it(area: str) -> None:
    paths = [SRC / f"{area}.py"] if (SRC / f"{area}.py").exists() else sorted((SRC / area).rglob("*.py"))
    assert paths
    for path in paths:
        assert "ragguard._guard" not in _runtime_imports(path), path


def test_the_core_does_not_import_metrics_and_the_layer_contract_not_quotas() -> None:
    for path in (SRC / "_guard.py", SRC / "_decorate.py", SRC / "layers" / "_observe.py"):
        assert "ragguard.metrics" not in _runtime_imports(path), path
    for path in sorted((SRC / "pipeline").rglob("*.py")):
        imported = _runtime_imports(path)
        assert not any(m.startswith(("ragguard.quotas", "ragguard.options")) for m in imported), path


class _Busy(Exception):
    """An error ragguard's own classifier reads as the caller's (not retried, not served)."""


async def test_layers_emit_to_and_classify_with_their_build_context() -> None:
    """The event bus and the outcome classifier are services of the build context: layers built
    with another bus emit there (never on the process-wide one), and a Guard's own classifier
    decides what is retried and what a fallback serves."""
    from ragguard import RetryPolicy
    from ragguard.events import EventBus, FallbackServed, RetryScheduled, StageCompleted, bus
    from ragguard.outcomes import Kind, Outcome, classify
    from ragguard.outcomes._classify import kind_of

    assert classify(_Busy()).kind is not Kind.FAILURE and kind_of(_Busy()) is not Kind.FAILURE
    mine: list[object] = []
    elsewhere: list[object] = []
    private = EventBus()
    untaps = [private.tap(mine.append), bus.tap(elsewhere.append)]

    def says_failure(exc: BaseException) -> Outcome | None:
        return Outcome(Kind.FAILURE) if isinstance(exc, _Busy) else None

    retry = RetryPolicy(attempts=2, jitter_s=0.0, initial_backoff_s=0.0)
    policy = Policy(stages={"search": StagePolicy(retry=retry, idempotent=True)})
    g = Guard(policy, clock=FakeClock(), classifier=says_failure)
    g.context.bus = private
    calls = 0

    async def keywords(q: str) -> str:
        return "keywords"

    @g.guard("search", fallback=keywords)
    async def search(q: str) -> str:
        nonlocal calls
        calls += 1
        raise _Busy("the store is busy")

    try:
        assert await search("q") == "keywords"  # served: a failure by the context's classifier
    finally:
        for untap in untaps:
            untap()
    assert calls == 2  # retried once: a failure by the context's classifier, not the caller's
    kinds = {type(e) for e in mine}
    assert {RetryScheduled, FallbackServed, StageCompleted} <= kinds
    assert not [e for e in elsewhere if getattr(e, "stage", None) == "search"]
