"""Every query of the Grafana dashboard (both copies) is PromQL that Prometheus's own parser
accepts, once Grafana's variables are substituted. The queries run against real data in
test_prometheus_scrapes_the_operator_through_a_restart.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from . import dashboards
from .dashboards import (
    DASHBOARDS,
    Query,
    as_recording_rules,
    grafana_values,
    panel_queries,
    variables,
)
from .rules import run_promtool

VALUES = grafana_values(scrape_interval_s=30)


def _all_queries(path: Path) -> list[Query]:
    queries = panel_queries(path)
    queries += [Query(f"{path.name} / variable {v.name}", v.selector) for v in variables(path) if v.selector]
    return queries


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_dashboard_query_parses(promtool: str, tmp_path: Path, path: Path) -> None:
    queries = _all_queries(path)
    assert len(queries) >= 20, f"{path.name}: only {len(queries)} queries found"
    rules = tmp_path / "dashboard.yaml"
    rules.write_text(yaml.safe_dump(as_recording_rules(queries, VALUES)))
    out = run_promtool(promtool, "check", "rules", rules)
    assert out.returncode == 0, f"{path.name}: promtool rejects a query:\n{out.stdout}{out.stderr}"


def test_the_dashboard_variables_are_the_ones_the_queries_use() -> None:
    for path in DASHBOARDS:
        names = {v.name for v in variables(path)}
        assert names == {"namespace", "trainingjob"}, names
        for q in panel_queries(path):
            dashboards.substitute(q.expr, VALUES)  # raises on a variable without a value


def test_promtool_rejects_a_dashboard_with_a_broken_query(promtool: str, tmp_path: Path) -> None:
    data = json.loads(DASHBOARDS[0].read_text())
    panel = next(p for p in data["panels"] if p.get("title") == "Restarts by class (per hour)")
    panel["targets"][0]["expr"] = "sum by (class) (increase(railyard_restarts_total[1h])"
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    rules = tmp_path / "dashboard.yaml"
    rules.write_text(yaml.safe_dump(as_recording_rules(_all_queries(broken), VALUES)))
    out = run_promtool(promtool, "check", "rules", rules)
    assert out.returncode != 0 and "unclosed left parenthesis" in out.stdout + out.stderr, out.stdout + out.stderr


def test_a_query_with_an_unknown_variable_is_reported() -> None:
    with pytest.raises(KeyError, match=r"\$cluster"):
        dashboards.substitute('railyard_jobs{cluster=~"$cluster"}', VALUES)
