"""Scenarios: phases of faults over a run, read from YAML and applied on a clock.

A scenario file::

    name: vector-store-outage
    phases:
      - name: warm-up
        start: 0.0          # share of the run's duration, in [0, 1]
        end: 0.2
      - name: store down
        start: 0.2
        end: 0.6
        faults:
          - {kind: error, error: connection_refused, stage: search, rate: 1.0}
          - {kind: latency, stage: embed, tenant: acme, rate: 0.3, median_s: 0.05, p99_s: 3.5}

Phase times are shares of the run, so the same file drives a 10 s smoke run and a 10 min soak.
Validation is pydantic's; a bad file raises :class:`ScenarioError` naming each bad field and
its line in the file.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .._clock import Clock, monotonic
from .._errors import ConfigError
from ..options import _model_errors
from ._chaos import Chaos
from ._faults import (
    BlockLoop,
    CorruptPayload,
    EmptyResults,
    Error,
    Fault,
    Hang,
    Latency,
    PartialResults,
    StaleResults,
    Timeout,
)
from ._proxy import FaultProxy

__all__ = [
    "Phase",
    "Scenario",
    "ScenarioError",
    "ScenarioRunner",
    "default_scenario",
    "load_scenario",
    "parse_scenario",
]


class ScenarioError(ConfigError):
    """A scenario file is not valid. ``problems`` lists ``(field, line, message)``; line is 1-based."""

    def __init__(self, source: str, problems: Sequence[tuple[str, int | None, str]]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = [f"{source}: invalid scenario ({len(self.problems)} problem(s))"]
        for field, line, message in self.problems:
            where = f"line {line}" if line is not None else "line ?"
            lines.append(f"  {where}: {field or '<root>'}: {message}")
        super().__init__("\n".join(lines))


# -- the schema -----------------------------------------------------------------------------------

Names = str | list[str] | None


class _FaultSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: Names = None
    tenant: Names = None
    rate: float = Field(1.0, ge=0.0, le=1.0, description="share of matching calls hit")
    min_batch: int | None = Field(None, ge=0)

    @field_validator("stage", "tenant")
    @classmethod
    def _names(cls, v: Names) -> Names:
        if v is not None and (v == "" or v == [] or (isinstance(v, list) and "" in v)):
            raise ValueError("must be a non-empty name or list of names")
        return v

    def _common(self) -> dict[str, Any]:
        return {"injection_rate": self.rate, "min_batch": self.min_batch}

    def build(self) -> Fault:
        raise NotImplementedError


class LatencySpec(_FaultSpec):
    kind: Literal["latency"]
    seconds: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    median_s: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    p99_s: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    max_s: float | None = Field(None, gt=0.0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_shape(self) -> LatencySpec:
        tail = self.median_s is not None or self.p99_s is not None
        if (self.seconds is None) == (not tail):
            raise ValueError("give either seconds, or median_s and p99_s")
        if tail and (self.median_s is None or self.p99_s is None or self.median_s >= self.p99_s):
            raise ValueError("median_s and p99_s are both needed, with median_s < p99_s")
        return self

    def build(self) -> Fault:
        if self.seconds is not None:
            return Latency(self.seconds, **self._common())
        assert self.median_s is not None and self.p99_s is not None
        return Latency.long_tail(median_s=self.median_s, p99_s=self.p99_s, max_s=self.max_s, **self._common())


class HangSpec(_FaultSpec):
    kind: Literal["hang"]

    def build(self) -> Fault:
        return Hang(**self._common())


class TimeoutSpec(_FaultSpec):
    kind: Literal["timeout"]
    after_s: float = Field(0.0, ge=0.0, allow_inf_nan=False)

    def build(self) -> Fault:
        return Timeout(self.after_s, **self._common())


class ErrorSpec(_FaultSpec):
    kind: Literal["error"]
    error: Literal[
        "connection_refused", "connection_reset", "grpc_unavailable", "grpc_deadline_exceeded",
        "timeout", "memory", "cuda_oom",
    ]
    after_call: bool = False

    def build(self) -> Fault:
        return Error(kind=self.error, after_call=self.after_call, **self._common())


class PartialSpec(_FaultSpec):
    kind: Literal["partial"]
    keep: float | None = Field(None, ge=0.0, le=1.0)
    max_hits: int | None = Field(None, ge=0)

    def build(self) -> Fault:
        keep = 0.5 if self.keep is None and self.max_hits is None else self.keep
        return PartialResults(keep=keep, max_hits=self.max_hits, **self._common())


class EmptySpec(_FaultSpec):
    kind: Literal["empty"]

    def build(self) -> Fault:
        return EmptyResults(**self._common())


class StaleSpec(_FaultSpec):
    kind: Literal["stale"]

    def build(self) -> Fault:
        return StaleResults(**self._common())


class CorruptSpec(_FaultSpec):
    kind: Literal["corrupt"]
    flips: int = Field(1, ge=0)
    truncate_to: float | None = Field(None, ge=0.0, lt=1.0)

    def build(self) -> Fault:
        return CorruptPayload(flips=self.flips, truncate_to=self.truncate_to, **self._common())


class BlockLoopSpec(_FaultSpec):
    kind: Literal["block_loop"]
    ms: float = Field(ge=0.0, le=60_000.0)

    def build(self) -> Fault:
        return BlockLoop(self.ms, **self._common())


class ProxySpec(BaseModel):
    """A network fault on the :class:`FaultProxy` named ``target`` (given to the runner).

    Without a proxy of that name, the runner injects the in-process equivalent at stage
    ``target``: connection refused (stop/refuse), connection reset (reset), a timeout (drop),
    latency (latency). The proxy is healed (and restarted) when the phase ends.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["proxy"]
    target: str = Field(min_length=1)
    action: Literal["stop", "refuse", "reset", "drop", "latency", "bandwidth", "close_after"]
    seconds: float = Field(0.0, ge=0.0, allow_inf_nan=False, description="latency each way")
    bytes_per_s: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    n_bytes: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _needs(self) -> ProxySpec:
        if self.action == "bandwidth" and self.bytes_per_s is None:
            raise ValueError("action bandwidth needs bytes_per_s")
        if self.action == "close_after" and self.n_bytes is None:
            raise ValueError("action close_after needs n_bytes")
        return self

    def apply(self, proxy: FaultProxy) -> Callable[[], None]:
        """Apply the action now; returns the undo."""
        if self.action == "stop":
            proxy.stop()
        elif self.action == "refuse":
            proxy.refuse()
        elif self.action == "reset":
            proxy.reset()
        elif self.action == "drop":
            proxy.drop()
        elif self.action == "latency":
            proxy.set_latency(to_server_s=self.seconds / 2, to_client_s=self.seconds / 2)
        elif self.action == "bandwidth":
            proxy.set_bandwidth(self.bytes_per_s)
        else:
            assert self.n_bytes is not None
            proxy.close_after(self.n_bytes)
        return proxy.heal

    def in_process(self) -> Fault | None:
        """The fault injected at stage ``target`` when no proxy has that name."""
        if self.action in ("stop", "refuse"):
            return Error(kind="connection_refused")
        if self.action in ("reset", "close_after"):
            return Error(kind="connection_reset")
        if self.action == "drop":
            return Hang()
        if self.action == "latency":
            return Latency(self.seconds)
        return None


