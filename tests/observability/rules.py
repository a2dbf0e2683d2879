"""Railyard's alerting rules in their three shapes, and promtool over them.

The rules ship as a plain Prometheus rule file (deploy/prometheus/railyard-alerts.yaml), as a
PrometheusRule (deploy/prometheus/railyard-rules.yaml) and as the chart's template
(``prometheusRule.enabled``); promtool reads only the plain shape, so the other two are
unwrapped into it (``spec.groups`` -> ``groups``).
"""

from __future__ import annotations

import copy
import functools
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from tests.deployment.chart import ROOT, render_objects

DEPLOY = ROOT / "deploy" / "prometheus"
PLAIN_RULES = DEPLOY / "railyard-alerts.yaml"
PROMETHEUS_RULE = DEPLOY / "railyard-rules.yaml"
UNIT_TESTS = sorted((DEPLOY / "tests").glob("*.yaml"))

Groups = list[dict[str, Any]]


def plain_groups() -> Groups:
    return list(yaml.safe_load(PLAIN_RULES.read_text())["groups"])


def prometheusrule_groups() -> Groups:
    return list(yaml.safe_load(PROMETHEUS_RULE.read_text())["spec"]["groups"])


def chart_groups(values: dict[str, Any] | None = None) -> Groups:
    """The groups of the PrometheusRule the chart renders with ``values`` (rules enabled)."""
    return copy.deepcopy(_chart_groups(json.dumps(values or {}, sort_keys=True)))


@functools.cache
def _chart_groups(values_json: str) -> Groups:
    merged: dict[str, Any] = json.loads(values_json)
    merged["prometheusRule"] = {**merged.get("prometheusRule", {}), "enabled": True}
    rules = [o for o in render_objects(merged) if o.get("kind") == "PrometheusRule"]
    assert len(rules) == 1, f"the chart rendered {len(rules)} PrometheusRules"
    return list(rules[0]["spec"]["groups"])


def alerts(groups: Groups) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def write_rules(groups: Groups, path: Path) -> Path:
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def run_promtool(binary: str, *args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd)


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def seconds(duration: str | int | None) -> float:
    """A Prometheus duration (``1h30m``, ``10m``, ``0s``) in seconds; None (no ``for:``) is 0."""
    if duration is None:
        return 0.0
    text = str(duration)
    parts = re.findall(r"(\d+)(ms|[smhdwy])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return float(sum(int(n) * _UNITS[u] for n, u in parts))
