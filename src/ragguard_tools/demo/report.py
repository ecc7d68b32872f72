"""Statistics of a demo run, the side-by-side table, the JSON report and the PNG chart."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ragguard.events import CallOutcome, FallbackServed, StreamCut, StreamEnded, StreamSettled

from .loadgen import OUTCOMES, RequestRecord

__all__ = [
    "STALL_S",
    "DemoReport",
    "GenerationTally",
    "RunResult",
    "TenantStreams",
    "Transition",
    "print_table",
    "summarize",
]

STALL_S = 1.0
OPENED_ROW = "breaker opened, incl. after a failed trial"  # the words of ragguard doctor's opened_times()
"""A wait longer than this (seconds) between two words of an answer is a stall."""
BUDGETS = ("first_item", "idle", "total")
_STAGE_ORDER = {"embedding": 0, "vector_store": 1, "rerank": 2, "generation": 3, "model": 4}
ENDINGS = ("completed", "continued", "incomplete")
_FAILED_CALLS = ("failure", "slow_failure")
_BAND_COLOURS = {"open": "#d62728", "forced_open": "#8c564b", "half_open": "#ff7f0e"}


@dataclass(frozen=True, slots=True)
class Transition:
    """Breaker ``breaker`` went from ``old`` to ``new`` at ``at_s`` seconds into the run."""

    at_s: float
    breaker: str
    old: str
    new: str


@dataclass(slots=True)
class TenantStreams:
    """One tenant's generation streams in a guarded run, from ``StreamSettled`` events: how many
    ended, the model's tokens handed over, and the pacing (seconds waited, streams delayed)."""

    streams: int = 0
    tokens: int = 0
    paced_s: float = 0.0
    paced_streams: int = 0


@dataclass(slots=True)
class GenerationTally:
    """What a guarded run's generation stage did, counted from its events (:meth:`on_event`):
    the streams each budget cut (``first_item``, ``idle``, ``total``), the answers its fallback
    served (before their first word), each tenant's :class:`TenantStreams`; ``paced_to`` names
    the tenants whose tokens are paced, with their ``tokens_per_s``. ``endings``: every guarded
    stream's typed ending (``StreamEnded``), by stage then kind (the answer's stage,
    ``generation``, and its deployments', ``model``); ``deployments``: each deployment's calls
    by outcome (its breaker's ``CallOutcome``: ``model[a]``...)."""

    paced_to: dict[str, float] = field(default_factory=dict)
    cuts: dict[str, int] = field(default_factory=dict)
    fallbacks: int = 0
    streams: dict[str, TenantStreams] = field(default_factory=dict)
    endings: dict[str, dict[str, int]] = field(default_factory=dict)
    deployments: dict[str, dict[str, int]] = field(default_factory=dict)

    def on_event(self, event: object) -> None:
        if isinstance(event, StreamCut):
            self.cuts[event.budget] = self.cuts.get(event.budget, 0) + 1
        elif isinstance(event, FallbackServed) and event.stage == "generation":
            self.fallbacks += 1
        elif isinstance(event, StreamEnded):
            kinds = self.endings.setdefault(event.stage, {})
            kinds[event.ending] = kinds.get(event.ending, 0) + 1
        elif isinstance(event, CallOutcome) and event.breaker.startswith("model["):
            outcomes = self.deployments.setdefault(event.breaker, {})
            outcomes[event.outcome] = outcomes.get(event.outcome, 0) + 1
        elif isinstance(event, StreamSettled):
            tally = self.streams.setdefault(event.tenant, TenantStreams())
            tally.streams += 1
            tally.tokens += event.tokens
            tally.paced_s += event.paced_s
            tally.paced_streams += event.paced_s > 0