FaultSpec = Annotated[
    LatencySpec | HangSpec | TimeoutSpec | ErrorSpec | PartialSpec | EmptySpec | StaleSpec | CorruptSpec
    | BlockLoopSpec | ProxySpec,
    Field(discriminator="kind"),
]


class Phase(BaseModel):
    """One stretch of the run, from ``start`` to ``end`` (shares of the run, 0 <= start < end <= 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    start: float = Field(ge=0.0, le=1.0)
    end: float = Field(ge=0.0, le=1.0)
    faults: list[FaultSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _ordered(self) -> Phase:
        if self.end <= self.start:
            raise ValueError(f"end ({self.end}) must be after start ({self.start})")
        return self

    def covers(self, progress: float) -> bool:
        return self.start <= progress < self.end or (self.end == 1.0 and progress >= 1.0)


class Scenario(BaseModel):
    """A named list of phases; ``duration_s`` is the run length a caller uses when it gives none."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    description: str = ""
    duration_s: float = Field(60.0, gt=0.0, allow_inf_nan=False)
    phases: list[Phase] = Field(min_length=1)

    @field_validator("phases")
    @classmethod
    def _unique_names(cls, phases: list[Phase]) -> list[Phase]:
        names = [p.name for p in phases]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"phase names must be unique; repeated: {', '.join(dupes)}")
        return phases

    def phases_at(self, progress: float) -> tuple[Phase, ...]:
        """The phases that cover ``progress`` (a share of the run, clamped to [0, 1])."""
        p = min(max(progress, 0.0), 1.0)
        return tuple(ph for ph in self.phases if ph.covers(p))


# -- loading with line numbers --------------------------------------------------------------------


