"""A real Prometheus scrapes the operator while a short job of the real trainer runs through a
restart (a bit flip: SDC verdict, quarantine, restore from the memory tier), with Railyard's
alerting rules loaded. Afterwards what users look at must hold: every metric of docs/metrics.md
is there with its documented labels, ``railyard_restarts_total`` agrees with the status, every
dashboard query runs and returns data, the rules evaluate without errors and the corruption
alert fired, and ``promtool check metrics`` has nothing to say about the exposition.

Prometheus runs on loopback with a temporary data folder and a 1 s scrape interval, scraping as
the chart's ServiceMonitor does (``honor_labels``). Every wait is on a condition with a bound.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.operator.conftest import ROOT, Api, OperatorProcess, _apply_crd
from tests.system.conftest import base_spec
from tests.waiting import wait_until

from railyard.demo.prometheus import SCRAPE_JOB, Prometheus, build_report, start_prometheus
from railyard.protocol.exitcodes import FailureClass

from .dashboards import (
    DASHBOARDS,
    Query,
    check_queries,
    grafana_values,
    panel_queries,
    substitute,
    variables,
)
from .rules import PLAIN_RULES, alerts, plain_groups

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.torch, pytest.mark.timeout(420)]

NS = "railyard-prometheus"
SCRAPE_S = 1.0
#: After two memory-tier saves (every 5 steps): the restore the dashboards show needs a committed
#: checkpoint before the flip, and on a loaded machine the step-5 save can still be in flight two
#: steps later (a flip at step 7 then restarted from nothing: no restore, no restore panels).
FLIP_STEP = 12
#: Documented metrics this run cannot produce, and why. Their queries may come back empty; every
#: other metric must have series (a renamed metric in a query therefore fails).
EVENT_ONLY = {
    "railyard_reconcile_errors": "counted per exception kind, only when a reconcile cycle fails",
}


@dataclass
class Run:
    prom: Prometheus
    api: Api
    operator: OperatorProcess
    job: str
    status: dict[str, Any]
    start: float
    end: float


@pytest.fixture(scope="module")
def local_cluster(prometheus_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Our own three nodes: the flip quarantines one, which must not touch other tests' nodes."""
    from railyard_local.cluster import LocalCluster

    cluster = LocalCluster(tmp_path_factory.mktemp("railyard-prometheus"), mode="embedded", nodes=3, gpus_per_node=2,
                           topology="spine=1,leaf=2", lease_interval=1.0)
    cluster.start(timeout=120)
    try:
        yield cluster
    finally:
        cluster.stop()


def _restarts_in(prom: Prometheus) -> dict[str, int]:
    return {r["metric"]["class"].lower(): int(float(r["value"][1])) for r in prom.query("railyard_restarts_total") if float(r["value"][1])}


def _restarts_in_status(status: dict[str, Any]) -> dict[str, int]:
    r = status.get("restarts") or {}
    return {c.value.lower(): int(r[c.value.lower()]) for c in FailureClass if r.get(c.value.lower())}