@dataclass(slots=True)
class RunResult:
    """Everything recorded during one run (``mode`` is ``unguarded`` or ``guarded``);
    ``generation`` is None for a run without ragguard."""

    mode: str
    duration_s: float
    records: list[RequestRecord]
    phases: list[tuple[str, float, float]]
    transitions: list[Transition] = field(default_factory=list)
    stalls: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    breakers: list[str] = field(default_factory=list)
    rerank_floor: int | None = None
    generation: GenerationTally | None = None


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if values else None


def token_rate(records: Sequence[RequestRecord], tenants: Sequence[str], *, bin_s: float = 1.0) -> Any:
    """Tokens ``tenants`` received per second, in bins of ``bin_s`` seconds from the run's start
    (a numpy array as long as the last answer's end needs). The client times an answer's first
    word and its end, not each word: an answer's tokens are spread evenly between the two."""
    wanted = set(tenants)
    spans = [(r.at_s + r.ttft_s, r.at_s + r.latency_s, r.tokens)
             for r in records if r.tenant in wanted and r.tokens and r.ttft_s is not None]
    bins = np.zeros(int(max((end for _, end, _ in spans), default=0.0) / bin_s) + 1)
    for begin, end, n in spans:
        first, last = int(begin / bin_s), int(end / bin_s)
        if end - begin <= 1e-6 or first == last:
            bins[first] += n
            continue
        for i in range(first, last + 1):
            overlap = min(end, (i + 1) * bin_s) - max(begin, i * bin_s)
            bins[i] += n * overlap / (end - begin)
    return bins / bin_s


