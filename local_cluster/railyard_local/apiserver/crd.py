"""CustomResourceDefinitions: validation, status, and serving their resources."""

from __future__ import annotations

import contextlib
import copy
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import cel
from .errors import Cause, forbidden, invalid_value, not_supported, required
from .registry import CRD_KEY, ResourceType
from .schema import RuleCost, Schema, SchemaError

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
    plural = names.get("plural", "")
    if group and plural and obj["metadata"].get("name") != f"{plural}.{group}":
        causes.append(invalid_value("metadata.name", obj["metadata"].get("name"),
                                    "must be spec.names.plural+\".\"+spec.group"))
    if not group:
        causes.append(required("spec.group"))
    elif "." not in group:
        causes.append(invalid_value("spec.group", group, "should be a domain with at least one dot"))
    for f in ("plural", "kind"):
        if not names.get(f):
            causes.append(required(f"spec.names.{f}"))
    if plural and plural != plural.lower():
        causes.append(invalid_value("spec.names.plural", plural, "must be lowercase"))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        causes.append(not_supported("spec.scope", spec.get("scope"), ["Cluster", "Namespaced"]))
    versions = spec.get("versions") or []
    if not versions:
        causes.append(required("spec.versions", "must have exactly one version marked as storage version"))
    elif sum(1 for v in versions if v.get("storage")) != 1:
        causes.append(
            invalid_value("spec.versions", "array", "must have exactly one version marked as storage version")
        )
    for i, v in enumerate(versions):
        if not v.get("name"):
            causes.append(required(f"spec.versions[{i}].name"))
    # As upstream, errors name the internal field: spec.validation / spec.additionalPrinterColumns
    # when every version carries the same one, spec.versions[i]... otherwise.
    schemas = [json.dumps((v.get("schema") or {}).get("openAPIV3Schema"), sort_keys=True) for v in versions]
    columns = [json.dumps(v.get("additionalPrinterColumns") or [], sort_keys=True) for v in versions]
    shared_schema = len(set(schemas)) <= 1
    shared_columns = len(set(columns)) <= 1
    for i, v in enumerate(versions):
        if shared_schema and i > 0:
            break
        prefix = "spec.validation" if shared_schema else f"spec.versions[{i}].schema"
        schema = (v.get("schema") or {}).get("openAPIV3Schema")
        if schema is None:
            causes.append(required(f"{prefix}.openAPIV3Schema", "schemas are required"))
            continue
        causes.extend(validate_openapi_schema(schema, f"{prefix}.openAPIV3Schema"))
    for i, v in enumerate(versions):
        if shared_columns and i > 0:
            break
        prefix = "spec.additionalPrinterColumns" if shared_columns else f"spec.versions[{i}].additionalPrinterColumns"
        for j, col in enumerate(v.get("additionalPrinterColumns") or []):
            causes.extend(_validate_column(col, f"{prefix}[{j}]"))
    if old is not None and old.get("spec", {}).get("group") != group:
        causes.append(invalid_value("spec.group", group, "field is immutable"))
    return causes


_COLUMN_TYPES = ["boolean", "date", "integer", "number", "string"]
_COLUMN_FORMATS = ["byte", "date", "date-time", "double", "float", "int32", "int64", "password"]


def _validate_column(col: JSON, path: str) -> list[Cause]:
    out: list[Cause] = []
    if not col.get("name"):
        out.append(required(f"{path}.name"))
    if col.get("type") not in _COLUMN_TYPES:
        out.append(not_supported(f"{path}.type", col.get("type"), _COLUMN_TYPES))
    if col.get("format") and col["format"] not in _COLUMN_FORMATS:
        out.append(not_supported(f"{path}.format", col["format"], _COLUMN_FORMATS))
    jp = col.get("jsonPath")
    if not jp:
        out.append(required(f"{path}.jsonPath"))
    elif not jp.startswith("."):
        out.append(invalid_value(f"{path}.jsonPath", jp, "must be a simple json path starting with ."))
    return out


# ---- the OpenAPI schema of a version -----------------------------------------------------------


