"""Put a :mod:`ragguard.chaos` scenario in force on the demo's real parts.

The demo reads the same scenario files as the chaos toolkit (default:
``ragguard/chaos/scenarios/default.yaml``), but it does not inject faults into guarded calls: the
unguarded service has none, and both runs must meet the same faults. Each fault goes where the
failure would really happen:

=================================================  ==============================================
fault spec                                         acts on
=================================================  ==============================================
``kind: proxy, target: embedding|vector_store|``   a :class:`~ragguard.chaos.FaultProxy` between
``generator_a|generator_b``                         the retrieval service and that backend (the
                                                   generator's deployments a and b: ``stop``
                                                   takes one down, its streams cut, its port
                                                   refused)
any other kind at ``stage: embedding|vector_store`` the backend server itself, through a
                                                   :class:`~ragguard.chaos.Chaos` injector in it
``latency``, ``hang``, ``timeout`` or ``error`` at  the generator's stream, at one of its three
``stage: generation`` (before the first word),      points (:mod:`ragguard_tools.demo.generator`); these
``generation_midway`` (halfway) or                  may name a ``tenant``: both services send the
``generation_overrun`` (the answer runs long for    caller's tenant with the generator call
as long as the latency lasts)
``kind: error, stage: rerank, error: memory``      the reranker's memory budget, lowered so that
or ``cuda_oom`` (``min_batch``, ``rate``)          a share ``rate`` of batches of ``min_batch``
                                                   candidates no longer fits (a real MemoryError)
=================================================  ==============================================

Other combinations (another stage, a backend fault limited to one tenant, other rerank faults, a
fault that rewrites results at a generation point) raise :class:`~ragguard.ConfigError` up front:
the demo would not apply them the same way to both runs. The scenario's ``duration_s`` is not
used: phases are shares of a run, stretched over the demo's own duration (``--duration``) in both
runs; the YAML and ``docs/demo.md`` say so too.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ragguard import ConfigError
from ragguard.chaos import FaultProxy, Scenario

from .backends import BACKEND_STAGES, DEPLOYMENTS, ControlClient
from .generator import GENERATION_STAGES
from .rerank import Reranker

__all__ = ["PROXY_TARGETS", "ChaosPlan", "FaultApplier", "FaultState", "drive", "oom_budget"]

_OOM_ERRORS = ("memory", "cuda_oom")
_GENERATION_KINDS = ("latency", "hang", "timeout", "error")
_STAGES = (*BACKEND_STAGES, "rerank", *GENERATION_STAGES)
PROXY_TARGETS = (*BACKEND_STAGES, *(f"generator_{d}" for d in DEPLOYMENTS))
"""The backends with a fault proxy in front: the embedding and vector-store servers, and each
deployment of the generator."""


@dataclass(frozen=True, slots=True)
class FaultState:
    """The faults in force at one moment: backend specs (JSON dicts), proxy actions per backend,
    and the rerank out-of-memory rules as (min_batch, rate)."""

    backend: tuple[dict[str, object], ...] = ()
    proxies: Mapping[str, tuple[object, ...]] = field(default_factory=dict)
    rerank_oom: tuple[tuple[int, float], ...] = ()


class ChaosPlan:
    """A scenario checked for the demo. Raises ConfigError for a fault the demo cannot apply."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        for phase in scenario.phases:
            for spec in phase.faults:
                _check(phase.name, spec)

    def spans(self, duration_s: float) -> list[tuple[str, float, float]]:
        """(phase name, start_s, end_s) of every phase for a run of ``duration_s`` seconds."""
        return [(p.name, p.start * duration_s, p.end * duration_s) for p in self.scenario.phases]

    def timeline(self, duration_s: float) -> list[tuple[float, FaultState]]:
        """The fault state from each change point on (seconds into the run), in time order."""
        phases = self.scenario.phases
        points = sorted({0.0, *(p.start for p in phases), *(p.end for p in phases)})
        out = []
        for point in points:
            if point >= 1.0:
                continue
            active = [p for p in phases if p.covers(point)]
            out.append((point * duration_s, _state([s for p in active for s in p.faults])))
        return out


def _stages(spec: object) -> list[str] | None:
    stage = getattr(spec, "stage", None)
    if stage is None:
        return None
    return [stage] if isinstance(stage, str) else list(stage)