def summarize(
    run: RunResult, *, greedy: Sequence[str], slo_s: float, healthy: Mapping[int, bool] | None = None
) -> dict[str, Any]:
    """The figures of one run (latencies in milliseconds, rates 0..1, goodput in requests/s).
    ``healthy``: each question's recall@5 hit on the healthy service (the baseline's), for the
    healthy recall@5 of the very questions a run answered (None: not given)."""
    recs = run.records
    ok = [r for r in recs if r.outcome == "ok"]
    polite = [r for r in recs if r.tenant not in greedy]
    polite_ok = [r for r in polite if r.outcome == "ok"]
    ok_ms = [r.latency_s * 1000 for r in ok]
    all_ms = [r.latency_s * 1000 for r in recs]
    served: Counter[str] = Counter(f for r in ok for f in _fallbacks(r))
    failovers: Counter[str] = Counter(f for r in ok for f in dict.fromkeys(r.fallbacks) if _is_failover(f))
    begun = [r for r in recs if r.words or r.outcome == "ok"]  # every answer that began, or was served
    continued = [r for r in ok if r.ending == "continued"]
    checked = [r for r in ok if r.whole is not None]
    tenants = sorted({r.tenant for r in recs})
    quota = {t: sum(1 for r in recs if r.tenant == t and r.outcome == "quota") for t in tenants}
    sent = {t: sum(1 for r in recs if r.tenant == t) for t in tenants}
    per_tenant_ok = {t: sum(1 for r in recs if r.tenant == t and r.outcome == "ok") for t in tenants}
    transitions: Counter[str] = Counter(f"{t.breaker}: {t.old}->{t.new}" for t in run.transitions)
    opened = {b: sum(1 for t in run.transitions if t.breaker == b and t.new == "open") for b in run.breakers}
    reopened = {b: sum(1 for t in run.transitions if t.breaker == b and t.new == "open"
                       and t.old == "half_open") for b in run.breakers}  # fmt: skip
    ttft_ms = [r.ttft_s * 1000 for r in recs if r.ttft_s is not None]
    gen = run.generation
    tokens = {t: sum(r.tokens for r in recs if r.tenant == t) for t in tenants}
    peaks = {t: float(token_rate(recs, [t]).max(initial=0.0)) for t in tenants}
    return {
        "mode": run.mode,
        "requests": len(recs),
        "answered": len(ok),
        "success_rate": len(ok) / len(recs) if recs else 0.0,
        "success_rate_well_behaved": len(polite_ok) / len(polite) if polite else 0.0,
        "goodput_per_s": sum(1 for r in ok if r.latency_s <= slo_s) / run.duration_s,
        "slo_ms": slo_s * 1000,
        # Every request, answered or failed: what a caller waited for. A request that fails
        # after 3.5 s cost its caller 3.5 s, so failures are not left out of the tail.
        "latency_ms": {"p50": _pct(all_ms, 50), "p95": _pct(all_ms, 95), "p99": _pct(all_ms, 99)},
        "latency_answered_ms": {"p50": _pct(ok_ms, 50), "p95": _pct(ok_ms, 95), "p99": _pct(ok_ms, 99)},
        "outcomes": {o: sum(1 for r in recs if r.outcome == o) for o in OUTCOMES},
        # the fallbacks that served answers (a failover or a continuation is counted apart)
        "fallback_share": {name: n / len(ok) for name, n in sorted(served.items())} if ok else {},
        "fallback_share_any": (sum(1 for r in ok if _fallbacks(r)) / len(ok)) if ok else 0.0,
        "failovers": dict(sorted(failovers.items())),  # "group/deployment": answers after a failover
        # how each answer's stream ended, as the guarded service's trailers told the client
        "endings": {e: sum(1 for r in begun if r.ending == e) for e in ENDINGS},
        "untyped_endings": sum(1 for r in begun if not r.ending),
        "continued_by": dict(sorted(Counter(r.continued_by for r in continued).items())),
        "recall_at_5_continued": (sum(1 for r in continued if r.hit) / len(continued)) if continued else None,
        "whole_answers": sum(1 for r in checked if r.whole),
        "whole_checked": len(checked),
        "breaker_transitions": len(run.transitions),
        "breaker_transitions_by_kind": dict(sorted(transitions.items())),
        "breaker_opened": opened,  # every move to open, reopenings after a failed trial included
        "breaker_reopened": reopened,  # of those, the moves from half-open
        "rerank_floor": run.rerank_floor,
        "quota_rejections": quota,
        "requests_by_tenant": sent,
        "answered_by_tenant": per_tenant_ok,
        "recall_at_5_answered": (sum(1 for r in ok if r.hit) / len(ok)) if ok else None,
        # the healthy service's recall@5 over the same questions: what the answered ones would have
        # scored healthy (a run's questions are a sample: its mix moves recall@5 as much as faults do)
        "recall_at_5_answered_healthy": _healthy_recall(ok, healthy),
        "recall_at_5_continued_healthy": _healthy_recall(continued, healthy),
        "recall_at_5_all_requests": (sum(1 for r in ok if r.hit) / len(recs)) if recs else None,
        "loop_stalls": len(run.stalls),
        "max_loop_stall_ms": max((s["duration_s"] * 1000 for s in run.stalls), default=0.0),
        "wall_s": run.wall_s,
        # The answer's stream, as the caller saw it.
        "ttft_ms": {"p50": _pct(ttft_ms, 50), "p95": _pct(ttft_ms, 95), "p99": _pct(ttft_ms, 99)},
        "slow_first_word": sum(1 for r in recs if r.ttft_s is not None and r.ttft_s > STALL_S),
        "answered_after_stall": sum(1 for r in ok if r.max_gap_s > STALL_S),
        "stall_s": STALL_S,
        "tokens_by_tenant": tokens,
        "tokens_per_s_by_tenant": {t: n / run.duration_s for t, n in tokens.items()},
        "peak_tokens_per_s_by_tenant": peaks,
        # What ragguard's generation stage did (None without it).
        "stream_cuts": None if gen is None else {b: gen.cuts.get(b, 0) for b in BUDGETS},
        "generation_fallbacks": None if gen is None else gen.fallbacks,
        "stream_endings": None if gen is None else {k: dict(v) for k, v in sorted(gen.endings.items())},
        "deployment_calls": None if gen is None else {k: dict(v) for k, v in sorted(gen.deployments.items())},
        "streams_by_tenant": None if gen is None else {t: asdict(v) for t, v in sorted(gen.streams.items())},
        "paced_tokens_per_s": {} if gen is None else dict(gen.paced_to),
    }


