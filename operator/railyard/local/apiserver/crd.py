"""CustomResourceDefinitions: validation, status, and serving their resources."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import Cause, invalid_value, not_supported, required
from .registry import CRD_KEY, ResourceType
from .schema import Schema, SchemaError

if TYPE_CHECKING:
    from .engine import Engine
    from .store import Entry

JSON = dict[str, Any]

_VERSION_RE = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(v: str) -> tuple[int, int, int, str]:
    """Kubernetes version ordering: GA > beta > alpha, higher numbers first; others last."""
    m = _VERSION_RE.match(v)
    if not m:
        return (3, 0, 0, v)
    major = int(m.group(1))
    stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    minor = int(m.group(3) or 0)
    return (stage, -major, -minor, v)


def validate_crd(obj: JSON, old: JSON | None) -> list[Cause]:
    try:
        return _validate_crd(obj, old)
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        return [invalid_value("spec", "object", f"malformed CustomResourceDefinition ({exc!r}); see "
                              "https://kubernetes.io/docs/reference/kubernetes-api/extend-resources/"
                              "custom-resource-definition-v1/ for the expected shape")]


def _validate_crd(obj: JSON, old: JSON | None) -> list[Cause]:
    causes: list[Cause] = []
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [required("spec")]
    group = spec.get("group")
    names = spec.get("names") or {}
    if not group:
        causes.append(required("spec.group"))
    elif "." not in group:
        causes.append(invalid_value("spec.group", group, "should be a domain with at least one dot"))
    for f in ("plural", "kind"):
        if not names.get(f):
            causes.append(required(f"spec.names.{f}"))
    plural = names.get("plural", "")
    if plural and plural != plural.lower():
        causes.append(invalid_value("spec.names.plural", plural, "must be lowercase"))
    if group and plural and obj["metadata"].get("name") != f"{plural}.{group}":
        causes.append(invalid_value("metadata.name", obj["metadata"].get("name"),
                                    "must be spec.names.plural+\".\"+spec.group"))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        causes.append(not_supported("spec.scope", spec.get("scope"), ["Cluster", "Namespaced"]))
    versions = spec.get("versions") or []
    if not versions:
        causes.append(required("spec.versions", "must have exactly one version marked as storage version"))
    elif sum(1 for v in versions if v.get("storage")) != 1:
        causes.append(invalid_value("spec.versions", "array", "must have exactly one version marked as storage version"))
    for i, v in enumerate(versions):
        schema = (v.get("schema") or {}).get("openAPIV3Schema")
        if not v.get("name"):
            causes.append(required(f"spec.versions[{i}].name"))
        if schema is None:
            causes.append(required(f"spec.versions[{i}].schema.openAPIV3Schema", "schemas are required"))
            continue
        if schema.get("type") != "object":
            causes.append(invalid_value(f"spec.versions[{i}].schema.openAPIV3Schema.type", schema.get("type"),
                                        "must be object at the root"))
        try:
            Schema(schema)
        except SchemaError as exc:
            for c in exc.causes:
                causes.append(Cause(f"spec.versions[{i}].schema.{c.field}", c.reason, c.detail))
    if old is not None and old.get("spec", {}).get("group") != group:
        causes.append(invalid_value("spec.group", group, "field is immutable"))
    return causes


def prepare_crd(obj: JSON, old: JSON | None) -> None:
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict) or not isinstance(spec.get("names", {}), dict) or \
            not isinstance(spec.get("versions", []), list) or \
            not all(isinstance(v, dict) for v in spec.get("versions", [])):
        return  # validate_crd reports it
    names = spec.setdefault("names", {})
    if names.get("kind"):
        names.setdefault("singular", names["kind"].lower())
        names.setdefault("listKind", names["kind"] + "List")
    spec.setdefault("conversion", {"strategy": "None"})
    for v in spec.get("versions") or []:
        v.setdefault("served", True)
        v.setdefault("storage", False)
    stored = list((old or {}).get("status", {}).get("storedVersions") or [])
    for v in spec.get("versions") or []:
        if v.get("storage") and v.get("name") and v["name"] not in stored:
            stored.append(v["name"])
    now = _now()
    obj["status"] = {
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
        "acceptedNames": dict(names),
        "storedVersions": stored,
    }
    if old is not None:
        old_conds = {c["type"]: c for c in (old.get("status") or {}).get("conditions") or []}
        for c in obj["status"]["conditions"]:
            if c["type"] in old_conds and old_conds[c["type"]].get("status") == c["status"]:
                c["lastTransitionTime"] = old_conds[c["type"]].get("lastTransitionTime", now)


def _now() -> str:
    import time

    from .engine import rfc3339

    return rfc3339(time.time())


def resource_type(crd: JSON) -> ResourceType:
    spec = crd["spec"]
    names = spec["names"]
    served = [v for v in spec.get("versions") or [] if v.get("served", True)]
    versions = sorted((v["name"] for v in served), key=version_priority)
    storage = next(v["name"] for v in spec["versions"] if v.get("storage"))
    subresources: set[str] = set()
    schemas: dict[str, Schema] = {}
    columns: dict[str, list[JSON]] = {}
    selectable: set[str] = set()
    for v in spec["versions"]:
        subs = v.get("subresources") or {}
        if "status" in subs:
            subresources.add("status")
        if "scale" in subs:
            subresources.add("scale")
        raw = (v.get("schema") or {}).get("openAPIV3Schema")
        if raw is not None:
            with contextlib.suppress(SchemaError):  # validate_crd rejected it already
                schemas[v["name"]] = Schema(raw)
        columns[v["name"]] = list(v.get("additionalPrinterColumns") or [])
        for sf in v.get("selectableFields") or []:
            selectable.add(sf["jsonPath"].lstrip("."))
    subresources.discard("scale")  # scale is not served by this server
    return ResourceType(
        group=spec["group"], versions=versions or [storage], storage_version=storage, plural=names["plural"],
        singular=names.get("singular") or names["kind"].lower(), kind=names["kind"],
        namespaced=spec.get("scope") == "Namespaced", short_names=list(names.get("shortNames") or []),
        categories=list(names.get("categories") or []), subresources=frozenset(subresources),
        field_selectors=frozenset({"metadata.name", "metadata.namespace"} | selectable), crd=crd,
        schemas=schemas, printer_columns=columns,
    )


def register_crd_hook(engine: Engine) -> Callable[[ResourceType, Entry, bool], None]:
    def hook(rt: ResourceType, entry: Entry, deleted: bool) -> None:
        if rt.key != CRD_KEY:
            return
        spec = entry.obj.get("spec") or {}
        if deleted:
            engine.registry.remove(spec.get("group", ""), (spec.get("names") or {}).get("plural", ""))
        else:
            engine.registry.add(resource_type(entry.obj))

    return hook


def restore_crds(engine: Engine) -> None:
    for entry in engine.store.items(CRD_KEY):
        engine.registry.add(resource_type(entry.obj))
