"""Run a container of a Kubernetes pod spec with ``docker run``, the way the kubelet would run it.

The chart's Deployment and the operator's training pods are the specs; this turns one container
of them into ``docker run`` arguments: user and groups, read-only root filesystem, capabilities,
no-new-privileges, memory limit, volumes (emptyDir as tmpfs, hostPath and configMap as bind
mounts), the service-account token, the termination-message file, environment (downward API and secret references resolved
from what the test gives), command and args. Any field it cannot honour fails the test, so a new
setting in the chart or the pod builder cannot slip past the image without being run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from railyard.api.quantity import parse_quantity

Obj = dict[str, Any]
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

#: Container fields this translation honours (or that have no meaning for one docker run).
_CONTAINER_FIELDS = {"name", "image", "imagePullPolicy", "command", "args", "env", "ports", "resources",
                     "securityContext", "volumeMounts", "livenessProbe", "readinessProbe", "startupProbe",
                     "terminationMessagePath", "terminationMessagePolicy"}
_POD_SECURITY = {"runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup", "seccompProfile"}
_CONTAINER_SECURITY = {"allowPrivilegeEscalation", "readOnlyRootFilesystem", "runAsNonRoot", "runAsUser",
                       "runAsGroup", "privileged", "capabilities", "seccompProfile"}


class Unsupported(AssertionError):
    """The spec asks for something this docker translation does not do: extend podspec.py."""


@dataclass
class Given:
    """What the kubelet and API server would supply."""

    pod_name: str = "pod-0"
    node_name: str = "node-0"
    namespace: str = "default"
    #: (secret name, key) -> value, for env secretKeyRef
    secrets: Mapping[tuple[str, str], str] = field(default_factory=dict)
    #: volume name -> host folder, for configMap, secret and hostPath volumes
    volumes: Mapping[str, Path] = field(default_factory=dict)
    #: a folder with token, ca.crt, namespace: mounted where the kubelet mounts the pod's token
    service_account: Path | None = None
    #: env the kubelet adds (KUBERNETES_SERVICE_HOST/PORT) or the test overrides
    extra_env: Mapping[str, str] = field(default_factory=dict)
    #: a host file the kubelet creates for the container's terminationMessagePath
    termination_log: Path | None = None


def _check(keys: Any, allowed: set[str], where: str) -> None:
    unknown = set(keys) - allowed
    if unknown:
        raise Unsupported(f"{where}: {sorted(unknown)} not translated to docker run (tests/images/podspec.py)")


def security(pod: Obj, container: Obj) -> tuple[int, int, list[str]]:
    """(uid, gid, docker flags) from the pod's and the container's securityContext."""
    psc, csc = pod.get("securityContext") or {}, container.get("securityContext") or {}
    _check(psc, _POD_SECURITY, "pod securityContext")
    _check(csc, _CONTAINER_SECURITY, f"container {container['name']} securityContext")
    uid = csc.get("runAsUser", psc.get("runAsUser"))
    gid = csc.get("runAsGroup", psc.get("runAsGroup", 0))
    if uid is None:
        raise Unsupported(f"container {container['name']}: no runAsUser (the image's USER would apply; give it)")
    if csc.get("runAsNonRoot", psc.get("runAsNonRoot")) and int(uid) == 0:
        raise AssertionError(f"container {container['name']}: runAsNonRoot with runAsUser 0: the kubelet refuses it")
    flags = ["--user", f"{uid}:{gid}"]
    if psc.get("fsGroup") is not None:
        flags += ["--group-add", str(psc["fsGroup"])]
    if csc.get("privileged"):
        raise Unsupported("privileged containers")
    if csc.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    caps = csc.get("capabilities") or {}
    for cap in caps.get("drop") or ():
        flags += ["--cap-drop", str(cap)]
    for cap in caps.get("add") or ():
        flags += ["--cap-add", str(cap)]
    if csc.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    for sc in (psc, csc):
        profile = (sc.get("seccompProfile") or {}).get("type")
        if profile not in (None, "RuntimeDefault"):
            raise Unsupported(f"seccompProfile {profile}")  # RuntimeDefault: docker's default profile
    return int(uid), int(gid), flags


def _env(container: Obj, given: Given) -> list[str]:
    flags: list[str] = []
    for e in container.get("env") or ():
        name = e["name"]
        if "value" in e:
            value = str(e["value"])
        else:
            src = e.get("valueFrom") or {}
            if "fieldRef" in src:
                path = src["fieldRef"]["fieldPath"]
                value = {"metadata.name": given.pod_name, "spec.nodeName": given.node_name,
                         "metadata.namespace": given.namespace}.get(path, "")
                if not value:
                    raise Unsupported(f"env {name}: fieldRef {path}")
            elif "secretKeyRef" in src:
                ref = src["secretKeyRef"]
                value = given.secrets[(ref["name"], ref["key"])]
            else:
                raise Unsupported(f"env {name}: {sorted(src)}")
        if name not in given.extra_env:
            flags += ["-e", f"{name}={value}"]
    for name, value in given.extra_env.items():
        flags += ["-e", f"{name}={value}"]
    return flags


def _mounts(pod: Obj, container: Obj, given: Given) -> list[str]:
    volumes = {v["name"]: v for v in pod.get("volumes") or ()}
    flags: list[str] = []
    for m in container.get("volumeMounts") or ():
        _check(m, {"name", "mountPath", "readOnly"}, f"volumeMount {m.get('name')}")
        vol = volumes[m["name"]]
        kind = next(k for k in vol if k != "name")
        ro = ":ro" if m.get("readOnly") else ""
        if kind == "emptyDir":
            size = (vol["emptyDir"] or {}).get("sizeLimit")
            opts = "rw,mode=1777" + (f",size={int(parse_quantity(size))}" if size else "")
            flags += ["--tmpfs", f"{m['mountPath']}:{opts}"]
        elif kind in ("configMap", "secret", "hostPath"):
            flags += ["-v", f"{given.volumes[m['name']]}:{m['mountPath']}{ro}"]
        else:
            raise Unsupported(f"volume {m['name']}: {kind}")
    if "terminationMessagePath" in container:
        if given.termination_log is None:
            raise Unsupported(f"container {container['name']}: terminationMessagePath without Given.termination_log")
        flags += ["-v", f"{given.termination_log}:{container['terminationMessagePath']}"]
    if pod.get("automountServiceAccountToken") and given.service_account is not None:
        flags += ["-v", f"{given.service_account}:{SA_DIR}:ro"]
    elif pod.get("automountServiceAccountToken"):
        raise Unsupported("automountServiceAccountToken without Given.service_account")
    return flags


def docker_run_args(pod: Obj, container: Obj, image: str, given: Given) -> list[str]:
    """``docker run`` arguments (after ``docker run``) for ``container`` of ``pod``."""
    _check(container, _CONTAINER_FIELDS, f"container {container['name']}")
    _, _, flags = security(pod, container)
    limits = (container.get("resources") or {}).get("limits") or {}
    if "memory" in limits:
        flags += ["--memory", str(int(parse_quantity(limits["memory"])))]
    flags += _env(container, given) + _mounts(pod, container, given)
    cmd = list(container.get("command") or ())
    if cmd:
        flags += ["--entrypoint", cmd[0]]
    return [*flags, image, *cmd[1:], *(str(a) for a in container.get("args") or ())]


def probe_url(container: Obj, probe: str, host: str = "127.0.0.1") -> str:
    """The URL an httpGet probe of ``container`` polls (named ports resolved)."""
    spec = container[probe]
    get = spec.get("httpGet")
    if get is None:
        raise Unsupported(f"{probe}: only httpGet probes are run here")
    port = get["port"]
    if isinstance(port, str):
        port = next(p["containerPort"] for p in container.get("ports") or () if p.get("name") == port)
    return f"http://{host}:{port}{get.get('path', '/')}"