@dataclass(slots=True)
class DemoReport:
    """The outcome of ``ragguard demo``: both runs, their summaries and the healthy baseline."""

    options: dict[str, Any]
    baseline_recall_at_5: float
    questions: int
    passages: int
    timings_s: dict[str, float]
    runs: dict[str, RunResult]
    summaries: dict[str, dict[str, Any]]
    greedy: list[str]
    json_path: Path | None = None
    chart_path: Path | None = None
    baseline_hits: dict[int, bool] = field(default_factory=dict)  # question -> hit, healthy

    def to_dict(self, *, with_requests: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "options": self.options,
            "corpus": {"passages": self.passages, "questions": self.questions},
            "baseline_recall_at_5": self.baseline_recall_at_5,
            "baseline_hits": {str(q): hit for q, hit in sorted(self.baseline_hits.items())},
            "timings_s": self.timings_s,
            "greedy_tenants": self.greedy,
            "summary": self.summaries,
            "phases": {m: r.phases for m, r in self.runs.items()},
            "breaker_transitions": {m: [asdict(t) for t in r.transitions] for m, r in self.runs.items()},
            "loop_stalls": {m: r.stalls for m, r in self.runs.items()},
        }
        if with_requests:
            out["requests"] = {m: [asdict(x) for x in r.records] for m, r in self.runs.items()}
        return out

    def write_json(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1, default=str))
        self.json_path = path
        return path

    # -- the table ----------------------------------------------------------------------------

    def table(self) -> Any:
        """A rich Table comparing the runs side by side."""
        from rich.markup import escape
        from rich.table import Table

        modes = [m for m in ("unguarded", "guarded") if m in self.summaries]
        table = Table(
            title="ragguard demo: the same load and chaos, unguarded vs guarded", title_justify="left"
        )
        table.add_column("metric")
        for m in modes:
            table.add_column(m, justify="right")
        s = [self.summaries[m] for m in modes]

        def row(name: str, values: list[str]) -> None:
            table.add_row(escape(name), *values)  # a key's breaker, "model[a]", is not markup

        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:,.0f} ms"

        def pct(v: float | None) -> str:
            return "-" if v is None else f"{100 * v:.1f} %"

        row("requests", [str(x["requests"]) for x in s])
        row("success rate (all tenants)", [pct(x["success_rate"]) for x in s])
        row("success rate (well-behaved tenants)", [pct(x["success_rate_well_behaved"]) for x in s])
        row(f"goodput (answered within {s[0]['slo_ms']:.0f} ms)", [f"{x['goodput_per_s']:.1f} /s" for x in s])
        for q in ("p50", "p95", "p99"):
            row(f"latency {q.upper()} (every request)", [ms(x["latency_ms"][q]) for x in s])
        row("latency P99 (answered requests only)", [ms(x["latency_answered_ms"]["p99"]) for x in s])
        row("time to first word P95 (answers begun)", [ms(x["ttft_ms"]["p95"]) for x in s])
        stall = f"{s[0]['stall_s']:g} s"
        row(f"first word after more than {stall}", [str(x["slow_first_word"]) for x in s])
        row(f"answered late, after a stall of over {stall}", [str(x["answered_after_stall"]) for x in s])
        for outcome in OUTCOMES[1:]:
            label = "failed: incomplete (cut mid-answer)" if outcome == "cut" else f"failed: {outcome}"
            row(label, [str(x["outcomes"][outcome]) for x in s])
        row("answered by a fallback (any)", [pct(x["fallback_share_any"]) for x in s])
        names = sorted({n for x in s for n in x["fallback_share"]})
        for name in names:
            row(f"  served by fallback: {name}", [pct(x["fallback_share"].get(name, 0.0)) for x in s])
        self._generation_rows(row, s)
        row("breaker transitions", [str(x["breaker_transitions"]) for x in s])
        breakers = sorted({b for x in s for b in x["breaker_opened"]}, key=_stage_key)
        if breakers:  # counted as `ragguard doctor` counts them: a reopening is an opening too
            row(OPENED_ROW, [str(sum(x["breaker_opened"].values())) if x["breaker_opened"] else "-"
                             for x in s])  # fmt: skip
        for name in breakers:
            label = f"  {name}" + (" (OOM at floor only)" if name == "rerank" else "")
            row(label, [str(x["breaker_opened"][name]) if name in x["breaker_opened"] else "-" for x in s])
        for tenant in sorted({t for x in s for t in x["quota_rejections"]}):
            label = f"quota rejections: {tenant}" + (" (greedy)" if tenant in self.greedy else "")
            row(label, [f"{x['quota_rejections'].get(tenant, 0)} / {x['requests_by_tenant'].get(tenant, 0)}"
                        for x in s])
        paced = {t: r for x in s for t, r in x["paced_tokens_per_s"].items()}
        for tenant in sorted({t for x in s for t in x["tokens_per_s_by_tenant"]}):
            label = f"tokens/s, mean / peak: {tenant}" + (" (greedy)" if tenant in self.greedy else "")
            row(label, [f"{x['tokens_per_s_by_tenant'].get(tenant, 0.0):,.0f} / "
                        f"{x['peak_tokens_per_s_by_tenant'].get(tenant, 0.0):,.0f}" for x in s])
        for tenant, rate in sorted(paced.items()):
            row(f"streams paced: {tenant} (to {rate:,.0f} tokens/s)", [_paced(x, [tenant]) for x in s])
        others = sorted({t for x in s for t in x["tokens_per_s_by_tenant"]} - set(paced))
        if paced:
            row("streams paced: every other tenant", [_paced(x, others) for x in s])
        row("recall@5 of answered requests", [pct(x["recall_at_5_answered"]) for x in s])
        row("recall@5 of continued answers", [pct(x["recall_at_5_continued"]) for x in s])
        row("recall@5 healthy baseline", [pct(self.baseline_recall_at_5)] * len(s))
        row("recall@5 healthy, same questions answered", [pct(x["recall_at_5_answered_healthy"]) for x in s])
        row("recall@5 healthy, same questions continued",
            [pct(x["recall_at_5_continued_healthy"]) for x in s])  # fmt: skip
        row("event-loop stalls (>20 ms)",
            [f"{x['loop_stalls']} (max {x['max_loop_stall_ms']:.0f} ms)" for x in s])
        note = _rerank_note(self.summaries.get("guarded"))
        if note:
            table.caption, table.caption_justify = note, "left"
        return table

    @staticmethod
    def _generation_rows(row: Callable[[str, list[str]], None], s: list[dict[str, Any]]) -> None:
        """The answer's rows: its fallback, failovers between deployments, each deployment's
        failed streams, how every answer ended (continued ones by whom), whole answers."""

        def guarded(x: dict[str, Any], value: str) -> str:
            return "-" if x["stream_endings"] is None else value

        row("generation fallback, before the first word",
            [guarded(x, str(x["generation_fallbacks"])) for x in s])  # fmt: skip
        for name in sorted({n for x in s for n in x["failovers"]}):
            group, deployment = name.split("/", 1)
            row(f"answered by {deployment} ({group} failover)",
                [guarded(x, str(x["failovers"].get(name, 0))) for x in s])  # fmt: skip
        for key in sorted({k for x in s for k in x["deployment_calls"] or {}}):
            row(f"{key}: streams failed / all",
                [guarded(x, _failed_of((x["deployment_calls"] or {}).get(key, {}))) for x in s])  # fmt: skip
        row("answers cut by budget (first/idle/total)",
            [guarded(x, " / ".join(str((x["stream_cuts"] or {}).get(b, 0)) for b in BUDGETS)) for x in s])
        for ending in ENDINGS:
            row(f"answers ended {ending}", [guarded(x, str(x["endings"][ending])) for x in s])
            if ending == "continued":
                for by in sorted({b for x in s for b in x["continued_by"]}):
                    row(f"  continued by {by}", [guarded(x, str(x["continued_by"].get(by, 0))) for x in s])
        row("answers without a typed ending", [guarded(x, str(x["untyped_endings"])) for x in s])
        row("whole answers (no word repeated/missing)",
            [f"{x['whole_answers']} / {x['whole_checked']}" for x in s])  # fmt: skip

    # -- the chart ----------------------------------------------------------------------------

    def write_chart(self, path: Path) -> Path:
        """Write :meth:`chart` as a PNG to ``path`` (folders created); returns ``path``."""
        fig = self.chart()
        import matplotlib.pyplot as plt

        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        self.chart_path = path
        return path

    def chart(self) -> Any:
        """A matplotlib Figure: the latency of every request over time (to an answer's last word,
        or its error), one panel per run on one shared y-range, with the scenario's phases
        shaded; answers a fallback served and answers cut mid-way are drawn apart from healthy
        ones. Under them the tokens per second the greedy tenant and the others received in
        each run, and a strip with each breaker's open / half-open stretches. Close it with
        ``matplotlib.pyplot.close(fig)``."""
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        modes = [m for m in ("unguarded", "guarded") if m in self.runs]
        names = {t.breaker for r in self.runs.values() for t in r.transitions}
        names |= {b for r in self.runs.values() for b in r.breakers}
        breakers = sorted(names, key=_stage_key)
        ratios = [3.0] * len(modes) + [1.8, 0.35 + 0.3 * max(1, len(breakers))]
        fig, axes = plt.subplots(len(ratios), 1, figsize=(11, 2.9 * len(modes) + 3.4), sharex=True,
                                 gridspec_kw={"height_ratios": ratios})
        latencies = [_ms(r) for run in self.runs.values() for r in run.records]
        for ax, mode in zip(axes[: len(modes)], modes, strict=True):
            run = self.runs[mode]
            _phases(ax, run.phases, labels=True)
            for outcome, style in _MARKERS.items():
                recs = [r for r in run.records if _kind(r) == outcome]
                ax.scatter([r.at_s for r in recs], [_ms(r) for r in recs], zorder=3, **style)
            summary = self.summaries[mode]
            ax.set_yscale("log")
            if latencies:  # one y-range for both runs, so their heights compare at a glance
                ax.set_ylim(min(latencies) / 1.5, max(latencies) * 1.5)
            ax.set_ylabel("latency (ms)")
            ax.set_title(
                f"{mode}: success {100 * summary['success_rate']:.1f} %, "
                f"{100 * summary['fallback_share_any']:.0f} % of answers by a fallback, P99 "
                f"{summary['latency_ms']['p99'] or 0:,.0f} ms (answered only: "
                f"{summary['latency_answered_ms']['p99'] or 0:,.0f} ms)",
                loc="left", fontsize=9, pad=14,
            )
        self._token_panel(axes[len(modes)], modes)
        strip = axes[-1]
        guarded = self.runs.get("guarded")
        if guarded is not None:
            _phases(strip, guarded.phases, labels=False)
            note = _rerank_note(self.summaries.get("guarded"))
            for i, name in enumerate(breakers):
                _breaker_row(strip, guarded, name, i)
                if name == "rerank" and note:
                    strip.text(0.01, i, _RERANK_STRIP_NOTE.format(floor=guarded.rerank_floor),
                               transform=strip.get_yaxis_transform(), va="center", fontsize=7, color="0.25")
        strip.set_yticks(range(len(breakers)), [f"breaker {b}" for b in breakers], fontsize=8)
        strip.set_ylim(-0.6, max(1, len(breakers)) - 0.4)
        strip.invert_yaxis()
        strip.set_title("guarded run: breaker states", loc="left", fontsize=9)
        strip.set_xlim(0, max(r.duration_s for r in self.runs.values()))
        strip.set_xlabel("seconds into the run")
        handles: list[Any] = [
            Line2D([], [], ls="", label=_LABELS[outcome], **_legend_style(style))
            for outcome, style in _MARKERS.items()
        ]
        handles += [
            Patch(color=_BAND_COLOURS["open"], alpha=0.6, label="breaker open"),
            Patch(color=_BAND_COLOURS["half_open"], alpha=0.6, label="breaker half-open"),
        ]
        # two rows: the longer labels (fallback, failover or continuation) no longer fit in one
        columns = (len(handles) + 1) // 2
        fig.legend(handles=handles, loc="lower center", ncol=columns, fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0.06, 1, 1))
        return fig


    def _token_panel(self, ax: Any, modes: Sequence[str]) -> None:
        """Tokens per second the greedy tenant and the others received, both runs, with the
        rate the greedy tenant's tokens are paced to."""
        for mode in modes:
            run = self.runs[mode]
            others = sorted({r.tenant for r in run.records} - set(self.greedy))
            colour = _RUN_COLOURS[mode]
            for tenants, style, who in ((self.greedy, "-", "greedy tenant"), (others, "--", "the others")):
                rate = token_rate(run.records, tenants)
                if len(rate):
                    ax.step(np.arange(len(rate)), rate, where="post", ls=style, lw=1.0, color=colour,
                            label=f"{mode}: {who}")
            for tenant, limit in (run.generation.paced_to if run.generation else {}).items():
                ax.axhline(limit, ls=":", lw=0.8, color=colour, label=f"{tenant} paced to {limit:,.0f}/s")
        if self.runs:
            _phases(ax, next(iter(self.runs.values())).phases, labels=False)
        ax.set_ylabel("tokens/s")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="upper left", ncol=3, frameon=False)
        ax.set_title("tokens received per second (the greedy tenant and all the others together)",
                     loc="left", fontsize=9)


