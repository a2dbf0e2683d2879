"""How a pod's spec becomes a local process: environment, mounts and the names it answers to.

Pure functions over plain dicts; the node agent fetches the ConfigMaps and Secrets and hands
them in. Kubernetes semantics kept: ``envFrom`` first, then ``env`` (later wins), ``$(VAR)``
expansion of earlier variables in values, command and args (``$$`` escapes), downward-API
``fieldRef`` and ``resourceFieldRef``, and a missing non-optional ConfigMap/Secret key makes the
container fail to start with ``CreateContainerConfigError``.

Mounts: a process cannot see ``/data`` without root, so every ``volumeMounts[].mountPath`` is
mapped to a real folder on the simulated node and the agent rewrites each occurrence of a mount
path (as a whole path prefix) in command, args and env values. ``RAILYARD_MOUNTS`` carries the
map as JSON for programs that build paths at run time.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from railyard.api.quantity import QuantityError, parse_quantity
from railyard.protocol.envexpand import expand

Obj = Mapping[str, Any]
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_FIELD_INDEX = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class ContainerConfigError(Exception):
    """The container cannot start: a referenced ConfigMap/Secret/key is missing or a ref is bad."""

    reason = "CreateContainerConfigError"


@dataclass
class PodContext:
    """What env resolution needs besides the container itself."""

    pod: Obj
    pod_ip: str
    host_ip: str
    node_allocatable: Mapping[str, str] = field(default_factory=dict)
    #: name -> ConfigMap / Secret object; a name absent from the map does not exist.
    configmaps: Mapping[str, Obj] = field(default_factory=dict)
    secrets: Mapping[str, Obj] = field(default_factory=dict)


def referenced_objects(pod: Obj) -> tuple[set[str], set[str]]:
    """Names of the ConfigMaps and Secrets the pod's env, envFrom and volumes refer to."""
    cms: set[str] = set()
    secrets: set[str] = set()
    spec = pod.get("spec", {}) or {}
    for c in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
        for src in c.get("envFrom") or []:
            if src.get("configMapRef"):
                cms.add(src["configMapRef"].get("name", ""))
            if src.get("secretRef"):
                secrets.add(src["secretRef"].get("name", ""))
        for env in c.get("env") or []:
            ref = env.get("valueFrom") or {}
            if ref.get("configMapKeyRef"):
                cms.add(ref["configMapKeyRef"].get("name", ""))
            if ref.get("secretKeyRef"):
                secrets.add(ref["secretKeyRef"].get("name", ""))
    for vol in spec.get("volumes") or []:
        if vol.get("configMap"):
            cms.add(vol["configMap"].get("name", ""))
        if vol.get("secret"):
            secrets.add(vol["secret"].get("secretName", ""))
        for src in (vol.get("projected") or {}).get("sources") or []:
            if src.get("configMap"):
                cms.add(src["configMap"].get("name", ""))
            if src.get("secret"):
                secrets.add(src["secret"].get("name", ""))
    cms.discard("")
    secrets.discard("")
    return cms, secrets


def object_data(obj: Obj, *, secret: bool) -> dict[str, str]:
    """A ConfigMap's data (+binaryData) or a Secret's decoded data, as text."""
    out: dict[str, str] = {}
    if secret:
        for key, value in (obj.get("data") or {}).items():
            out[key] = base64.b64decode(value).decode("utf-8", errors="replace")
        for key, value in (obj.get("stringData") or {}).items():
            out[key] = str(value)
    else:
        for key, value in (obj.get("binaryData") or {}).items():
            out[key] = base64.b64decode(value).decode("utf-8", errors="replace")
        out.update({k: str(v) for k, v in (obj.get("data") or {}).items()})
    return out


def object_bytes(obj: Obj, *, secret: bool) -> dict[str, bytes]:
    """Like :func:`object_data` but keeps binary values exact (for volume files)."""
    out: dict[str, bytes] = {}
    if secret:
        for key, value in (obj.get("data") or {}).items():
            out[key] = base64.b64decode(value)
        for key, value in (obj.get("stringData") or {}).items():
            out[key] = str(value).encode()
    else:
        for key, value in (obj.get("data") or {}).items():
            out[key] = str(value).encode()
        for key, value in (obj.get("binaryData") or {}).items():
            out[key] = base64.b64decode(value)
    return out