def _line_map(node: yaml.Node, path: tuple[Any, ...], out: dict[tuple[Any, ...], int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = (*path, key.value)
            out[child] = key.start_mark.line + 1
            _line_map(value, child, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            child = (*path, i)
            out[child] = item.start_mark.line + 1
            _line_map(item, child, out)


def _locate(
    loc: Sequence[Any], lines: dict[tuple[Any, ...], int], data: Any
) -> tuple[str, int | None]:
    """Map a pydantic error location to a field path and the YAML line it came from.

    The tag pydantic adds for a discriminated union (the ``kind`` value) is skipped; a missing
    field keeps its name and points at its parent's line.
    """
    path: tuple[Any, ...] = ()
    line = lines.get((), None)
    shown: list[Any] = []
    node = data
    for i, elem in enumerate(loc):
        if isinstance(node, dict) and i < len(loc) - 1 and node.get("kind") == elem:
            continue  # the union's tag, not a key of the file
        candidate = (*path, elem)
        if candidate in lines:
            path, line = candidate, lines[candidate]
            shown.append(elem)
            try:
                node = node[elem]
            except (KeyError, IndexError, TypeError):
                node = None
        elif i == len(loc) - 1:
            shown.append(elem)
    text = ""
    for elem in shown:
        text += f"[{elem}]" if isinstance(elem, int) else (f".{elem}" if text else str(elem))
    return text, line


def parse_scenario(text: str, *, source: str = "<scenario>") -> Scenario:
    """Parse and validate a scenario from YAML ``text``; raises :class:`ScenarioError`."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = None if mark is None else mark.line + 1
        raise ScenarioError(source, [("", line, f"not valid YAML: {getattr(exc, 'problem', exc)}")]) from exc
    if not isinstance(data, dict):
        raise ScenarioError(source, [("", 1, "the file must hold a mapping with name and phases")])
    lines: dict[tuple[Any, ...], int] = {(): 1}
    if root is not None:
        _line_map(root, (), lines)
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            field, line = _locate(err["loc"], lines, data)
            problems.append((field, line, _model_errors.describe(err, Scenario)))
        raise ScenarioError(source, problems) from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate the scenario file at ``path``; raises ScenarioError or OSError."""
    p = Path(path)
    return parse_scenario(p.read_text(encoding="utf-8"), source=str(p))


def default_scenario() -> Scenario:
    """The demo's default scenario (``ragguard/chaos/scenarios/default.yaml``)."""
    text = resources.files("ragguard.chaos").joinpath("scenarios/default.yaml").read_text(encoding="utf-8")
    return parse_scenario(text, source="ragguard/chaos/scenarios/default.yaml")


# -- running --------------------------------------------------------------------------------------


class ScenarioRunner:
    """Applies a scenario's phases to a :class:`Chaos` as ``clock`` advances.

    The run lasts ``duration_s`` seconds (default: the scenario's) from ``start`` (default:
    ``clock()`` now). :meth:`update` injects the faults of the phases covering the current
    time and removes those of phases that ended; call it often, or ``await run()``. Raises
    ConfigError for a non-positive duration.

    ``proxies`` maps names to running :class:`FaultProxy` objects for ``kind: proxy`` faults.
    """

    def __init__(
        self,
        scenario: Scenario,
        chaos: Chaos,
        *,
        duration_s: float | None = None,
        clock: Clock = monotonic,
        start: float | None = None,
        proxies: Mapping[str, FaultProxy] | None = None,
    ) -> None:
        duration = scenario.duration_s if duration_s is None else duration_s
        if not (isinstance(duration, int | float) and duration > 0 and math.isfinite(duration)):
            raise ConfigError(f"ScenarioRunner: duration_s must be > 0 seconds, got {duration_s!r}")
        self.scenario = scenario
        self.chaos = chaos
        self.duration_s = float(duration)
        self.clock = clock
        self.start = clock() if start is None else float(start)
        self.proxies = dict(proxies or {})
        self._active: dict[str, list[Callable[[], None]]] = {}

    @property
    def progress(self) -> float:
        """Share of the run elapsed, in [0, 1]."""
        return min(max((self.clock() - self.start) / self.duration_s, 0.0), 1.0)

    @property
    def finished(self) -> bool:
        return self.clock() - self.start >= self.duration_s

    @property
    def active_phases(self) -> tuple[str, ...]:
        """Names of the phases whose faults are injected now."""
        return tuple(self._active)

    def update(self) -> tuple[str, ...]:
        """Bring the injected faults in line with the current phases; returns their names."""
        wanted = {} if self.finished else {p.name: p for p in self.scenario.phases_at(self.progress)}
        for name in [n for n in self._active if n not in wanted]:
            for undo in self._active.pop(name):
                undo()
        for name, phase in wanted.items():
            if name not in self._active:
                self._active[name] = list(self._apply(phase.faults))
        return self.active_phases

    def _apply(self, specs: Iterable[_FaultSpec | ProxySpec]) -> Iterable[Callable[[], None]]:
        for spec in specs:
            if isinstance(spec, ProxySpec):
                proxy = self.proxies.get(spec.target)
                if proxy is not None:
                    yield spec.apply(proxy)
                    continue
                fault = spec.in_process()
                if fault is not None:
                    yield self.chaos.inject(fault, stage=spec.target).remove
                continue
            yield self.chaos.inject(spec.build(), stage=spec.stage, tenant=spec.tenant).remove

    def stop(self) -> None:
        """Undo every fault this runner applied (removes injected faults, heals proxies)."""
        for undos in self._active.values():
            for undo in undos:
                undo()
        self._active.clear()

    async def run(self, *, tick_s: float = 0.05) -> None:
        """Update every ``tick_s`` seconds (real sleeps) until the run ends, then remove the faults."""
        if not tick_s > 0:
            raise ConfigError(f"ScenarioRunner.run: tick_s must be > 0, got {tick_s!r}")
        max_ticks = math.ceil(self.duration_s / tick_s) + 2
        try:
            for _ in range(max_ticks):  # bounded even when the clock does not advance
                self.update()
                if self.finished:
                    break
                await asyncio.sleep(tick_s)
        finally:
            self.stop()
