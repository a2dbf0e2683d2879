"""Registers the simulated nodes, keeps them alive (status + Lease heartbeats), and reads the
``railyard local node ...`` controls that arrive as node annotations.

The CLI runs in another process than ``up``, so every control goes through the API server:
``local.railyard.dev/fail=true`` fails a node (NotReady, its pods killed, kept across restarts
because the annotation lives in the API), ``local.railyard.dev/slow-factor=1.5`` slows its
processes. Taints are plain ``spec.taints`` and need nothing from here.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from railyard_local.devices import RESOURCE_API, build_device_classes, build_slices
from railyard_local.kube import ApiError, KubeClient, Obj, retry
from railyard_local.tasks import TaskSet
from railyard_local.topology import LOCAL_GROUP, SIMULATED_LABEL, NodeSpec

log = logging.getLogger(__name__)
FAIL_ANNOTATION = f"{LOCAL_GROUP}/fail"
SLOW_ANNOTATION = f"{LOCAL_GROUP}/slow-factor"
LEASE_NS = "kube-node-lease"
LEASE_SECONDS = 40
#: Every node of one local cluster carries its cluster's id, so that a restart with fewer nodes
#: removes the ones it no longer runs (and never touches another cluster's nodes).
CLUSTER_LABEL = f"{LOCAL_GROUP}/cluster"


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class NodeControl:
    """The user-set state of a node, read from its annotations."""

    failed: bool = False
    slow_factor: float = 1.0


def read_control(node: Mapping[str, Any]) -> NodeControl:
    ann = (node.get("metadata", {}) or {}).get("annotations") or {}
    failed = str(ann.get(FAIL_ANNOTATION, "")).lower() == "true"
    try:
        factor = float(ann.get(SLOW_ANNOTATION, "1") or 1)
    except ValueError:
        factor = 1.0
    return NodeControl(failed=failed, slow_factor=max(1.0, factor))


def build_conditions(ready: bool, since: str, heartbeat: str) -> list[dict[str, str]]:
    ready_cond = {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": "KubeletReady" if ready else "RailyardNodeFailed",
        "message": "railyard local node agent is posting ready status"
        if ready
        else "node failed by `railyard local node fail` (recover with `railyard local node recover`)",
        "lastHeartbeatTime": heartbeat,
        "lastTransitionTime": since,
    }
    others = [
        {
            "type": kind,
            "status": "False",
            "reason": f"KubeletHas{suffix}",
            "message": f"kubelet has {suffix.lower()}",
            "lastHeartbeatTime": heartbeat,
            "lastTransitionTime": since,
        }
        for kind, suffix in (
            ("MemoryPressure", "SufficientMemory"),
            ("DiskPressure", "NoDiskPressure"),
            ("PIDPressure", "SufficientPID"),
        )
    ]
    return [*others, ready_cond]


def build_node(spec: NodeSpec, *, kubelet_port: int = 0) -> Obj:
    """The Node object for ``spec`` (status included; it is also written through /status)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": dict(spec.labels),
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", SIMULATED_LABEL: "true"},
        },
        "spec": {"providerID": f"railyard-local://{spec.name}"},
        "status": build_node_status(spec, ready=True, since=now_iso(), kubelet_port=kubelet_port),
    }


def build_node_status(spec: NodeSpec, *, ready: bool, since: str, kubelet_port: int = 0) -> Obj:
    """``kubelet_port``: where the runtime's kubelet endpoint (kubelet.py) serves this node's
    container logs, on its InternalIP; 0 when none does. No Hostname address (as kwok's nodes):
    kube-apiserver dials the first of Hostname, InternalDNS, InternalIP by default, and node
    names do not resolve here."""
    cap = spec.capacity()
    stamp = now_iso()
    return {
        "capacity": cap,
        "allocatable": dict(cap),
        "conditions": build_conditions(ready, since, stamp),
        "addresses": [{"type": "InternalIP", "address": spec.ip}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "architecture": "amd64",
            "operatingSystem": "linux",
            "kubeletVersion": "v1.31.0-railyard-local",
            "kubeProxyVersion": "v1.31.0-railyard-local",
            "containerRuntimeVersion": "railyard-process://0.1",
            "kernelVersion": "",
            "osImage": "railyard local process node",
            "machineID": spec.name,
            "systemUUID": spec.name,
            "bootID": spec.name,
        },
    }