def _check(phase: str, spec: object) -> None:
    kind = getattr(spec, "kind", "?")
    where = f"phase {phase!r}: {kind} fault"
    if kind == "proxy":
        target = getattr(spec, "target", "")
        if target not in PROXY_TARGETS:
            raise ConfigError(f"{where}: the demo has proxies for {', '.join(PROXY_TARGETS)}, not {target!r}")
        return
    stages = _stages(spec)
    if stages is None:
        raise ConfigError(f"{where}: name a stage ({', '.join(_STAGES)})")
    generation = [s for s in stages if s in GENERATION_STAGES]
    if getattr(spec, "tenant", None) is not None and len(generation) < len(stages):
        raise ConfigError(f"{where}: the demo applies faults to every tenant except at the "
                          f"generation points ({', '.join(GENERATION_STAGES)}); remove 'tenant'")
    if generation and kind not in _GENERATION_KINDS:
        raise ConfigError(f"{where}: at the generation points the demo applies "
                          f"{', '.join(_GENERATION_KINDS)} faults")
    for stage in stages:
        if stage == "rerank":
            if kind != "error" or getattr(spec, "error", None) not in _OOM_ERRORS:
                raise ConfigError(f"{where}: at stage rerank the demo applies only out-of-memory errors")
            if len(stages) > 1:
                raise ConfigError(f"{where}: give rerank faults their own entry")
        elif stage not in _STAGES:
            raise ConfigError(f"{where}: unknown stage {stage!r}; the demo's stages are {', '.join(_STAGES)}")


def _state(specs: Sequence[object]) -> FaultState:
    backend: list[dict[str, object]] = []
    proxies: dict[str, list[object]] = {}
    oom: list[tuple[int, float]] = []
    for spec in specs:
        kind = getattr(spec, "kind", "")
        if kind == "proxy":
            proxies.setdefault(getattr(spec, "target", ""), []).append(spec)
        elif _stages(spec) == ["rerank"]:
            oom.append((getattr(spec, "min_batch", None) or 1, float(getattr(spec, "rate", 1.0))))
        else:
            backend.append(spec.model_dump(exclude_none=True))  # type: ignore[attr-defined]
    return FaultState(tuple(backend), {k: tuple(v) for k, v in proxies.items()}, tuple(oom))


def oom_budget(
    reranker: Reranker,
    texts: Sequence[str],
    min_batch: int,
    rate: float,
    *,
    rng: random.Random,
    samples: int = 40,
) -> int:
    """A memory budget (bytes) that a share ``rate`` of batches of ``min_batch`` of ``texts``
    exceed: the (1 - rate) quantile of their sizes over ``samples`` seeded random batches, minus
    one byte. Smaller batches mostly fit, which is what lets a smaller batch recover."""
    n = max(1, min(min_batch, len(texts)))
    sizes = [reranker.batch_bytes(rng.sample(list(texts), n)) for _ in range(samples)]
    quantile = float(np.quantile(np.asarray(sizes, dtype=np.float64), max(0.0, min(1.0, 1.0 - rate))))
    return max(1, int(quantile) - 1)


class FaultApplier:
    """Applies :class:`FaultState` values: backend specs through ``control``, proxy actions on
    ``proxies`` (by backend name), the rerank budget on ``reranker`` (``healthy_budget`` when no
    OOM rule is in force; ``budget_for(min_batch, rate)`` otherwise)."""

    def __init__(
        self,
        control: ControlClient,
        proxies: Mapping[str, FaultProxy],
        reranker: Reranker,
        *,
        healthy_budget: int,
        budget_for: Callable[[int, float], int],
    ) -> None:
        self._control = control
        self._proxies = proxies
        self._reranker = reranker
        self._healthy = healthy_budget
        self._budget_for = budget_for

    async def apply(self, state: FaultState) -> None:
        await self._control.set_faults(list(state.backend))
        for name, proxy in self._proxies.items():
            proxy.heal()
            for spec in state.proxies.get(name, ()):
                spec.apply(proxy)  # type: ignore[attr-defined]
        budgets = [self._budget_for(m, r) for m, r in state.rerank_oom]
        self._reranker.set_budget(min(budgets, default=self._healthy))

    async def heal(self) -> None:
        await self.apply(FaultState())


async def drive(plan: ChaosPlan, applier: FaultApplier, *, duration_s: float, start: float) -> None:
    """Apply the plan's fault states at their times (``start`` is a ``time.monotonic`` value);
    heals when the run ends or the task is cancelled."""
    try:
        for at_s, state in plan.timeline(duration_s):
            delay = start + at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await applier.apply(state)
    finally:
        await asyncio.shield(applier.heal())