def resolve_field_ref(ctx: PodContext, path: str) -> str:
    """A downward-API ``fieldRef.fieldPath`` of the pod."""
    meta = ctx.pod.get("metadata", {}) or {}
    spec = ctx.pod.get("spec", {}) or {}
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", "default"),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": ctx.pod_ip,
        "status.podIPs": ctx.pod_ip,
        "status.hostIP": ctx.host_ip,
        "status.hostIPs": ctx.host_ip,
    }
    if path in simple:
        return str(simple[path])
    match = _FIELD_INDEX.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = (meta.get(path.split(".")[1]) or {}).items()
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items))
    raise ContainerConfigError(
        f"fieldRef.fieldPath: {path!r} is not supported; use metadata.name, metadata.namespace, "
        "metadata.uid, metadata.labels['k'], metadata.annotations['k'], spec.nodeName, "
        "spec.serviceAccountName, status.podIP or status.hostIP"
    )


def resolve_resource_ref(ctx: PodContext, container: Obj, ref: Obj) -> str:
    """A downward-API ``resourceFieldRef``: ceil(amount / divisor); unset limits -> node allocatable."""
    name = ref.get("containerName") or container.get("name")
    spec = ctx.pod.get("spec", {}) or {}
    target = next((c for c in spec.get("containers") or [] if c.get("name") == name), container)
    kind, _, resource = str(ref.get("resource", "")).partition(".")
    if kind not in ("limits", "requests") or not resource:
        raise ContainerConfigError(
            f"resourceFieldRef.resource: {ref.get('resource')!r} must be limits.<name> or requests.<name>"
        )
    res = target.get("resources", {}) or {}
    value: Any = (res.get(kind) or {}).get(resource)
    if value is None and kind == "requests":
        value = (res.get("limits") or {}).get(resource, 0)
    if value is None:
        value = ctx.node_allocatable.get(resource, 0)
    try:
        amount = parse_quantity(value)
        divisor = parse_quantity(ref.get("divisor") or "1")
    except QuantityError as exc:
        raise ContainerConfigError(f"resourceFieldRef: {exc}") from exc
    if divisor <= 0:
        raise ContainerConfigError("resourceFieldRef.divisor: must be > 0")
    return str(math.ceil(amount / divisor))


def _key_ref(ctx: PodContext, ref: Obj, *, secret: bool) -> str | None:
    kind = "secretKeyRef" if secret else "configMapKeyRef"
    name, key = ref.get("name", ""), ref.get("key", "")
    source = ctx.secrets if secret else ctx.configmaps
    optional = bool(ref.get("optional", False))
    obj = source.get(name)
    if obj is None:
        if optional:
            return None
        raise ContainerConfigError(f"{kind}: {'secret' if secret else 'configmap'} {name!r} not found")
    data = object_data(obj, secret=secret)
    if key not in data:
        if optional:
            return None
        raise ContainerConfigError(f"{kind}: key {key!r} not found in {'secret' if secret else 'configmap'} {name!r}")
    return data[key]


def build_env(ctx: PodContext, container: Obj) -> dict[str, str]:
    """The container's own environment, in Kubernetes' order and with its expansion rules."""
    env: dict[str, str] = {}
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "") or ""
        for kind, secret in (("configMapRef", False), ("secretRef", True)):
            ref = src.get(kind)
            if not ref:
                continue
            obj = (ctx.secrets if secret else ctx.configmaps).get(ref.get("name", ""))
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ContainerConfigError(
                    f"envFrom.{kind}: {'secret' if secret else 'configmap'} {ref.get('name')!r} not found"
                )
            for key, text in object_data(obj, secret=secret).items():
                if _ENV_NAME.match(prefix + key):
                    env[prefix + key] = text
    for item in container.get("env") or []:
        name = str(item.get("name", ""))
        if "value" in item or not item.get("valueFrom"):
            env[name] = expand(str(item.get("value", "")), env)
            continue
        ref = item["valueFrom"]
        value: str | None
        if ref.get("fieldRef"):
            value = resolve_field_ref(ctx, str(ref["fieldRef"].get("fieldPath", "")))
        elif ref.get("resourceFieldRef"):
            value = resolve_resource_ref(ctx, container, ref["resourceFieldRef"])
        elif ref.get("configMapKeyRef"):
            value = _key_ref(ctx, ref["configMapKeyRef"], secret=False)
        elif ref.get("secretKeyRef"):
            value = _key_ref(ctx, ref["secretKeyRef"], secret=True)
        else:
            raise ContainerConfigError(f"env[{name}].valueFrom: unsupported source {sorted(ref)}")
        if value is not None:
            env[name] = value
    return env


