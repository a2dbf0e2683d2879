"""The Grafana dashboard's queries, ready for Prometheus: template variables substituted the way
Grafana does, checked offline by promtool or run against a live Prometheus."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.deployment.chart import CHART, ROOT

from railyard.demo.prometheus import Prometheus, PrometheusError

DASHBOARDS = (ROOT / "deploy" / "grafana" / "railyard-dashboard.json", CHART / "dashboards" / "railyard.json")
_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_LABEL_VALUES = re.compile(r"^label_values\((?:(.*),\s*)?(\w+)\)$", re.S)
_METRIC = re.compile(r"\brailyard_[a-z0-9_]+")


@dataclass(frozen=True)
class Query:
    where: str  # dashboard file / panel title / refId, for messages
    expr: str  # as written in the dashboard (variables not substituted)

    @property
    def metrics(self) -> set[str]:
        return set(_METRIC.findall(self.expr))


@dataclass(frozen=True)
class Variable:
    name: str
    selector: str | None  # label_values(<selector>, <label>)
    label: str


def load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


def _panels(panels: Iterable[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels") or [])  # rows (collapsed ones keep their panels)


def panel_queries(path: Path) -> list[Query]:
    out = []
    for p in _panels(load(path).get("panels") or []):
        for t in p.get("targets") or []:
            if t.get("expr"):
                out.append(Query(f"{path.name} / {p.get('title')!r} / {t.get('refId')}", str(t["expr"])))
    return out


def variables(path: Path) -> list[Variable]:
    """The dashboard's query variables (``label_values(selector, label)``)."""
    out = []
    for v in load(path).get("templating", {}).get("list") or []:
        if v.get("type") != "query":
            continue
        q = v.get("query")
        text = str(q.get("query") if isinstance(q, dict) else q or v.get("definition") or "").strip()
        m = _LABEL_VALUES.match(text)
        assert m, f"{path.name}: variable {v['name']}: only label_values(...) queries are understood, got {text!r}"
        out.append(Variable(str(v["name"]), m.group(1), m.group(2)))
    return out


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace ``$var`` / ``${var}`` / ``${var:fmt}`` by ``values``; an unknown variable is an error
    (a new dashboard variable must be given a value here, not slip through unchecked)."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"dashboard variable ${name} has no test value (in {expr!r})")
        return values[name]

    return _VAR.sub(one, expr)


def grafana_values(*, scrape_interval_s: float, interval_s: float | None = None, namespace: str = ".*",
                   trainingjob: str = ".*") -> dict[str, str]:
    """What Grafana puts in for the built-ins and the multi-value variables. ``$__interval`` is
    the time range over the panel's width in points (6 h over ~1000 points is ~20 s);
    ``$__rate_interval`` is max($__interval + scrape interval, 4 x scrape interval)."""
    interval = scrape_interval_s if interval_s is None else interval_s
    rate = max(interval + scrape_interval_s, 4 * scrape_interval_s)
    return {
        "__rate_interval": f"{rate:g}s",
        "__interval": f"{interval:g}s",
        "__range": "1h",
        "namespace": namespace,
        "trainingjob": trainingjob,
    }


def as_recording_rules(queries: Iterable[Query], values: Mapping[str, str]) -> dict[str, Any]:
    """Every query as a recording rule, for ``promtool check rules`` to parse offline."""
    rules = [{"record": f"dashboard:query_{i}", "expr": substitute(q.expr, values)} for i, q in enumerate(queries)]
    return {"groups": [{"name": "dashboard", "rules": rules}]}


def _has_data(result: list[dict[str, Any]]) -> bool:
    for series in result:
        for _, v in series.get("values") or [series.get("value")]:
            if not math.isnan(float(v)):
                return True
    return False


def check_queries(
    prom: Prometheus,
    queries: Iterable[Query],
    values: Mapping[str, str],
    *,
    start: float,
    end: float,
    step: float,
    may_be_empty: Mapping[str, str],
) -> list[str]:
    """Run each query over [start, end]; the problems: Prometheus's errors, and queries with no
    (non-NaN) data unless every metric they read is in ``may_be_empty`` (metric -> why)."""
    problems = []
    for q in queries:
        try:
            result = prom.query_range(substitute(q.expr, values), start, end, step)
        except (PrometheusError, KeyError) as exc:
            problems.append(f"{q.where}: {q.expr}: {exc}")
            continue
        if not _has_data(result) and not (q.metrics and q.metrics <= set(may_be_empty)):
            problems.append(f"{q.where}: {q.expr}: no data (metrics {sorted(q.metrics)})")
    return problems
