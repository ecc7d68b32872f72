"""The chaos scenario of a demo run: phases over time, each putting faults in force.

A scenario file (YAML)::

    name: default
    phases:
      - {name: warm-up, start: 0.0}
      - name: embedding latency spikes
        start: 0.15                        # fraction of the run's duration, 0 <= start < 1
        embedding: {latency_s: 3.5, share: 0.3}
      - {name: vector store down, start: 0.45, vector_store: {down: true}}
      - {name: rerank OOM, start: 0.68, rerank: {memory_budget_mib: 2}}
      - {name: recovery, start: 0.85}

A phase lasts until the next one starts; the faults it lists replace the previous phase's (a phase
without faults is healthy). ``embedding`` and ``vector_store`` take ``latency_s`` (seconds) and
``share`` (0..1 of calls); ``vector_store`` also ``down`` (its server stops: connection refused);
``rerank`` takes ``memory_budget_mib`` (the reranker's per-batch budget).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .._errors import ConfigError
from .backends import BackendFaults

__all__ = ["Phase", "Scenario", "load_scenario"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LatencyFault(_Model):
    latency_s: float = Field(default=0.0, ge=0, le=600)
    share: float = Field(default=0.0, ge=0, le=1)


class VectorStoreFault(LatencyFault):
    down: bool = False


class RerankFault(_Model):
    memory_budget_mib: float = Field(gt=0, le=1_000_000)


class Phase(_Model):
    """One stretch of the run, from ``start`` (fraction of the duration) to the next phase."""

    name: str = Field(min_length=1, max_length=80)
    start: float = Field(ge=0, lt=1)
    embedding: LatencyFault | None = None
    vector_store: VectorStoreFault | None = None
    rerank: RerankFault | None = None

    def backend_faults(self) -> BackendFaults:
        e = self.embedding or LatencyFault()
        v = self.vector_store or VectorStoreFault()
        return BackendFaults(
            embed_latency_s=e.latency_s,
            embed_latency_share=e.share,
            vector_latency_s=v.latency_s,
            vector_latency_share=v.share,
            vector_down=v.down,
        )

    def rerank_budget_bytes(self, healthy_bytes: int) -> int:
        if self.rerank is None:
            return healthy_bytes
        return max(1, int(self.rerank.memory_budget_mib * 2**20))

    @property
    def healthy(self) -> bool:
        return self.embedding is None and self.vector_store is None and self.rerank is None


class Scenario(_Model):
    """Named phases in time order; the first starts at 0."""

    name: str = Field(min_length=1, max_length=80)
    description: str = ""
    phases: tuple[Phase, ...] = Field(min_length=1, max_length=100)

    @model_validator(mode="after")
    def _ordered(self) -> Scenario:
        starts = [p.start for p in self.phases]
        if starts[0] != 0.0:
            raise ValueError("the first phase must start at 0.0")
        if any(b <= a for a, b in itertools.pairwise(starts)):
            raise ValueError("phase starts must increase strictly")
        return self

    def spans(self, duration_s: float) -> list[tuple[Phase, float, float]]:
        """(phase, start_s, end_s) of every phase for a run of ``duration_s`` seconds."""
        ends = [p.start for p in self.phases[1:]] + [1.0]
        return [(p, p.start * duration_s, e * duration_s) for p, e in zip(self.phases, ends, strict=True)]

    @classmethod
    def parse(cls, data: Mapping[str, Any], *, source: str = "scenario") -> Scenario:
        """Validate a mapping; raises ConfigError naming the bad fields."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()
            )
            raise ConfigError(f"{source}: {problems}") from None


def load_scenario(path: str | Path | None = None) -> Scenario:
    """The scenario in YAML file ``path``, or the built-in default (``scenario.yaml``).

    Raises ConfigError when the file is missing, is not YAML, or does not validate.
    """
    if path is None:
        text = resources.files(__package__).joinpath("scenario.yaml").read_text("utf-8")
        source = "built-in scenario"
    else:
        try:
            text = Path(path).read_text("utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read scenario {path}: {exc.strerror or exc}") from None
        source = str(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    return Scenario.parse(data, source=source)