def validate_openapi_schema(schema: Any, path: str) -> list[Cause]:
    """What kube-apiserver checks on a CRD's openAPIV3Schema, in its order: the structural
    schema rules; then every ``default`` (pruned, valid against its own schema and CEL rules, as
    given: defaults are not defaulted); then each CEL rule's compilation and estimated cost."""
    structural = _structural(schema, path, "root")
    if structural:
        return structural
    try:
        compiled = Schema(schema)
    except SchemaError as exc:
        return [_reprefix(c, path) for c in exc.causes]
    defaults = _validate_defaults(compiled.root, path)
    if defaults:
        return defaults
    return _cost_causes(compiled.rule_costs, path)


def _reprefix(c: Cause, path: str) -> Cause:
    f = c.field
    if f.startswith("openAPIV3Schema"):
        f = path + f[len("openAPIV3Schema"):]
    return Cause(f, c.reason, c.detail)


def _cost_causes(costs: list[RuleCost], path: str) -> list[Cause]:
    out: list[Cause] = []
    for rc in costs:
        if rc.cost > cel.PER_RULE_COST_LIMIT:
            out.append(forbidden(_reprefix(Cause(rc.path, "", ""), path).field,
                                 cel.cost_factor_message("estimated rule cost", rc.cost, cel.PER_RULE_COST_LIMIT)))
    total = min(sum(rc.cost for rc in costs), 2**63 - 1)
    if total > cel.PER_CRD_COST_LIMIT:
        for rc in sorted(costs, key=lambda r: -r.cost)[:4]:
            out.append(forbidden(_reprefix(Cause(rc.path, "", ""), path).field,
                                 "contributed to estimated rule cost total exceeding cost limit for entire "
                                 "OpenAPIv3 schema"))
        out.append(forbidden(path, cel.cost_factor_message(
            "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema", total,
            cel.PER_CRD_COST_LIMIT)))
    return out


