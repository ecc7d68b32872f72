"""The shipped alert rules and Grafana dashboard parse and cover what the issues asked for. That
every metric they name exists is checked against a real scrape (test_overload_scrape.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
METRIC = re.compile(r"\bragguard_[a-z0-9_]+\b")


def test_alert_rules_parse_and_cover_the_issues() -> None:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "prometheus-alerts.yml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    names = {r["alert"] for r in rules}
    assert {
        "RagguardQpsDrop", "RagguardStageP95High", "RagguardBreakerOpen", "RagguardLoopStalls",
        "RagguardLimitAtFloor", "RagguardWellBehavedShed", "RagguardSharedStateDegraded",
    } <= names  # fmt: skip
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
        assert METRIC.findall(rule["expr"]), rule["alert"]
        assert rule["expr"].count("(") == rule["expr"].count(")")
    by_name = {r["alert"]: r["expr"] for r in rules}
    assert "0.85" in by_name["RagguardQpsDrop"] and "offset 1m" in by_name["RagguardQpsDrop"]
    assert "0.95" in by_name["RagguardStageP95High"] and "> 0.8" in by_name["RagguardStageP95High"]
    assert "ragguard_adaptive_min_limit" in by_name["RagguardLimitAtFloor"]
    assert 'priority=~"interactive|critical"' in by_name["RagguardWellBehavedShed"]
    assert "ragguard_shared_state_degraded" in by_name["RagguardSharedStateDegraded"]


def test_dashboard_parses_and_has_a_panel_for_each_capability() -> None:
    dash = json.loads((EXAMPLES / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 30
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    used = {m for e in exprs for m in METRIC.findall(e)}
    for wanted in ("ragguard_adaptive_limit", "ragguard_adaptive_in_flight", "ragguard_adaptive_queue_length",
                   "ragguard_load_shed_total", "ragguard_throttled_total", "ragguard_hedges_total",
                   "ragguard_tenant_in_flight", "ragguard_tenant_waiting", "ragguard_shared_state_degraded"):
        assert wanted in used, wanted
    cells = {(p["gridPos"]["x"], p["gridPos"]["y"]) for p in dash["panels"]}
    assert len(cells) == len(dash["panels"]), "no two panels on the same cell"
