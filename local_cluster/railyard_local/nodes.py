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
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from railyard_local.devices import RESOURCE_API, build_device_classes, build_slices
from railyard_local.kube import ApiError, KubeClient, Obj, retry
from railyard_local.tasks import TaskSet
from railyard_local.topology import LOCAL_GROUP, SIMULATED_LABEL, NodeSpec
from railyard_local.version import KUBERNETES_VERSION, LOCAL_BUILD

log = logging.getLogger(__name__)
FAIL_ANNOTATION = f"{LOCAL_GROUP}/fail"
SLOW_ANNOTATION = f"{LOCAL_GROUP}/slow-factor"
LEASE_NS = "kube-node-lease"
LEASE_SECONDS = 40
#: The version the nodes' kubelets report: the one the local cluster serves (railyard_local.version).
KUBELET_VERSION = f"{KUBERNETES_VERSION}+{LOCAL_BUILD}"
#: The kubelet's defaults (KubeletConfiguration): the Lease is renewed every quarter of its
#: duration (nodeLeaseDurationSeconds 40 -> every 10 s); the status is posted every
#: nodeStatusReportFrequency (5 min) when nothing changed, and within nodeStatusUpdateFrequency
#: (10 s) of a change. kube-controller-manager marks a node NotReady after its
#: node-monitor-grace-period (50 s) without either, whatever the number of nodes.
LEASE_RENEW_INTERVAL_S = LEASE_SECONDS / 4
STATUS_REPORT_INTERVAL_S = 300.0
STATUS_UPDATE_INTERVAL_S = 10.0
#: Each interval is cut in slices this long and every slice renews its share of the nodes, so
#: that 2,048 nodes cost an even ~205 small requests a second rather than a burst every 10 s.
SPREAD_SLICE_S = 0.5
#: Requests in flight at once, on the one shared session (its connection pool): registration.
CONCURRENT_REQUESTS = 32
#: Heartbeats in flight at once, on their own session (runtime.py gives it as many connections):
#: when the API server is busy, its share of them is what keeps the nodes' Leases fresh.
HEARTBEAT_REQUESTS = 128
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
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",  # deprecated; kubelets of 1.33+ leave it empty
            "containerRuntimeVersion": "railyard-process://0.1",
            "kernelVersion": "",
            "osImage": "railyard local process node",
            "machineID": spec.name,
            "systemUUID": spec.name,
            "bootID": spec.name,
        },
    }


@dataclass
class HeartbeatStats:
    """What keeping the nodes alive costs and whether it keeps up (the tests read it; the
    runtime logs a round that took more than twice the interval)."""

    lease_renewals: int = 0
    status_posts: int = 0
    failures: int = 0
    rounds: int = 0
    """Full rounds of lease renewals (every live node once)."""
    slowest_round_s: float = 0.0
    """The longest a round took; above the lease interval the server is not keeping up."""
    round_seconds: list[float] = field(default_factory=list)


class LeaseSchedule:
    """Which nodes renew their Lease at each tick, and when a round (every node once) was answered.

    A round is cut in ``slices``; tick ``t`` renews every ``slices``-th node from ``t % slices``.
    A node whose last renewal is not answered yet skips its turn, as a kubelet renews one at a
    time: the requests waiting never outnumber the nodes."""

    def __init__(self, names: list[str], slices: int) -> None:
        self.names = names
        self.slices = slices
        self.renewing: set[str] = set()
        self._unanswered: dict[int, int] = {}
        self._started: dict[int, float] = {}

    def start_slice(self, tick: int, now: float, alive: Callable[[str], bool]) -> tuple[int, list[str]]:
        """(round, the nodes to renew now)."""
        round_no, index = divmod(tick, self.slices)
        if index == 0:
            self._unanswered[round_no] = self.slices
            self._started[round_no] = now
        share = [n for n in self.names[index::self.slices] if alive(n) and n not in self.renewing]
        self.renewing.update(share)
        return round_no, share

    def answered(self, round_no: int, share: list[str], now: float) -> float | None:
        """The round's duration once this was its last slice answered, else None."""
        self.renewing.difference_update(share)
        self._unanswered[round_no] -= 1
        if self._unanswered[round_no]:
            return None
        del self._unanswered[round_no]
        return now - self._started.pop(round_no)


