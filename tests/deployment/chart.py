"""Rendering the chart with the real Helm engine and validating what comes out, offline.

Core kinds are checked by kubernetes-validate (strict: unknown fields fail). Custom resources
are checked against their CRD's openAPIV3Schema: ours from the chart's crds/, third-party ones
vendored under schemas/ (source and commit recorded in each file). Unknown fields fail there
too, as they would under the API server's strict field validation.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from helm_python.chart import Chart

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "railyard"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
PRODUCTION_VALUES = CHART / "values-production.yaml"
KUBE_VERSION = "1.32"
RELEASE = "railyard"
NAMESPACE = "railyard-system"

Obj = dict[str, Any]


def load_values(path: Path) -> Obj:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def render(values: Obj | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE) -> dict[str, str]:
    """Template path -> rendered text (Helm's Go engine through helm-python-sdk)."""
    chart = Chart.load(CHART)
    try:
        return chart.render(values=values or {}, name=name, namespace=namespace, is_install=True)
    finally:
        chart.close()


def render_objects(values: Obj | None = None, **kw: Any) -> list[Obj]:
    """Every Kubernetes object the chart's templates produce (NOTES.txt excluded)."""
    out: list[Obj] = []
    for path, text in sorted(render(values, **kw).items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                out.append(doc)
    return out


def chart_crds() -> list[Obj]:
    out: list[Obj] = []
    for path in sorted((CHART / "crds").glob("*.yaml")):
        out += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def _strict(schema: Any) -> Any:
    """Close every object schema that lists its properties (unknown fields are errors)."""
    if isinstance(schema, dict):
        s = {k: _strict(v) for k, v in schema.items()}
        if (
            s.get("type") == "object"
            and "properties" in s
            and "additionalProperties" not in s
            and not s.get("x-kubernetes-preserve-unknown-fields")
        ):
            s["additionalProperties"] = False
        return s
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@cache
def _custom_schemas() -> dict[tuple[str, str], Obj]:
    """(apiVersion, kind) -> openAPIV3Schema for our CRDs and the vendored ones."""
    found: dict[tuple[str, str], Obj] = {}
    for crd in chart_crds():
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for v in crd["spec"]["versions"]:
            found[(f"{group}/{v['name']}", kind)] = v["schema"]["openAPIV3Schema"]
    for path in sorted(SCHEMAS.glob("*.json")):
        group, version, kind = path.stem.split("_")
        found[(f"{group}/{version}", kind)] = json.loads(path.read_text())["openAPIV3Schema"]
    return found


def custom_schema(api_version: str, kind: str) -> Obj | None:
    s = _custom_schemas().get((api_version, kind))
    return None if s is None else copy.deepcopy(s)


def validate_custom(obj: Obj) -> list[str]:
    schema = custom_schema(obj.get("apiVersion", ""), obj.get("kind", ""))
    if schema is None:
        return [f"no schema for {obj.get('apiVersion')}/{obj.get('kind')}: vendor it under tests/deployment/schemas/"]
    props = schema.setdefault("properties", {})
    for key, sub in (("apiVersion", {"type": "string"}), ("kind", {"type": "string"}), ("metadata", {"type": "object"})):
        props.setdefault(key, sub)
    validator = jsonschema.Draft7Validator(_strict(schema))
    problems = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(obj)]
    meta = obj.get("metadata") or {}
    if not meta.get("name"):
        problems.append("metadata.name: required")
    return problems


def is_core(obj: Obj) -> bool:
    group = obj.get("apiVersion", "").rpartition("/")[0]
    # built-in groups are "", a few legacy names and *.k8s.io (x-k8s.io is for add-ons)
    return group in ("", "apps", "batch", "policy", "autoscaling") or group.endswith(".k8s.io")


def validate(obj: Obj) -> list[str]:
    """Every problem with ``obj`` (empty: valid)."""
    if is_core(obj):
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
        return []
    return validate_custom(obj)


def find(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    hits = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, got {len(hits)}"
    return hits[0]
