"""Kubernetes' own gang scheduling API, ``scheduling.k8s.io/v1alpha2`` (GenericWorkload,
GangScheduling and TopologyAwareWorkloadScheduling gates): ``workloads`` and ``podgroups``.

A Workload holds ``spec.podGroupTemplates`` (each a ``name``, a ``schedulingPolicy`` of exactly
one of ``basic: {}`` or ``gang: {minCount}`` and optional ``schedulingConstraints.topology:
[{key}]``); a PodGroup carries the same policy and constraints, made from a template
(``spec.podGroupTemplateRef.workload: {workloadName, podGroupTemplateName}``) or standing alone.
Pods join one with ``spec.schedulingGroup.podGroupName`` (validated in :mod:`.builtins`).

Defaults, validation messages and immutability are those a real kube-apiserver v1.36 answered
(tests/golden/kube-v1.36-workload): templates and a PodGroup's spec are immutable,
``disruptionMode`` defaults to ``Pod``, a new PodGroup gets the ``podgroup-protection``
finalizer (removed by :mod:`.controllers` once no pod names the group). Deleting a Workload
leaves its PodGroups.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import Cause, invalid_value, not_supported, required
from .names import DNS1123_SUBDOMAIN, qualified_name

JSON = dict[str, Any]

GROUP = "scheduling.k8s.io"
VERSION = "v1alpha2"
WORKLOADS_KEY = f"workloads.{GROUP}"
PODGROUPS_KEY = f"podgroups.{GROUP}"
PROTECTION_FINALIZER = "scheduling.k8s.io/podgroup-protection"
DISRUPTION_MODES = ["Pod", "PodGroup"]

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def default(key: str, obj: JSON) -> None:
    if key == PODGROUPS_KEY:
        spec = obj.setdefault("spec", {})
        if isinstance(spec, dict):
            spec.setdefault("disruptionMode", "Pod")
            # a pointer without omitempty: serialised as null when unset
            spec.setdefault("podGroupTemplateRef", None)


def prepare_create(key: str, obj: JSON) -> None:
    if key == PODGROUPS_KEY:
        obj["status"] = {}  # the scheduler's, written through /status
        fins = obj["metadata"].setdefault("finalizers", [])
        if isinstance(fins, list) and PROTECTION_FINALIZER not in fins:
            fins.append(PROTECTION_FINALIZER)


def validate(key: str, obj: JSON, old: JSON | None) -> list[Cause]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [required("spec")]
    causes: list[Cause] = []
    if key == WORKLOADS_KEY:
        causes.extend(_validate_workload_spec(spec))
        if old is not None and spec.get("podGroupTemplates") != (old.get("spec") or {}).get("podGroupTemplates"):
            causes.append(invalid_value("spec.podGroupTemplates", None, "field is immutable"))
    elif key == PODGROUPS_KEY:
        causes.extend(_validate_podgroup_spec(spec))
        if old is not None:
            old_spec = old.get("spec") or {}
            for f in ("podGroupTemplateRef", "schedulingPolicy", "schedulingConstraints", "disruptionMode"):
                if spec.get(f) != old_spec.get(f):
                    causes.append(invalid_value(f"spec.{f}", None, "field is immutable"))
    return causes


def _validate_workload_spec(spec: JSON) -> list[Cause]:
    templates = spec.get("podGroupTemplates")
    if not templates:
        return [required("spec.podGroupTemplates")]
    if not isinstance(templates, list):
        return [invalid_value("spec.podGroupTemplates", templates, "must be a list")]
    causes: list[Cause] = []
    seen: set[str] = set()
    for i, t in enumerate(templates):
        path = f"spec.podGroupTemplates[{i}]"
        if not isinstance(t, dict):
            causes.append(invalid_value(path, t, "must be an object"))
            continue
        name = t.get("name")
        if not name:
            causes.append(required(f"{path}.name"))
        elif not isinstance(name, str) or len(name) > 63 or not _DNS1123_LABEL.match(name):
            causes.append(invalid_value(f"{path}.name", name,
                                        "a lowercase RFC 1123 label must consist of lower case alphanumeric "
                                        "characters or '-', and must start and end with an alphanumeric character"))
        elif name in seen:
            causes.append(Cause(path, "FieldValueDuplicate", f"Duplicate value: {_go_template(t)}"))
        else:
            seen.add(name)
        causes.extend(_validate_policy(t.get("schedulingPolicy"), f"{path}.schedulingPolicy"))
        causes.extend(_validate_constraints(t.get("schedulingConstraints"), f"{path}.schedulingConstraints"))
    return causes


def _validate_podgroup_spec(spec: JSON) -> list[Cause]:
    causes = _validate_policy(spec.get("schedulingPolicy"), "spec.schedulingPolicy")
    causes.extend(_validate_constraints(spec.get("schedulingConstraints"), "spec.schedulingConstraints"))
    ref = spec.get("podGroupTemplateRef")
    if ref is not None:
        workload = ref.get("workload") if isinstance(ref, dict) else None
        if not isinstance(workload, dict):
            causes.append(invalid_value("spec.podGroupTemplateRef", None, "must specify one of: `workload`"))
        else:
            for f in ("workloadName", "podGroupTemplateName"):
                value = workload.get(f)
                where = f"spec.podGroupTemplateRef.workload.{f}"
                if not value:
                    causes.append(required(where))
                elif not isinstance(value, str) or not DNS1123_SUBDOMAIN.match(value):
                    causes.append(invalid_value(where, value, "a lowercase RFC 1123 subdomain must consist of lower "
                                                "case alphanumeric characters, '-' or '.', and must start and end "
                                                "with an alphanumeric character"))
    mode = spec.get("disruptionMode")
    if mode not in DISRUPTION_MODES:
        causes.append(not_supported("spec.disruptionMode", mode, DISRUPTION_MODES))
    return causes


def _validate_policy(policy: Any, path: str) -> list[Cause]:
    if not isinstance(policy, dict):
        return [required(path)]
    chosen = [k for k in ("basic", "gang") if policy.get(k) is not None]
    if not chosen:
        return [invalid_value(path, "", "must specify one of: `basic`, `gang`")]
    if len(chosen) > 1:
        return [invalid_value(path, "{" + ", ".join(chosen) + "}", "must specify exactly one of: `basic`, `gang`")]
    gang = policy.get("gang")
    if gang is None:
        return []
    count = gang.get("minCount") if isinstance(gang, dict) else None
    if not count:
        return [required(f"{path}.gang.minCount")]
    if not isinstance(count, int) or isinstance(count, bool):
        return [invalid_value(f"{path}.gang.minCount", count, "must be an integer")]
    if count < 1:
        return [invalid_value(f"{path}.gang.minCount", count, "must be greater than or equal to 1")]
    return []


def _validate_constraints(constraints: Any, path: str) -> list[Cause]:

    if constraints is None:
        return []
    if not isinstance(constraints, dict):
        return [invalid_value(path, constraints, "must be an object")]
    causes: list[Cause] = []
    for i, t in enumerate(constraints.get("topology") or []):
        key = t.get("key") if isinstance(t, dict) else None
        where = f"{path}.topology[{i}].key"
        if not key:
            causes.append(required(where))
        elif not isinstance(key, str):
            causes.append(invalid_value(where, key, "must be a string"))
        else:
            causes.extend(qualified_name(key, where))
    return causes


def _go_template(t: JSON) -> str:
    """The template as the API server's Go types print it in a Duplicate value (fields in
    declaration order, unset pointers as null)."""
    policy = t.get("schedulingPolicy")
    if isinstance(policy, dict):
        policy = {k: policy[k] for k in ("basic", "gang") if policy.get(k) is not None}
    out = {"name": t.get("name"), "schedulingPolicy": policy, "schedulingConstraints": t.get("schedulingConstraints")}
    return json.dumps(out, separators=(",", ":"))


def group_of(pod: JSON) -> str | None:
    """The PodGroup a pod names, if any."""
    group = (pod.get("spec") or {}).get("schedulingGroup")
    name = group.get("podGroupName") if isinstance(group, dict) else None
    return name if isinstance(name, str) and name else None
