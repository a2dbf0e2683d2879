"""Pod volumes on the local disk: where each kind lives and how it is filled.

hostPath folders are per node (``<state>/nodes/<node>/hostpath/...``) except under a shared
prefix, a network filesystem every node mounts (``<state>/shared/...``); a PVC is one folder per
claim, shared by all nodes; emptyDir, configMap, secret, projected and downwardAPI volumes live in
the pod's folder and are written from the objects the pod refers to.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from railyard_local import podenv
from railyard_local.kube import Obj
from railyard_local.podenv import ContainerConfigError, PodContext
from railyard_local.topology import NodeSpec

#: hostPaths under these prefixes are one folder for all nodes (a shared filesystem mount).
DEFAULT_SHARED_HOST_PATHS = ("/mnt",)


@dataclass(frozen=True)
class VolumeLayout:
    """Where a runtime's pods keep their volumes (under its state folder)."""

    state_dir: Path
    #: prefixes (no trailing slash) of hostPaths every node shares
    shared_host_paths: tuple[str, ...] = DEFAULT_SHARED_HOST_PATHS

    def node_dir(self, node: str) -> Path:
        return self.state_dir / "nodes" / node

    def host_path(self, node: str, path: str) -> Path:
        """A hostPath's folder: per node, except under a shared prefix (a network filesystem
        mounted on every node, like /mnt/lustre), which all nodes see as one folder."""
        clean = "/" + path.strip("/")
        for prefix in self.shared_host_paths:
            if clean == prefix or clean.startswith(prefix + "/"):
                return self.state_dir / "shared" / clean.lstrip("/")
        return self.node_dir(node) / "hostpath" / clean.lstrip("/")

    def materialise_volumes(
        self, pod: Obj, node: NodeSpec, pod_dir: Path, ctx: PodContext, *, create: bool = True
    ) -> dict[str, str]:
        """Create each volume's folder; returns volume name -> real path.

        ``create=False`` (a simulated pod: no process will read them) resolves the same paths and
        raises the same :class:`ContainerConfigError` for a missing object or key, but touches no
        disk: at a 1,000-pod gang the folders and files were most of the agent's time.
        """
        out: dict[str, str] = {}

        def mkdir(path: Path) -> None:
            if create:
                path.mkdir(parents=True, exist_ok=True)

        mkdir(pod_dir)
        for vol in (pod.get("spec") or {}).get("volumes") or []:
            name = str(vol.get("name", ""))
            if vol.get("hostPath"):
                hp = vol["hostPath"]
                real = self.host_path(node.name, str(hp.get("path", "")))
                if hp.get("type") in ("File", "FileOrCreate", "Socket", "CharDevice", "BlockDevice"):
                    mkdir(real.parent)
                    if create and hp.get("type") == "FileOrCreate":
                        real.touch(exist_ok=True)
                else:
                    mkdir(real)
                out[name] = str(real)
                continue
            if vol.get("persistentVolumeClaim"):
                ns = str((pod.get("metadata") or {}).get("namespace", "default"))
                real = self.state_dir / "shared" / "pvc" / ns / str(vol["persistentVolumeClaim"].get("claimName", name))
                mkdir(real)
                out[name] = str(real)
                continue
            real = pod_dir / "volumes" / name
            if create and real.exists():
                shutil.rmtree(real, ignore_errors=True)
            mkdir(real)
            out[name] = str(real)
            if vol.get("configMap") or vol.get("secret"):
                secret = bool(vol.get("secret"))
                src = vol.get("secret") or vol.get("configMap") or {}
                obj_name = src.get("secretName") if secret else src.get("name")
                self._write_keys(real, ctx, str(obj_name), src, secret=secret, field=f"volumes[{name}]", write=create)
            elif vol.get("projected"):
                # serviceAccountToken sources get no file: this agent issues no tokens (the
                # service-account volume admission adds still carries ca.crt and namespace)
                for s in vol["projected"].get("sources") or []:
                    for kind, secret in (("configMap", False), ("secret", True)):
                        if s.get(kind):
                            self._write_keys(
                                real,
                                ctx,
                                str(s[kind].get("name")),
                                s[kind],
                                secret=secret,
                                field=f"volumes[{name}]",
                                write=create,
                            )
                    if s.get("downwardAPI"):
                        self._write_field_refs(real, ctx, s["downwardAPI"], write=create)
            elif vol.get("downwardAPI"):
                self._write_field_refs(real, ctx, vol["downwardAPI"], write=create)
        return out

    @staticmethod
    def _write_field_refs(folder: Path, ctx: PodContext, src: Obj, *, write: bool = True) -> None:
        for item in src.get("items") or []:
            if item.get("fieldRef"):
                value = podenv.resolve_field_ref(ctx, str(item["fieldRef"].get("fieldPath")))
                if write:
                    target = folder / str(item.get("path"))
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(value)

    def _write_keys(
        self, folder: Path, ctx: PodContext, obj_name: str, src: Obj, *, secret: bool, field: str, write: bool = True
    ) -> None:
        obj = (ctx.secrets if secret else ctx.configmaps).get(obj_name)
        if obj is None:
            if src.get("optional"):
                return
            kind = "secret" if secret else "configmap"
            raise ContainerConfigError(f"{field}: {kind} {obj_name!r} not found")
        data = podenv.object_bytes(obj, secret=secret)
        items = src.get("items")
        pairs = (
            [(str(i.get("key")), str(i.get("path")), i.get("mode")) for i in items]
            if items
            else [(k, k, None) for k in data]
        )
        mode_default = int(src.get("defaultMode", 0o644))
        for key, rel, mode in pairs:
            if key not in data:
                if src.get("optional"):
                    continue
                raise ContainerConfigError(f"{field}.items: key {key!r} not found in {obj_name!r}")
            if not write:
                continue
            target = folder / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data[key])
            with contextlib.suppress(OSError):
                target.chmod(int(mode) if mode is not None else mode_default)