@pytest.fixture(scope="module")
def run(prometheus_binary: str, local_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    import asyncio

    api = Api(Path(local_cluster.kubeconfig))
    asyncio.run(_apply_crd(api.kubeconfig, yaml.safe_load((ROOT / "crds" / "trainingjob.yaml").read_text())))
    wait_until(lambda: api.custom.list_namespaced_custom_object("railyard.dev", "v1alpha1", NS, "trainingjobs") is not None, timeout=30, message="the TrainingJob CRD to serve", retry_on=(Exception,))
    api.ensure_namespace(NS)
    work = tmp_path_factory.mktemp("prometheus")
    operator = OperatorProcess(api.kubeconfig, work / "operator.log", [NS])
    prom: Prometheus | None = None
    try:
        prom = start_prometheus(work, [f"127.0.0.1:{operator.port}"], scrape_interval_s=SCRAPE_S,
                                rule_files=[PLAIN_RULES], binary=prometheus_binary)
        prom.wait_for_targets(timeout=60)
        start = time.time()
        name = f"scraped-{uuid.uuid4().hex[:4]}"
        spec = base_spec(trainer={"steps": FLIP_STEP + 8, "faults": [{"kind": "bitflip", "target": "grad", "rank": 1, "step": FLIP_STEP, "attempt": 0}]})
        api.create_job(NS, name, spec)
        try:
            status = wait_until(lambda: (s := api.status(NS, name)).get("phase") in ("Succeeded", "Failed") and s,
                                timeout=300,
                                message="the job to finish",
                                interval=0.5,
                                retry_on=(Exception,))
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- status ---\n{json.dumps(api.status(NS, name), indent=1)[:3000]}\n--- operator ---\n{operator.log_tail(40)}") from None
        assert status["phase"] == "Succeeded", status.get("message")
        # the restore panels need one: the restarted attempt resumed from a checkpoint before the flip
        assert (status.get("restore") or {}).get("tier"), f"no restore to show: {status.get('restore')}"
        # Prometheus has scraped the final state: the job counted as Succeeded, its restarts
        prom.wait_until(
            "Prometheus to scrape the finished job",
            lambda: prom is not None and [float(r["value"][1]) for r in prom.query('railyard_jobs{phase="Succeeded"}')] == [1.0]
            and _restarts_in(prom) == _restarts_in_status(status),
            timeout=30,
        )
        yield Run(prom, api, operator, name, status, start, time.time())
    finally:
        if prom is not None:
            prom.stop()
        operator.stop()


# --- docs/metrics.md ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Documented:
    family: str
    series: tuple[str, ...]
    type: str
    labels: frozenset[str]


def documented_metrics() -> list[Documented]:
    """The tables of docs/metrics.md, as a reader sees them."""
    out = []
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        m = re.match(r"^\| `([^`]+)` \| (\w+) \| ([^|]+) \|", line)
        if not m:
            continue
        series = tuple(s.strip() for s in m.group(1).split(","))
        labels = frozenset(re.findall(r"`(\w+)`", m.group(3)))
        family = {"counter": series[0].removesuffix("_total"), "histogram": series[0].removesuffix("_bucket")}.get(m.group(2), series[0])
        out.append(Documented(family, series, m.group(2), labels))
    assert len(out) >= 30, f"only {len(out)} metrics parsed from docs/metrics.md"
    return out


STRUCTURAL = {"__name__", "instance", "le"}


def test_every_documented_metric_was_scraped_with_its_labels(run: Run) -> None:
    problems = []
    for d in documented_metrics():
        # prometheus-client's TYPE line names a counter with samples `<name>_total`, one without
        # samples `<name>`; Prometheus keeps the metadata under that name
        meta = [m for name in {d.family, *d.series} for m in run.prom.api("metadata", metric=name).get(name) or []]
        if [m["type"] for m in meta] != [d.type] or not meta[0]["help"]:
            problems.append(f"{d.family}: Prometheus's metadata {meta}, documented type {d.type}")
        if d.family in EVENT_ONLY:
            continue
        for name in d.series:
            found = run.prom.series(name, run.start - 60, run.end)
            if not found:
                problems.append(f"{name}: no series scraped")
            for labels in found:
                got = set(labels) - STRUCTURAL
                want = set(d.labels) | {"job"}  # the TrainingJob (honor_labels) or the scrape job
                if got != want:
                    problems.append(f"{name}: labels {sorted(got)}, documented {sorted(d.labels)} (+ job)")
                expected_job = run.job if "job" in d.labels else SCRAPE_JOB
                if labels.get("job") != expected_job or ("namespace" in d.labels and labels.get("namespace") != NS):
                    problems.append(f"{name}: job={labels.get('job')!r} namespace={labels.get('namespace')!r}")
    assert not problems, "\n".join(problems)


def test_restarts_total_agrees_with_the_job_status(run: Run) -> None:
    from_status = _restarts_in_status(run.status)
    assert from_status == {"sdc": 1}, f"the bit flip restarts the gang once, class SDC: {run.status.get('restarts')}"
    assert _restarts_in(run.prom) == from_status
    # and the series Prometheus holds counted from 0: increase() sees the restart
    increase = run.prom.query(f'increase(railyard_restarts_total{{class="SDC"}}[{int(run.end - run.start) + 60}s])')
    assert increase and float(increase[0]["value"][1]) >= 1, increase


# --- the dashboard -----------------------------------------------------------------------------


def _values(run: Run) -> dict[str, str]:
    # a panel a few minutes wide: $__interval 10 s, so $__rate_interval is 11 s (a late scrape
    # on a loaded machine still leaves two samples around each event)
    return grafana_values(scrape_interval_s=SCRAPE_S, interval_s=10, namespace=NS, trainingjob=run.job)


def _may_be_empty() -> dict[str, str]:
    by_family = {d.family: d for d in documented_metrics()}
    return {s: why for family, why in EVENT_ONLY.items() for s in by_family[family].series}


def test_the_dashboard_variables_find_the_job(run: Run) -> None:
    values = _values(run)
    expected = {"namespace": NS, "trainingjob": run.job}
    for path in DASHBOARDS:
        for v in variables(path):
            match = {"match[]": [substitute(v.selector, values)]} if v.selector else {}
            found = run.prom.api(f"label/{v.label}/values", start=run.start - 60, end=run.end, **match)
            assert expected[v.name] in found, f"{path.name}: ${v.name} = label_values({v.selector}, {v.label}) -> {found}"


def test_every_dashboard_query_runs_and_returns_data(run: Run) -> None:
    queries = {q.expr: q for path in DASHBOARDS for q in panel_queries(path)}  # both copies, each query once
    problems = check_queries(run.prom, queries.values(), _values(run), start=run.start, end=run.end, step=SCRAPE_S,
                             may_be_empty=_may_be_empty())
    assert not problems, "\n".join(problems)


def test_the_query_check_rejects_a_renamed_metric_and_broken_promql(run: Run) -> None:
    good = [q for q in panel_queries(DASHBOARDS[0]) if "railyard_restarts_total" in q.expr or "railyard_jobs" in q.expr]
    assert len(good) == 2, good
    renamed = Query("renamed", good[1].expr.replace("railyard_restarts_total", "railyard_gang_restarts_total"))
    broken = Query("broken", good[0].expr + ")")
    problems = check_queries(run.prom, [*good, renamed, broken], _values(run), start=run.start, end=run.end, step=SCRAPE_S,
                             may_be_empty=_may_be_empty())
    assert [p.split(":")[0] for p in problems] == ["renamed", "broken"], problems
    assert "no data" in problems[0] and "parse error" in problems[1], problems


# --- the alerting rules ------------------------------------------------------------------------


def test_the_rules_evaluate_on_real_series_and_the_corruption_alert_fired(run: Run) -> None:
    loaded = {r["name"]: r for g in run.prom.api("rules")["groups"] for r in g["rules"]}
    assert set(loaded) == set(alerts(plain_groups())), sorted(loaded)
    for name, rule in loaded.items():
        assert rule["health"] == "ok" and not rule.get("lastError"), f"{name}: {rule.get('health')} {rule.get('lastError')}"
    fired = run.prom.query_range('ALERTS{alertstate="firing"}', run.start, time.time(), SCRAPE_S)
    names = {(s["metric"]["alertname"], s["metric"].get("namespace"), s["metric"].get("job")) for s in fired}
    assert names == {("RailyardSilentDataCorruption", NS, run.job)}, names


def test_a_finished_job_keeps_its_counters_not_its_live_gauges(run: Run) -> None:
    sel = f'{{namespace="{NS}", job="{run.job}"}}'
    for gone in ("railyard_heartbeat_age_seconds", "railyard_step_time_seconds", "railyard_stragglers_flagged_current",
                 "railyard_straggler_score", "railyard_hang_timeout_seconds", "railyard_spine_crossing_bytes_per_step"):
        assert run.prom.query(gone + sel) == [], f"{gone} still exported for a Succeeded job"
    for kept in ("railyard_job_goodput_ratio", "railyard_sdc_detected_total", "railyard_checkpoint_written_bytes_total"):
        assert run.prom.query(kept + sel), f"{kept} gone for a Succeeded job"


def test_promtool_finds_nothing_to_lint_in_the_exposition(run: Run, promtool: str) -> None:
    out = subprocess.run([promtool, "check", "metrics"], input=run.operator.metrics_text(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_demos_prometheus_report_tells_what_happened(run: Run) -> None:
    """``railyard demo --prometheus`` prints this report: the same restarts, the alert that fired."""
    report = build_report(run.prom, run.start, run.end)
    assert report.restarts == {"sdc": 1}
    assert report.alerts_fired == [f"RailyardSilentDataCorruption {NS}/{run.job}"]