_RUN_COLOURS = {"unguarded": "#d62728", "guarded": "#1f77b4"}

# How the chart draws each kind of request: healthy answers, answers a fallback served, requests
# shed by a tenant quota, answers cut after their first word, and other failures.
_MARKERS: dict[str, dict[str, Any]] = {
    "healthy": {"s": 5, "color": "#1f77b4", "marker": "o"},
    "fallback": {"s": 9, "edgecolors": "#2ca02c", "marker": "D", "facecolors": "none", "linewidths": 0.6},
    "quota": {"s": 8, "color": "0.55", "marker": "v"},
    "cut": {"s": 11, "edgecolors": "#9467bd", "marker": "s", "facecolors": "none", "linewidths": 0.7},
    "failed": {"s": 10, "color": "#d62728", "marker": "x", "linewidths": 0.7},
}
_LABELS = {
    "healthy": "answered",
    "fallback": "answered by a fallback, failover or continuation",
    "quota": "shed by tenant quota",
    "cut": "incomplete (cut mid-answer)",
    "failed": "failed",
}
_RERANK_STRIP_NOTE = (
    "closed: an out-of-memory error above the floor batch ({floor}) is recovered by chunking and "
    "not counted; only one at the floor counts"
)


def _fallbacks(record: RequestRecord) -> list[str]:
    """The fallbacks that served ``record`` (names in :func:`ragguard.degraded`), without the
    failovers (``group/deployment``) and the continued or incomplete streams it names too."""
    return [f for f in dict.fromkeys(record.fallbacks) if not _is_failover(f) and ": " not in f]


