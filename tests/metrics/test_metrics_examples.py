"""The shipped alert rules and Grafana dashboard parse and name only metrics the exporter produces."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ragguard import events
from ragguard.metrics import PrometheusExporter, StageCompleted
from ragguard.monitors import ConnectionLeak, LoopStall, MonitoredConnectionPool, PoolExhausted

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
METRIC = re.compile(r"\bragguard_[a-z0-9_]+\b")


def _fault_event() -> Any:
    try:
        from ragguard.chaos._chaos import FaultInjected
    except ImportError:  # the chaos toolkit is optional for this check
        return events.QuotaRejected("t", "rate", 1.0)
    return FaultInjected("embed", "t", "latency")


def _exported_names() -> set[str]:
    bus = events.EventBus()
    exporter = PrometheusExporter(bus=bus).start()
    pool = MonitoredConnectionPool(host="127.0.0.1", port=1, pool_name="p")  # never connects
    for event in (
        StageCompleted("embed", "t", "success", 0.1),
        events.CallOutcome("b", "success", 0.1),
        events.CallRejected("b", "open", 1.0),
        events.BreakerTransition("b", "closed", "open", 1.0),
        events.FallbackServed("embed", "cache", "t", "E"),
        events.QuotaRejected("t", "rate", 1.0),
        events.RetryScheduled("s", 2, 0.1, "E"),
        events.RetryBudgetExhausted("s", "t"),
        LoopStall(0.1, 0.0, 0.1, "f", "f", 1, "f"),
        PoolExhausted("p", "headroom", 1, 0, 1, 0, 0.0, 0.0, 0.0),
        ConnectionLeak("p", 1.0, 0.0, 1.0),
        _fault_event(),
    ):
        exporter.handle(event)
    text = exporter.scrape().decode()
    del pool
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.fixture(scope="module")
def exported() -> set[str]:
    return _exported_names()


def test_alert_rules_parse_and_cover_the_issue(exported: set[str]) -> None:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "prometheus-alerts.yml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    names = {r["alert"] for r in rules}
    assert {"RagguardQpsDrop", "RagguardStageP95High", "RagguardBreakerOpen", "RagguardLoopStalls"} <= names
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
        used = set(METRIC.findall(rule["expr"]))
        assert used, rule["alert"]
        assert used <= exported, f"{rule['alert']} names unknown metrics {used - exported}"
        assert rule["expr"].count("(") == rule["expr"].count(")")
    by_name = {r["alert"]: r["expr"] for r in rules}
    assert "0.85" in by_name["RagguardQpsDrop"] and "offset 1m" in by_name["RagguardQpsDrop"]
    assert "0.95" in by_name["RagguardStageP95High"] and "> 0.8" in by_name["RagguardStageP95High"]


def test_dashboard_parses_and_names_exported_metrics(exported: set[str]) -> None:
    dash = json.loads((EXAMPLES / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    used = {m for e in exprs for m in METRIC.findall(e)}
    assert used <= exported, used - exported
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


def test_every_exported_family_is_on_the_dashboard(exported: set[str]) -> None:
    dash = (EXAMPLES / "grafana-dashboard.json").read_text()
    families = {re.sub(r"_(bucket|count|sum|created)$", "", n) for n in exported} - {
        n.removesuffix("_total") for n in exported if n.endswith("_total")
    }
    assert {f for f in families if f not in dash} == set()