class NodeManager:
    """Owns the simulated Node objects and their Leases."""

    def __init__(
        self,
        client: KubeClient,
        specs: list[NodeSpec],
        *,
        lease_interval: float = 10.0,
        status_interval: float = 30.0,
        on_control: Callable[[str, NodeControl, NodeControl], None] | None = None,
        kubelet_port: int = 0,
    ) -> None:
        self.client = client
        self.kubelet_port = kubelet_port
        self.specs = {s.name: s for s in specs}
        scale = max(1.0, len(specs) / 200)
        self.lease_interval = lease_interval * scale
        self.status_interval = status_interval * scale
        self.controls: dict[str, NodeControl] = {s.name: NodeControl() for s in specs}
        self._since: dict[str, str] = {}
        self._on_control = on_control
        self._sem = asyncio.Semaphore(32)
        self._tasks = TaskSet("node manager")
        self._dra = False

    async def _bounded(self, coro: Any) -> Any:
        async with self._sem:
            return await coro

    async def register(self) -> None:
        """Create or update every node and its Lease; keeps annotations and taints set earlier."""
        try:
            await self.client.create("/api/v1/namespaces", {"metadata": {"name": LEASE_NS}})
        except ApiError as exc:
            if exc.status != 409:
                raise
        self._dra = any(s.gpus for s in self.specs.values()) and await self._publish_device_classes()
        await asyncio.gather(*(self._bounded(self._register_one(s)) for s in self.specs.values()))
        await self._remove_stale()

    async def _publish_device_classes(self) -> bool:
        """The DeviceClasses of the simulated GPUs (railyard_local.devices); False where the API
        server does not serve resource.k8s.io/v1 (the GPUs are then nvidia.com/gpu only)."""
        for cls in build_device_classes():
            try:
                await self.client.create(f"{RESOURCE_API}/deviceclasses", cls)
            except ApiError as exc:
                if exc.status == 404:
                    log.info("the API server does not serve resource.k8s.io/v1: no ResourceSlices published")
                    return False
                if exc.status != 409:
                    raise
        return True

    async def _publish_slices(self, spec: NodeSpec, node_uid: str) -> None:
        """What a DRA driver's kubelet plugin publishes for the node: its devices, owned by the Node."""
        for piece in build_slices(spec.name, node_uid, spec.gpus):
            try:
                await self.client.create(f"{RESOURCE_API}/resourceslices", piece)
            except ApiError as exc:
                if exc.status != 409:
                    raise

    async def _remove_stale(self) -> None:
        ids = {s.labels.get(CLUSTER_LABEL) for s in self.specs.values()}
        if len(ids) != 1 or None in ids:
            return
        listing = await self.client.get("/api/v1/nodes", labelSelector=f"{CLUSTER_LABEL}={ids.pop()}")
        for node in listing.get("items") or []:
            name = (node.get("metadata") or {}).get("name", "")
            if name not in self.specs:
                log.info("removing node %s: no longer part of this local cluster", name)
                await retry(functools.partial(self.client.delete, f"/api/v1/nodes/{name}"), what=f"delete node {name}")

    async def _register_one(self, spec: NodeSpec) -> None:
        path = f"/api/v1/nodes/{spec.name}"
        try:
            current = await self.client.get(path)
            await self.client.patch(path, {"metadata": {"labels": spec.labels}})
        except ApiError as exc:
            if exc.status != 404:
                raise
            current = await self.client.create("/api/v1/nodes", build_node(spec, kubelet_port=self.kubelet_port))
        control = read_control(current)
        self.controls[spec.name] = control
        self._since[spec.name] = now_iso()
        await self.patch_status(spec.name)
        await self._renew_lease(spec, current.get("metadata", {}).get("uid", ""))
        if self._dra:
            await self._publish_slices(spec, current.get("metadata", {}).get("uid", ""))

    async def patch_status(self, name: str) -> None:
        spec = self.specs[name]
        ready = not self.controls[name].failed
        status = build_node_status(spec, ready=ready, since=self._since.get(name, now_iso()), kubelet_port=self.kubelet_port)
        await retry(lambda: self.client.patch(f"/api/v1/nodes/{name}/status", {"status": status}), what=f"node {name} status")

    async def _renew_lease(self, spec: NodeSpec, node_uid: str = "") -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{spec.name}"
        body = {"spec": {"holderIdentity": spec.name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now_micro()}}
        try:
            await self.client.patch(path, body)
        except ApiError as exc:
            if exc.status != 404:
                raise
            lease: Obj = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": spec.name, "namespace": LEASE_NS},
                **body,
            }
            if node_uid:
                lease["metadata"]["ownerReferences"] = [
                    {"apiVersion": "v1", "kind": "Node", "name": spec.name, "uid": node_uid}
                ]
            try:
                await self.client.create(f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases", lease)
            except ApiError as exc2:
                if exc2.status != 409:
                    raise

    def on_node_event(self, kind: str, node: Obj, old: Obj | None) -> None:
        name = (node.get("metadata") or {}).get("name", "")
        if name not in self.specs or kind == "DELETED":
            return
        control = read_control(node)
        before = self.controls.get(name, NodeControl())
        if control == before:
            return
        self.controls[name] = control
        if control.failed != before.failed:
            self._since[name] = now_iso()
            self._tasks.spawn(self._safe(self.patch_status(name)), f"status of node {name}")
        if self._on_control is not None:
            self._on_control(name, before, control)

    async def _safe(self, coro: Any) -> None:
        try:
            await coro
        except Exception as exc:
            log.warning("node update failed: %s", exc)

    async def run(self) -> None:
        """Heartbeats: Leases every lease_interval, node status every status_interval."""
        loop = asyncio.get_running_loop()
        next_status = loop.time() + self.status_interval
        while True:
            await asyncio.sleep(self.lease_interval)
            alive = [s for s in self.specs.values() if not self.controls[s.name].failed]
            await asyncio.gather(*(self._bounded(self._safe(self._renew_lease(s))) for s in alive))
            if loop.time() >= next_status:
                next_status = loop.time() + self.status_interval
                await asyncio.gather(*(self._bounded(self._safe(self.patch_status(s.name))) for s in self.specs.values()))