def _is_failover(name: str) -> bool:
    """A model group's ``group/deployment`` in :func:`ragguard.degraded`: answered after a failover."""
    return "/" in name and ": " not in name


def _healthy_recall(records: Sequence[RequestRecord], healthy: Mapping[int, bool] | None) -> float | None:
    """recall@5 the healthy service had on the questions of ``records`` (None: no records or no map)."""
    known = [healthy[r.question] for r in records if r.question in healthy] if healthy else []
    return sum(known) / len(known) if known else None


def _failed_of(outcomes: dict[str, int]) -> str:
    failed = sum(outcomes.get(o, 0) for o in _FAILED_CALLS)
    return f"{failed} / {sum(outcomes.values())}"


def _paced(summary: dict[str, Any], tenants: Sequence[str]) -> str:
    """``paced / streams`` of ``tenants`` in a run's summary; "-" without ragguard."""
    streams = summary["streams_by_tenant"]
    if streams is None:
        return "-"
    got = [streams[t] for t in tenants if t in streams]
    return f"{sum(v['paced_streams'] for v in got)} / {sum(v['streams'] for v in got)}"


def _kind(record: RequestRecord) -> str:
    if record.outcome == "ok":
        return "fallback" if record.fallbacks else "healthy"
    return record.outcome if record.outcome in ("quota", "cut") else "failed"