def build_mounts(container: Obj, volume_dirs: Mapping[str, str]) -> dict[str, str]:
    """mountPath -> real path for the container's mounts (subPath honoured)."""
    mounts: dict[str, str] = {}
    for m in container.get("volumeMounts") or []:
        real = volume_dirs.get(str(m.get("name", "")))
        if real is None:
            raise ContainerConfigError(
                f"volumeMounts[{m.get('name')}]: no volume of that name in spec.volumes"
            )
        sub = str(m.get("subPath", "") or "").strip("/")
        mounts[str(m.get("mountPath", "")).rstrip("/") or "/"] = f"{real}/{sub}" if sub else real
    return mounts


def rewrite_paths(text: str, mounts: Mapping[str, str], exists: Callable[[str], bool] = os.path.exists) -> str:
    """Replace each mount path that appears as a whole path prefix with its real folder.

    ``/ckpt/run1`` and ``--dir=/ckpt`` are rewritten for a mount at ``/ckpt``; ``/ckpts`` and
    ``x/ckpt`` are not. The longest mount path wins. A path that exists on this machine but not
    under the mount's folder is left alone (``/work/venv/bin/python`` with a mount at ``/work``).
    """
    if not mounts:
        return text
    for path in sorted(mounts, key=len, reverse=True):
        if path == "/" or path not in text:
            continue
        pattern = re.compile(r"(?<![\w./-])" + re.escape(path) + r"(?=/|$|[^\w.-])" + r"((?:/[^\s'\":=,;]*)?)")
        text = pattern.sub(_rewriter(path, mounts[path], exists), text)
    return text


def _rewriter(path: str, real: str, exists: Callable[[str], bool]) -> Callable[[re.Match[str]], str]:
    def sub(match: re.Match[str]) -> str:
        rest = match.group(1)
        if exists(path + rest) and not exists(real + rest):
            return match.group(0)
        return real + rest

    return sub


def build_command(container: Obj, env: Mapping[str, str], mounts: Mapping[str, str]) -> list[str]:
    """command + args, expanded and rewritten; empty when the container names neither."""
    argv = [str(a) for a in (container.get("command") or [])] + [str(a) for a in (container.get("args") or [])]
    return [rewrite_paths(expand(a, env), mounts) for a in argv]


def dns_names(pod: Obj, cluster_domain: str = "cluster.local") -> list[str]:
    """The names the pod answers to: ``<hostname>.<subdomain>.<ns>.svc[.<domain>]`` and shorter."""
    meta = pod.get("metadata", {}) or {}
    spec = pod.get("spec", {}) or {}
    ns = meta.get("namespace", "default")
    hostname = spec.get("hostname") or meta.get("name", "")
    names: list[str] = []
    subdomain = spec.get("subdomain")
    if subdomain:
        base = f"{hostname}.{subdomain}"
        names += [f"{base}.{ns}.svc.{cluster_domain}", f"{base}.{ns}.svc", f"{base}.{ns}", base]
    return names


def service_names(name: str, namespace: str, cluster_domain: str = "cluster.local") -> list[str]:
    return [f"{name}.{namespace}.svc.{cluster_domain}", f"{name}.{namespace}.svc", f"{name}.{namespace}"]


def mounts_json(mounts: Mapping[str, str]) -> str:
    return json.dumps(dict(mounts), sort_keys=True)