def _structural(s: Any, path: str, level: str, root_meta: bool = False) -> list[Cause]:
    """apiextensions' ``validateStructuralInvariants`` (the parts a hand-written CRD trips on)."""
    if not isinstance(s, dict):
        return [invalid_value(path, s, "must be a schema object")]
    out: list[Cause] = []
    t = s.get("type")
    if t == "array" and "items" not in s:
        out.append(required(f"{path}.items", "must be specified"))
    if isinstance(s.get("items"), dict):
        out.extend(_structural(s["items"], f"{path}.items", "item"))
    elif isinstance(s.get("items"), list):
        out.append(forbidden(f"{path}.items", "items must be a schema object and not an array"))
    props = s.get("properties") or {}
    if isinstance(props, dict):
        for k in sorted(props):
            out.extend(_structural(props[k], f"{path}.properties[{k}]", "field"))
    addl = s.get("additionalProperties")
    if isinstance(addl, dict):
        if props:
            out.append(forbidden(f"{path}.additionalProperties", "additionalProperties and properties are "
                                 "mutual exclusive"))
        out.extend(_structural(addl, f"{path}.additionalProperties", "field"))
    if s.get("uniqueItems") is True:
        out.append(forbidden(f"{path}.uniqueItems", "uniqueItems cannot be set to true since the runtime complexity "
                             "becomes quadratic"))
    embedded = bool(s.get("x-kubernetes-embedded-resource"))
    int_or_string = bool(s.get("x-kubernetes-int-or-string"))
    if embedded and t != "object":
        if not t:
            out.append(required(f"{path}.type", "must be object if x-kubernetes-embedded-resource is true"))
        else:
            out.append(invalid_value(f"{path}.type", t, "must be object if x-kubernetes-embedded-resource is true"))
    elif not t and not int_or_string:
        detail = {"root": "must not be empty at the root", "item": "must not be empty for specified array items",
                  "field": "must not be empty for specified object fields"}[level]
        out.append(required(f"{path}.type", detail))
    if int_or_string and t:
        out.append(invalid_value(f"{path}.type", t, "must be empty to be structural"))
    if level == "root" and t and t != "object":
        out.append(invalid_value(f"{path}.type", t, "must be object at the root"))
    if level == "root" or embedded:
        for key, want in (("kind", "string"), ("apiVersion", "string"), ("metadata", "object")):
            sub = props.get(key) if isinstance(props, dict) else None
            if isinstance(sub, dict) and sub.get("type") != want:
                out.append(invalid_value(f"{path}.properties[{key}].type", sub.get("type"), f"must be {want}"))
    if level == "root" and isinstance(props, dict) and isinstance(props.get("metadata"), dict):
        meta = {k: v for k, v in props["metadata"].items() if k not in ("type", "description")}
        extra = set(meta.pop("properties", None) or {}) - {"name", "generateName"}
        if meta or extra:
            out.append(forbidden(f"{path}.properties[metadata]", "must not specify anything other than name and "
                                 "generateName, but metadata is implicitly specified"))
    list_type = s.get("x-kubernetes-list-type")
    if list_type is not None:
        if t != "array":
            out.append(invalid_value(f"{path}.x-kubernetes-list-type", list_type,
                                     "must only be used if type is array"))
        elif list_type not in ("atomic", "set", "map"):
            out.append(not_supported(f"{path}.x-kubernetes-list-type", list_type, ["atomic", "map", "set"]))
        elif list_type == "map":
            keys = s.get("x-kubernetes-list-map-keys") or []
            items: JSON = s["items"] if isinstance(s.get("items"), dict) else {}
            if not keys:
                out.append(required(f"{path}.x-kubernetes-list-map-keys",
                                    "must not be empty if x-kubernetes-list-type is map"))
            elif items.get("type") != "object":
                out.append(invalid_value(f"{path}.items.type", items.get("type"),
                                         "must be object if parent array's x-kubernetes-list-type is map"))
            else:
                item_props = items.get("properties") or {}
                for j, k in enumerate(keys):
                    kp = item_props.get(k)
                    if not isinstance(kp, dict):
                        out.append(invalid_value(f"{path}.x-kubernetes-list-map-keys[{j}]", k,
                                                 "entries must all be names of item properties"))
                    elif k not in (items.get("required") or []) and "default" not in kp:
                        out.append(required(f"{path}.items.properties[{k}]",
                                            "all map keys must be required or have a default value"))
    if embedded and addl is not None:
        out.append(
            forbidden(f"{path}.additionalProperties", "must not be used if x-kubernetes-embedded-resource is set")
        )
    if embedded and not s.get("x-kubernetes-preserve-unknown-fields") and not props:
        out.append(required(f"{path}.properties", "must not be empty if x-kubernetes-embedded-resource is true "
                            "without x-kubernetes-preserve-unknown-fields"))
    return out


def _validate_defaults(node: Any, path: str) -> list[Cause]:
    """Every default, as it is written, against its own node's schema and CEL rules."""
    from .schema import has_unknown_fields, validate_value

    out: list[Cause] = []

    def walk(n: Any, p: str, in_meta: bool) -> None:
        if "default" in n.s:
            where = f"{p}.default"
            value = n.s["default"]
            if in_meta:
                out.append(forbidden(where, "must not be set inside metadata"))
            elif has_unknown_fields(n, value):
                out.append(invalid_value(where, value, "must not have unknown fields"))
            else:
                out.extend(validate_value(n, copy.deepcopy(value), copy.deepcopy(value), True, field_prefix=where))
        if n.items is not None:
            walk(n.items, f"{p}.items", in_meta)
        for k in sorted(n.props):
            walk(n.props[k], f"{p}.properties[{k}]", in_meta or ((n.s is node.s or n.embedded) and k == "metadata"))

    walk(node, path, False)
    return out


def _well_formed(spec: Any) -> bool:
    return isinstance(spec, dict) and isinstance(spec.get("names", {}), dict) and \
        isinstance(spec.get("versions", []), list) and all(isinstance(v, dict) for v in spec.get("versions", []))


def default_crd(obj: JSON) -> None:
    """SetDefaults_CustomResourceDefinition (decode time, so the defaults are the writer's)."""
    spec = obj.setdefault("spec", {})
    if not _well_formed(spec):
        return  # validate_crd reports it
    names = spec.setdefault("names", {})
    if names.get("kind"):
        names.setdefault("singular", names["kind"].lower())
        names.setdefault("listKind", names["kind"] + "List")
    spec.setdefault("conversion", {"strategy": "None"})
    for v in spec.get("versions") or []:
        v.setdefault("served", True)
        v.setdefault("storage", False)