def _ms(record: RequestRecord) -> float:
    return max(record.latency_s, 1e-4) * 1000


def _legend_style(style: dict[str, Any]) -> dict[str, Any]:
    if style.get("facecolors") == "none":
        return {"marker": style["marker"], "color": style["edgecolors"], "markerfacecolor": "none"}
    return {"marker": style["marker"], "color": style["color"]}


def _stage_key(name: str) -> tuple[int, str]:
    return _STAGE_ORDER.get(name.split("[", 1)[0], len(_STAGE_ORDER)), name  # a key's breaker: stage[key]


def _rerank_note(summary: dict[str, Any] | None) -> str:
    """Why the rerank breaker stayed closed while chunked rerank served, or "" when it did not."""
    if not summary or summary["breaker_opened"].get("rerank", 1) or not summary["fallback_share"].get(
        "chunked_rerank"
    ):
        return ""
    floor = summary.get("rerank_floor") or "the floor"
    return (
        f"rerank breaker closed: an out-of-memory error above the floor batch ({floor} candidates) is "
        "recovered by scoring in smaller chunks (chunked_rerank) and not counted; only one at the "
        "floor counts."
    )


def _phases(ax: Any, phases: Sequence[tuple[str, float, float]], *, labels: bool) -> None:
    for i, (name, start, end) in enumerate(phases):
        if i % 2:
            ax.axvspan(start, end, color="0.93", zorder=0)
        if labels:
            ax.text((start + end) / 2, 1.01, name, transform=ax.get_xaxis_transform(), ha="center",
                    va="bottom", fontsize=7)


