"""The chart through the real Helm engine: lint, template, schema errors, offline validation."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from helm_python.chart import lint
from helm_python.errors import HelmValuesError

from .chart import (
    CHART,
    PRODUCTION_VALUES,
    ROOT,
    chart_crds,
    find,
    load_values,
    render,
    render_objects,
    validate,
)

VALUE_SETS: dict[str, Any] = {
    "default": {},
    "production": load_values(PRODUCTION_VALUES),
    "everything-on": {
        "replicas": 3,
        "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
        "prometheusRule": {"enabled": True},
        "grafanaDashboard": {"enabled": True},
        "image": {"digest": "sha256:" + "a" * 64},
        "logLevel": "debug",
        "trainingPodAnnotations": {"sidecar.istio.io/inject": "false"},
        "maintenanceSignals": ["example.com/retire"],
        "saveBeforeStopSeconds": 15,
    },
}


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_helm_lint_strict_has_no_warnings_or_errors(values: dict[str, Any]) -> None:
    report = lint(CHART, values, strict=True, namespace="railyard-system")
    assert report["errors"] == []
    bad = [m for m in report["messages"] if m["severity"] >= 2]
    assert bad == [], bad


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_object_validates_offline(values: dict[str, Any]) -> None:
    objs = render_objects(values)
    kinds = {o["kind"] for o in objs}
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service"} <= kinds
    problems = {f"{o['kind']}/{o['metadata']['name']}": validate(o) for o in objs}
    assert {k: v for k, v in problems.items() if v} == {}


def test_validation_catches_a_misspelt_field() -> None:
    """The offline validation is strict: a typo in a core or a monitoring object fails."""
    objs = render_objects(VALUE_SETS["everything-on"])
    dep = find(objs, "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    assert validate(dep)
    sm = find(objs, "ServiceMonitor")
    sm["spec"]["endpoints"][0]["intervall"] = "30s"
    assert any("intervall" in p for p in validate(sm))
    rule = find(objs, "PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["for"] = "ten minutes"
    assert validate(rule)


def test_production_values_render_what_they_ask_for() -> None:
    objs = render_objects(VALUE_SETS["production"])
    dep = find(objs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"].endswith("@sha256:" + "0123456789abcdef" * 4)
    assert "--namespace=team-llm" in container["args"] and "--namespace=team-vision" in container["args"]
    assert "--all-namespaces" not in container["args"]
    assert {o["metadata"]["namespace"] for o in objs if o["kind"] == "KopfPeering"} == {"team-llm", "team-vision"}
    assert not [o for o in objs if o["kind"] == "ClusterKopfPeering"]
    assert find(objs, "ServiceMonitor")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert find(objs, "ConfigMap")["metadata"]["namespace"] == "monitoring"
    np = find(objs, "NetworkPolicy")
    metrics_from = np["spec"]["ingress"][1]["from"][0]
    assert metrics_from["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}


def test_deployment_args_match_the_operator_cli() -> None:
    """Every flag the chart passes is one `railyard operator run` accepts."""
    import argparse

    from railyard.commands import operator as operator_cmd

    parser = argparse.ArgumentParser()
    operator_cmd.add_parser(parser.add_subparsers(dest="command"))
    for values in VALUE_SETS.values():
        args = find(render_objects(values), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        parsed = parser.parse_args(args)  # exits (SystemExit) on an unknown flag
        assert parsed.operator_command == "run"
        assert parsed.peering == "railyard" and not parsed.standalone
        assert parsed.pod_annotation == [f"{k}={v}" for k, v in values.get("trainingPodAnnotations", {}).items()]
        assert parsed.maintenance_signal == values.get("maintenanceSignals", [])
        assert parsed.save_before_stop_seconds == values.get("saveBeforeStopSeconds", 60)


def test_heartbeat_url_points_at_the_service() -> None:
    objs = render_objects({})
    svc = find(objs, "Service")
    args = find(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    url = next(a.split("=", 1)[1] for a in args if a.startswith("--heartbeat-advertise-url="))
    assert url == f"http://{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:{svc['spec']['ports'][0]['port']}"


def test_pdb_only_with_more_than_one_replica() -> None:
    assert not [o for o in render_objects({}) if o["kind"] == "PodDisruptionBudget"]
    assert find(render_objects({"replicas": 2}), "PodDisruptionBudget")["spec"]["minAvailable"] == 1


def test_network_policy_admits_heartbeats_only_from_training_pods() -> None:
    np = find(render_objects({}), "NetworkPolicy")
    assert np["spec"]["policyTypes"] == ["Ingress"]
    heartbeat = np["spec"]["ingress"][0]["from"][0]
    from railyard.logic.manifests import JOB_LABEL

    assert heartbeat["podSelector"] == {"matchExpressions": [{"key": JOB_LABEL, "operator": "Exists"}]}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicas": -1}, "at '/replicas': minimum: got -1, want 1"),
        ({"replicas": 0}, "at '/replicas': minimum: got 0, want 1"),
        ({"replica": 2}, "additional properties 'replica' not allowed"),
        ({"image": {"tag": "x", "registry": "y"}}, "additional properties 'registry' not allowed"),
        ({"port": 80}, "at '/port': minimum: got 80, want 1,024"),
        ({"logLevel": "verbose"}, "at '/logLevel'"),
        ({"image": {"digest": "latest"}}, "at '/image/digest'"),
        ({"metrics": {"serviceMonitor": {"interval": "soon"}}}, "at '/metrics/serviceMonitor/interval'"),
    ],
)
def test_bad_values_fail_with_the_schemas_message(values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmValuesError) as err:
        render(values)
    assert message in str(err.value)


def test_chart_crd_is_the_repositorys_crd() -> None:
    assert (CHART / "crds" / "trainingjob.yaml").read_bytes() == (ROOT / "crds" / "trainingjob.yaml").read_bytes()
    names = {c["metadata"]["name"] for c in chart_crds()}
    assert names == {"trainingjobs.railyard.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}


def _crd_params() -> list[Any]:
    return [pytest.param(crd, id=crd["metadata"]["name"]) for crd in chart_crds()]


@pytest.mark.parametrize("crd", _crd_params())
def test_crds_validate_as_apiextensions_objects(crd: dict[str, Any]) -> None:
    assert validate(crd) == []


def test_deploy_dashboard_and_rules_equal_the_charts() -> None:
    assert (ROOT / "deploy" / "grafana" / "railyard-dashboard.json").read_bytes() == (
        CHART / "dashboards" / "railyard.json"
    ).read_bytes()
    rendered = find(render_objects({"prometheusRule": {"enabled": True}}), "PrometheusRule")
    standalone = yaml.safe_load((ROOT / "deploy" / "prometheus" / "railyard-rules.yaml").read_text())
    assert standalone["spec"] == rendered["spec"]
    assert validate(standalone) == []


def _referenced_metrics(text: str) -> set[str]:
    return set(re.findall(r"\brailyard_[a-z0-9_]+", text))


def test_rules_and_dashboard_use_only_metrics_the_code_exports() -> None:
    from railyard.observe.metrics_doc import collect_metrics

    exported: set[str] = set()
    for d in collect_metrics():
        exported |= {s.strip() for s in d.series.split(",")}
    dashboard = json.loads((CHART / "dashboards" / "railyard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    rules = find(render_objects({"prometheusRule": {"enabled": True}}), "PrometheusRule")
    exprs += [str(r["expr"]) for g in rules["spec"]["groups"] for r in g["rules"]]
    used = set().union(*(_referenced_metrics(e) for e in exprs))
    assert used, "no metric referenced at all"
    assert used - exported == set()
    alerts = {r["alert"] for g in rules["spec"]["groups"] for r in g["rules"]}
    for needed in ("RailyardRestartsTooFrequent", "RailyardStragglers", "RailyardSilentDataCorruption",
                   "RailyardHeartbeatsStale", "RailyardJobUnplaceable"):
        assert needed in alerts


def test_notes_tell_the_next_step() -> None:
    notes = render({})["railyard/templates/NOTES.txt"]
    assert "kubectl apply -f" in notes and "examples/tiny-cpu.yaml" in notes
    assert "kubectl label node" in notes
    assert "http://railyard.railyard-system.svc:8080/metrics" in notes
    assert "WARNING" not in notes
    assert "WARNING: replicas=2" in render({"replicas": 2})["railyard/templates/NOTES.txt"]
