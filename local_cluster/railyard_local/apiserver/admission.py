"""The admission plugins of a default kube-apiserver that change or refuse what clients create.

Mutating, on pod creation (in upstream's order):

- **ServiceAccount**: ``serviceAccountName`` defaults to ``default``; the account must exist (403
  otherwise); unless the pod or its account sets ``automountServiceAccountToken: false``, a
  projected volume ``kube-api-access-<random>`` (token, ``kube-root-ca.crt``'s ``ca.crt``, the
  namespace) is added and mounted read-only at /var/run/secrets/kubernetes.io/serviceaccount in
  every container that does not mount that path already.
- **Priority**: ``priority`` and ``preemptionPolicy`` from ``priorityClassName`` (403 when the
  class does not exist), or from the cluster's global default class, else 0.
- **DefaultTolerationSeconds**: tolerate ``node.kubernetes.io/not-ready`` and ``unreachable``
  (NoExecute) for 300 s unless the pod says otherwise.

Validating: **PodSecurity**, the namespace's ``pod-security.kubernetes.io/enforce`` level (403
with the violations), ``warn`` (a Warning header) and ``audit`` (a Warning too: this server
keeps no audit log).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import podsecurity
from .errors import APIError

if TYPE_CHECKING:
    from .engine import Ctx, Engine
    from .registry import ResourceType

JSON = dict[str, Any]

TOKEN_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_VOLUME_PREFIX = "kube-api-access-"
TOKEN_EXPIRATION_SECONDS = 3607
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
DEFAULT_TOLERATION_SECONDS = 300
SYSTEM_PRIORITY_CLASSES = {"system-node-critical": 2000001000, "system-cluster-critical": 2000000000}


def forbidden(rt: ResourceType, name: str, why: str) -> APIError:
    return APIError(403, f'{rt.plural} "{name}" is forbidden: {why}', reason="Forbidden",
                    details={"name": name, "kind": rt.plural} if not rt.group else
                    {"name": name, "group": rt.group, "kind": rt.plural})


def token_volume(name: str) -> JSON:
    return {"name": name, "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": TOKEN_EXPIRATION_SECONDS, "path": "token"}},
        {"configMap": {"items": [{"key": "ca.crt", "path": "ca.crt"}], "name": ROOT_CA_CONFIGMAP}},
        {"downwardAPI": {"items": [{"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                    "path": "namespace"}]}},
    ]}}


def mutate(engine: Engine, rt: ResourceType, obj: JSON, old: JSON | None, ctx: Ctx) -> None:
    if rt.key == "pods" and old is None:
        spec = obj.get("spec")
        if isinstance(spec, dict):
            _service_account(engine, rt, obj, spec)
            _priority(engine, rt, obj, spec)
            _default_tolerations(spec)


def _service_account(engine: Engine, rt: ResourceType, pod: JSON, spec: JSON) -> None:
    from .engine import random_suffix

    ns = pod["metadata"].get("namespace", "")
    name = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    spec["serviceAccountName"] = name
    spec["serviceAccount"] = name
    sa = engine.store.get("serviceaccounts", ns, name)
    if sa is None:
        raise forbidden(rt, pod["metadata"].get("name", ""),
                        f'error looking up service account {ns}/{name}: serviceaccount "{name}" not found')
    automount = spec.get("automountServiceAccountToken")
    if automount is None:
        automount = sa.obj.get("automountServiceAccountToken")
    if automount is False:
        return
    volumes = spec.setdefault("volumes", [])
    existing = next((v["name"] for v in volumes if isinstance(v, dict) and
                     str(v.get("name", "")).startswith(TOKEN_VOLUME_PREFIX)), None)
    volume = existing or TOKEN_VOLUME_PREFIX + random_suffix()
    if existing is None:
        volumes.append(token_volume(volume))
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            if not isinstance(c, dict):
                continue
            mounts = c.setdefault("volumeMounts", [])
            if not any(isinstance(m, dict) and m.get("mountPath") == TOKEN_MOUNT_PATH for m in mounts):
                mounts.append({"name": volume, "readOnly": True, "mountPath": TOKEN_MOUNT_PATH})


def _priority(engine: Engine, rt: ResourceType, pod: JSON, spec: JSON) -> None:
    class_name = spec.get("priorityClassName")
    value, policy = 0, "PreemptLowerPriority"
    if class_name:
        if class_name in SYSTEM_PRIORITY_CLASSES and engine.store.get("priorityclasses.scheduling.k8s.io", "",
                                                                      class_name) is None:
            value = SYSTEM_PRIORITY_CLASSES[class_name]
        else:
            pc = engine.store.get("priorityclasses.scheduling.k8s.io", "", class_name)
            if pc is None:
                raise forbidden(
                    rt, pod["metadata"].get("name", ""), f"no PriorityClass with name {class_name} was found"
                )
            value = int(pc.obj.get("value", 0))
            policy = pc.obj.get("preemptionPolicy") or policy
    else:
        for pc in engine.store.items("priorityclasses.scheduling.k8s.io"):
            if pc.obj.get("globalDefault"):
                spec["priorityClassName"] = pc.obj["metadata"]["name"]
                value = int(pc.obj.get("value", 0))
                policy = pc.obj.get("preemptionPolicy") or policy
                break
    given = spec.get("priority")
    if given is not None and given != value:
        raise forbidden(rt, pod["metadata"].get("name", ""),
                        f"the integer value of priority ({given}) must not be provided in pod spec; priority "
                        f"admission controller computed {value} from the given PriorityClass name")
    spec["priority"] = value
    spec.setdefault("preemptionPolicy", policy)


def _default_tolerations(spec: JSON) -> None:
    tolerations = spec.get("tolerations") or []
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        covered = any(isinstance(t, dict) and (
            (t.get("key") == key and t.get("effect") in (None, "", "NoExecute")) or
            (not t.get("key") and t.get("operator") == "Exists" and t.get("effect") in (None, "", "NoExecute")))
            for t in tolerations)
        if not covered:
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                                "tolerationSeconds": DEFAULT_TOLERATION_SECONDS})
    spec["tolerations"] = tolerations


def validate(engine: Engine, rt: ResourceType, obj: JSON, old: JSON | None, ctx: Ctx) -> None:
    if rt.key == "pods" and old is None:
        _pod_security(engine, rt, obj, ctx)


def _pod_security(engine: Engine, rt: ResourceType, pod: JSON, ctx: Ctx) -> None:
    ns = engine.store.get("namespaces", "", pod["metadata"].get("namespace", ""))
    if ns is None:
        return
    policy = podsecurity.policy_of(ns.obj["metadata"].get("labels"))
    level, version = policy.enforce
    violations = podsecurity.check_pod(level, pod)
    if violations:
        raise forbidden(rt, pod["metadata"].get("name", ""),
                        "violates " + podsecurity.describe(level, version, violations))
    for mode in (policy.warn, policy.audit):
        level, version = mode
        found = podsecurity.check_pod(level, pod)
        if found:
            message = "would violate " + podsecurity.describe(level, version, found)
            if message not in ctx.warnings:
                ctx.warnings.append(message)