class NodeManager:
    """Owns the simulated Node objects and their Leases, and keeps every node Ready as a kubelet
    does: each Lease renewed every ``lease_interval`` whatever the number of nodes, the renewals
    spread evenly over the interval in slices (:data:`SPREAD_SLICE_S`) of concurrent requests on
    one session (``heartbeat_client``); each status posted every ``status_report_interval`` (spread the same
    way) and within ``status_update_interval`` of a change, such as the control plane having
    marked the node Unknown. A failed node (``railyard local node fail``) posts Ready=False once
    and then nothing, as a dead node: the control plane's node lifecycle takes it from there.

    :meth:`run` registers the nodes too (unless :meth:`register` already did) and renews each
    node's Lease from the moment that node is registered, as each kubelet starts renewing when
    it has registered its own node: registering 2,048 nodes on a loaded machine takes longer than
    the grace period (73.8 s beside a CPU hog), and renewals that waited for the last node left
    the first ones to go Unknown (issue 46). :attr:`registered` is set once every node is."""

    def __init__(
        self,
        client: KubeClient,
        specs: list[NodeSpec],
        *,
        lease_interval: float = LEASE_RENEW_INTERVAL_S,
        status_report_interval: float = STATUS_REPORT_INTERVAL_S,
        status_update_interval: float = STATUS_UPDATE_INTERVAL_S,
        spread_slice_s: float = SPREAD_SLICE_S,
        heartbeat_client: KubeClient | None = None,
        on_control: Callable[[str, NodeControl, NodeControl], None] | None = None,
        kubelet_port: int = 0,
    ) -> None:
        if min(lease_interval, status_report_interval, status_update_interval, spread_slice_s) <= 0:
            raise ValueError(f"node heartbeats: intervals must be positive seconds (lease {lease_interval}, status "
                             f"report {status_report_interval}, status update {status_update_interval}, "
                             f"slice {spread_slice_s})")
        self.client = client
        self.heartbeats = heartbeat_client or client
        """Leases and statuses go through their own session where given, as every kubelet has its
        connection: in one connection pool they would wait behind the scheduler's bindings and
        the pods' status writes of a gang starting."""
        self.kubelet_port = kubelet_port
        self.specs = {s.name: s for s in specs}
        self.lease_interval = lease_interval
        self.status_report_interval = status_report_interval
        self.status_update_interval = status_update_interval
        self.spread_slice_s = spread_slice_s
        self.controls: dict[str, NodeControl] = {s.name: NodeControl() for s in specs}
        self.stats = HeartbeatStats()
        self._since: dict[str, str] = {}
        self._next_report: dict[str, float] = {}
        self._last_post: dict[str, float] = {}
        self._stale: set[str] = set()
        self._on_control = on_control
        self._sem = asyncio.Semaphore(CONCURRENT_REQUESTS)
        self._heartbeat_sem = asyncio.Semaphore(HEARTBEAT_REQUESTS)
        self._tasks = TaskSet("node manager")
        self._dra = False
        self._renewing: set[str] = set()
        """The nodes registered (their Node and Lease written): the ones the lease schedule renews."""
        self.registered = asyncio.Event()
        """Set once every node is registered (:meth:`register` returned)."""

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
        # the next full status reports spread over one report interval from now
        now = asyncio.get_running_loop().time()
        count = len(self.specs)
        for index, name in enumerate(self.specs):
            self._next_report[name] = now + self.status_report_interval * (index + 1) / count
        self.registered.set()

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
        self._renewing.add(spec.name)  # the lease schedule renews it from its next turn on
        if self._dra:
            await self._publish_slices(spec, current.get("metadata", {}).get("uid", ""))

    async def patch_status(self, name: str) -> None:
        spec = self.specs[name]
        ready = not self.controls[name].failed
        status = build_node_status(
            spec, ready=ready, since=self._since.get(name, now_iso()), kubelet_port=self.kubelet_port
        )
        self._last_post[name] = asyncio.get_running_loop().time()
        self.stats.status_posts += 1
        await retry(lambda: self.heartbeats.patch(f"/api/v1/nodes/{name}/status", {"status": status}),
                    what=f"node {name} status")

    async def _renew_lease(self, spec: NodeSpec, node_uid: str = "") -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{spec.name}"
        body = {"spec": {"holderIdentity": spec.name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now_micro()}}
        self.stats.lease_renewals += 1
        try:
            await self.heartbeats.patch(path, body)
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
                await self.heartbeats.create(f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases", lease)
            except ApiError as exc2:
                if exc2.status != 409:
                    raise

    def on_node_event(self, kind: str, node: Obj, old: Obj | None) -> None:
        name = (node.get("metadata") or {}).get("name", "")
        if name not in self.specs or kind == "DELETED":
            return
        control = read_control(node)
        before = self.controls.get(name, NodeControl())
        if control != before:
            self.controls[name] = control
            if control.failed != before.failed:
                self._since[name] = now_iso()
                self._stale.discard(name)
                if control.failed:
                    self._tasks.spawn(self._fail(name, before, control), f"failure of node {name}")
                    return
                self._tasks.spawn(self._safe(self.patch_status(name)), f"status of node {name}")
                # back: the control plane hears of it at once
                self._tasks.spawn(self._safe(self._renew_lease(self.specs[name])), f"lease of node {name}")
            if self._on_control is not None:
                self._on_control(name, before, control)
        elif not control.failed and name not in self._stale and _ready_of(node) not in ("True", None):
            # someone else says the node is not Ready (the control plane's node lifecycle, after
            # heartbeats that came too late): a kubelet posts its status again within
            # nodeStatusUpdateFrequency
            self._since[name] = now_iso()
            self._stale.add(name)

    async def _fail(self, name: str, before: NodeControl, control: NodeControl) -> None:
        """The node NotReady first, then its pods killed (``on_control``: the agent reports them
        Failed): the control plane learns that the node failed before it learns of its pods'
        ends. In the other order, an operator can take the pods' ends for a crash and restart
        in place on the same node, then restart again once it sees the node NotReady (issue 46:
        2 pods deleted and 2 created at 2,048 pods, where 1 and 1 is the target)."""
        try:
            await self._safe(self.patch_status(name))
        finally:
            if self._on_control is not None:
                self._on_control(name, before, control)

    async def _safe(self, coro: Any) -> None:
        try:
            await coro
        except Exception as exc:
            self.stats.failures += 1
            log.warning("node update failed: %s", exc)

    def _alive(self, name: str) -> bool:
        return name in self._renewing and not self.controls[name].failed

    async def run(self) -> None:
        """Registration (unless done) and heartbeats: every registered node's Lease every
        lease_interval, from its registration on; statuses as described in the class."""
        await asyncio.gather(self._run_leases(), self._register_then_report())

    async def _register_then_report(self) -> None:
        if not self.registered.is_set():
            await self.register()
        await self._run_statuses()

    def lease_slices(self) -> int:
        """How many slices one round of renewals is cut in (each a ``spread_slice_s`` apart)."""
        return max(1, min(len(self.specs), math.ceil(self.lease_interval / self.spread_slice_s)))

    async def _run_leases(self) -> None:
        """Every slice on the clock, whether the ones before it are answered or not (as each
        kubelet renews on its own timer): a slow API server holds back only the renewals it has
        not answered yet, never the schedule."""
        loop = asyncio.get_running_loop()
        schedule = LeaseSchedule(list(self.specs), self.lease_slices())
        step = self.lease_interval / schedule.slices
        start = loop.time()
        tick = 0
        tasks = TaskSet("lease renewals")

        async def renew(round_no: int, share: list[str]) -> None:
            try:
                renewals = [functools.partial(self._renew_lease, self.specs[n]) for n in share]
                await asyncio.gather(*(self._heartbeat(renewal) for renewal in renewals))
            finally:
                took = schedule.answered(round_no, share, loop.time())
                if took is not None:
                    self._round_done(took, len(self.specs))

        try:
            while True:
                round_no, share = schedule.start_slice(tick, loop.time(), self._alive)
                tasks.spawn(renew(round_no, share), f"lease renewals {round_no}.{tick % schedule.slices}")
                tick += 1
                delay = start + tick * step - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    await asyncio.sleep(0)  # behind (a starved event loop): the answers still get their turn
                    if delay < -self.lease_interval:
                        start = loop.time() - tick * step  # far behind: go on from here rather than burst
        finally:
            await tasks.cancel_all()

    async def _heartbeat(self, request: Callable[[], Awaitable[None]]) -> None:
        """``request`` made once a heartbeat slot is free (made only then: a renewal cancelled while
        it waits for one leaves no coroutine never awaited)."""
        async with self._heartbeat_sem:
            await self._safe(request())

    def _round_done(self, took: float, count: int) -> None:
        self.stats.rounds += 1
        self.stats.slowest_round_s = max(self.stats.slowest_round_s, took)
        self.stats.round_seconds = [*self.stats.round_seconds[-99:], took]
        if took > 2 * self.lease_interval:
            log.warning("renewing %d node leases took %.1fs, more than twice the interval (%.1fs): the API "
                        "server is not keeping up and nodes may go NotReady", count, took, self.lease_interval)

    async def _run_statuses(self) -> None:
        loop = asyncio.get_running_loop()
        period = min(self.status_update_interval, self.spread_slice_s * 2)
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            due = [n for n, at in self._next_report.items() if at <= now and self._alive(n)]
            due += [n for n in self._stale if n not in due and self._alive(n)
                    and now - self._last_post.get(n, 0.0) >= self.status_update_interval]
            for name in due:
                self._next_report[name] = now + self.status_report_interval
                self._stale.discard(name)
            await asyncio.gather(*(self._heartbeat(functools.partial(self.patch_status, n)) for n in due))


def _ready_of(node: Mapping[str, Any]) -> str | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status"))
    return None