def _breaker_row(ax: Any, run: RunResult, name: str, row: int) -> None:
    """Row ``row`` of the strip: breaker ``name``, coloured while open or half-open."""
    state, since = "closed", 0.0
    for t in sorted((t for t in run.transitions if t.breaker == name), key=lambda t: t.at_s):
        _span(ax, state, since, t.at_s, row)
        state, since = t.new, t.at_s
    _span(ax, state, since, run.duration_s, row)


def _span(ax: Any, state: str, start: float, end: float, row: int) -> None:
    colour = _BAND_COLOURS.get(state)
    if colour is not None and end > start:
        ax.barh(row, end - start, left=start, height=0.7, color=colour, alpha=0.6, lw=0, zorder=2)


_PIPE_MAX_WIDTH = 200
"""The widest a table is printed in a pipe or a log (columns); the demo's needs about 90."""


def print_table(console: Any, table: Any) -> None:
    """Print ``table`` on ``console``: in a terminal at the terminal's width, in a pipe or a log
    (where rich assumes 80 columns) at the table's own width, each row on one line as the docs show
    it."""
    if console.is_terminal:
        console.print(table)
        return
    natural = console.measure(table, options=console.options.update_width(_PIPE_MAX_WIDTH)).maximum
    width = console.width
    console.width = max(width, natural)  # print(width=...) cannot go past the console's width
    try:
        console.print(table)
    finally:
        console.width = width