def prepare_crd(obj: JSON, old: JSON | None) -> None:
    spec = obj.setdefault("spec", {})
    if not _well_formed(spec):
        return
    stored = list((old or {}).get("status", {}).get("storedVersions") or [])
    for v in spec.get("versions") or []:
        if v.get("storage") and v.get("name") and v["name"] not in stored:
            stored.append(v["name"])
    if old is None:
        # What the apiserver answers at creation: the names are accepted and the resource
        # established a moment later by its controller (Controllers._establish_crds).
        obj["status"] = {"acceptedNames": {"kind": "", "plural": ""}, "conditions": None, "storedVersions": stored}
    else:
        status = copy.deepcopy(old.get("status") or {})
        status["storedVersions"] = stored
        obj["status"] = status


def established_status(crd: JSON, now: str) -> JSON | None:
    """The status the CRD controllers give ``crd`` once its names are accepted, or None when it
    already has it."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    status = copy.deepcopy(crd.get("status") or {})
    accepted = {k: v for k, v in names.items() if k in ("plural", "singular", "shortNames", "kind", "listKind",
                                                        "categories")}
    old_conds = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, dict)}
    conds = []
    for ctype, reason, message in (("NamesAccepted", "NoConflicts", "no conflicts found"),
                                   ("Established", "InitialNamesAccepted", "the initial names have been accepted")):
        prev = old_conds.get(ctype)
        when = prev["lastTransitionTime"] if prev and prev.get("status") == "True" and \
            prev.get("lastTransitionTime") else now
        conds.append({"type": ctype, "status": "True", "reason": reason, "message": message,
                      "lastTransitionTime": when})
    if status.get("acceptedNames") == accepted and status.get("conditions") == conds:
        return None
    status["acceptedNames"] = accepted
    status["conditions"] = conds
    return status


def scale_paths(rt: ResourceType) -> JSON | None:
    """The storage version's ``subresources.scale`` of a custom resource (None: it has none)."""
    for v in ((rt.crd or {}).get("spec") or {}).get("versions") or []:
        if v.get("storage"):
            scale = (v.get("subresources") or {}).get("scale")
            return scale if isinstance(scale, dict) else None
    return None


def _at(obj: Any, path: str) -> Any:
    for part in path.lstrip(".").split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def scale_of(rt: ResourceType, obj: JSON) -> JSON:
    """The autoscaling/v1 Scale a custom resource's ``/scale`` answers with (read through the
    CRD's specReplicasPath, statusReplicasPath and labelSelectorPath)."""
    paths = scale_paths(rt) or {}
    meta = obj.get("metadata") or {}
    status: JSON = {"replicas": _at(obj, paths.get("statusReplicasPath") or ".status.replicas") or 0}
    selector = _at(obj, paths["labelSelectorPath"]) if paths.get("labelSelectorPath") else None
    if selector:
        status["selector"] = selector
    spec: JSON = {}
    replicas = _at(obj, paths.get("specReplicasPath") or ".spec.replicas")
    if replicas:
        spec["replicas"] = replicas
    return {"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                         if k in meta},
            "spec": spec, "status": status}


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
    return ResourceType(
        group=spec["group"], versions=versions or [storage], storage_version=storage, plural=names["plural"],
        singular=names.get("singular") or names["kind"].lower(), kind=names["kind"],
        namespaced=spec.get("scope") == "Namespaced", short_names=list(names.get("shortNames") or []),
        categories=list(names.get("categories") or []), subresources=frozenset(subresources),
        field_selectors=frozenset({"metadata.name", "metadata.namespace"} | selectable), crd=crd,
        schemas=schemas, printer_columns=columns,
        # upstream's custom resource store does not return the deleted object: a delete that
        # removes it at once answers with a Status (kueue-v0.13-workload 059, 065)
        return_deleted_object=False,
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
