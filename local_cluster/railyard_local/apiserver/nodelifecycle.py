"""kube-controller-manager's node lifecycle rule, so that a node whose heartbeats stop goes
NotReady here as it does on a real control plane.

Without it a node agent that renews its Leases too seldom looks healthy on the embedded server
and fails on every real one (issue 46: 2,088 nodes went NotReady on a real control plane, and
no test saw it). What the real controller does, as recorded in kube-golden/v1.36-disruption
(047-052, ``--node-monitor-grace-period=50s``, monitor period 5 s):

- a node's health is probed from two heartbeats: its Lease in ``kube-node-lease`` renewed, or its
  Ready condition's ``lastHeartbeatTime`` changed. The controller times both on its own clock
  when it sees them (never by the timestamps the node wrote), so a node's clock skew is harmless;
- when the last heartbeat is older than the grace period (checked every monitor period: the
  recorded node went at 53.8 s), Ready, MemoryPressure, DiskPressure and PIDPressure become
  ``Unknown``, reason ``NodeStatusUnknown``, "Kubelet stopped posting node status." (their
  ``lastHeartbeatTime`` kept, ``lastTransitionTime`` now); the node gets the taints
  ``node.kubernetes.io/unreachable`` NoSchedule and NoExecute, its pods ``Ready=False``, and the
  Event ``NodeNotReady`` from ``node-controller``;
- the taints follow the Ready condition: ``unreachable`` while Unknown, ``not-ready`` while False
  (a node that says it failed), none while True (heartbeats back: the agent posts Ready and the
  taints go).

What it leaves to others: taint-based eviction of the node's pods (NoExecute) and the cordon
taint. The decisions are the pure functions at the top; :class:`NodeLifecycle` only observes
writes, keeps the probe times, and writes what the functions decide.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .engine import Ctx, Engine
from .errors import APIError
from .registry import LEASE_KEY, ResourceType
from .store import Entry

log = logging.getLogger(__name__)
JSON = dict[str, Any]

NODE_LEASE_NAMESPACE = "kube-node-lease"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
STATUS_UNKNOWN_REASON = "NodeStatusUnknown"
STATUS_UNKNOWN_MESSAGE = "Kubelet stopped posting node status."
NEVER_UPDATED_REASON = "NodeStatusNeverUpdated"
NEVER_UPDATED_MESSAGE = "Kubelet never posted node status."
#: The conditions the real controller turns Unknown, in the order it appends missing ones.
MONITORED_CONDITIONS = ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")
MANAGER = "kube-controller-manager"
EVENT_SOURCE = "node-controller"
#: Taints this controller owns, by the Ready condition's status.
TAINTS_BY_READY: Mapping[str, tuple[str, ...]] = {
    "True": (),
    "False": (NOT_READY_TAINT,),
    "Unknown": (UNREACHABLE_TAINT,),
}
OWNED_TAINT_KEYS = frozenset({UNREACHABLE_TAINT, NOT_READY_TAINT})


@dataclass(frozen=True)
class NodeLifecycleSettings:
    """kube-controller-manager's flags of the same names (its defaults)."""

    grace_period_s: float = 50.0
    """``--node-monitor-grace-period``: how long a node may go without a heartbeat."""
    monitor_period_s: float = 5.0
    """``--node-monitor-period``: how often nodes are checked."""

    def __post_init__(self) -> None:
        if self.grace_period_s <= 0 or self.monitor_period_s <= 0:
            raise ValueError(f"node lifecycle: grace period ({self.grace_period_s}) and monitor period "
                             f"({self.monitor_period_s}) must be positive seconds")


#: kube-controller-manager's defaults: what the embedded server applies unless told otherwise.
DEFAULT_SETTINGS = NodeLifecycleSettings()


# ---- decisions (pure) ------------------------------------------------------------------------


def condition_of(node: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def ready_status(node: Mapping[str, Any]) -> str:
    """True, False or Unknown (a node that never posted a Ready condition is Unknown)."""
    cond = condition_of(node, "Ready")
    return str(cond.get("status") or "Unknown") if cond else "Unknown"


def status_heartbeat(node: Mapping[str, Any]) -> str:
    """What changes when a node posts its status: the Ready condition's lastHeartbeatTime."""
    cond = condition_of(node, "Ready")
    return str(cond.get("lastHeartbeatTime") or "") if cond else ""


def decide_conditions_unknown(node: Mapping[str, Any], now: str) -> list[JSON] | None:
    """The node's conditions once its heartbeats are overdue; None when they already say so."""
    conditions = [dict(c) for c in (node.get("status") or {}).get("conditions") or []]
    changed = False
    for kind in MONITORED_CONDITIONS:
        current = next((c for c in conditions if c.get("type") == kind), None)
        if current is None:
            conditions.append({
                "type": kind, "status": "Unknown", "reason": NEVER_UPDATED_REASON, "message": NEVER_UPDATED_MESSAGE,
                "lastHeartbeatTime": (node.get("metadata") or {}).get("creationTimestamp"), "lastTransitionTime": now,
            })
            changed = True
        elif current.get("status") != "Unknown":
            current.update(status="Unknown", reason=STATUS_UNKNOWN_REASON, message=STATUS_UNKNOWN_MESSAGE,
                           lastTransitionTime=now)
            changed = True
    return conditions if changed else None


def decide_taints(node: Mapping[str, Any], now: str) -> list[JSON] | None:
    """The node's taints with this controller's set to what its Ready condition says (both effects
    of each; the others kept as they are, ``timeAdded`` kept for a taint already there); None when
    nothing changes."""
    taints: list[JSON] = list((node.get("spec") or {}).get("taints") or [])
    wanted = {(key, effect) for key in TAINTS_BY_READY.get(ready_status(node), ())
              for effect in ("NoSchedule", "NoExecute")}
    have = {(t.get("key"), t.get("effect")) for t in taints if t.get("key") in OWNED_TAINT_KEYS}
    if have == wanted:
        return None
    kept = [t for t in taints if t.get("key") not in OWNED_TAINT_KEYS or (t.get("key"), t.get("effect")) in wanted]
    # NoSchedule before NoExecute, as the real controller's two passes add them
    for key, effect in sorted(wanted - have, key=lambda ke: (ke[1] != "NoSchedule", ke[0])):
        kept.append({"key": key, "effect": effect, "timeAdded": now})
    return kept


def decide_pod_not_ready(pod: Mapping[str, Any], now: str) -> list[JSON] | None:
    """MarkPodsNotReady: a pod on an unreachable node gets Ready=False; None when it has no Ready
    condition or it is already False."""
    conditions = [dict(c) for c in (pod.get("status") or {}).get("conditions") or []]
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") == "False":
        return None
    ready.update(status="False", lastTransitionTime=now)
    return conditions


def build_not_ready_event(node_name: str, now: str, suffix: str) -> JSON:
    """The Event the real controller records (RecordNodeStatusChange: the node's uid is its name)."""
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{node_name}.{suffix}", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_name},
        "reason": "NodeNotReady", "message": f"Node {node_name} status is now: NodeNotReady",
        "source": {"component": EVENT_SOURCE}, "reportingComponent": EVENT_SOURCE, "reportingInstance": "",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1, "type": "Normal",
    }


def overdue(probes: Mapping[str, float], now: float, grace_period_s: float) -> list[str]:
    """Nodes whose last heartbeat was seen more than the grace period ago."""
    return sorted(name for name, seen in probes.items() if now - seen > grace_period_s)


# ---- the controller --------------------------------------------------------------------------


class NodeLifecycle:
    """Observes node and Lease writes (``on_write``, synchronous, from the engine) and runs the
    monitor pass every monitor period (or sooner when a node's Ready condition changes, so that
    its taints follow at once). ``clock`` is the controller's own (monotonic by default; tests
    pass one they advance)."""

    def __init__(self, engine: Engine, settings: NodeLifecycleSettings | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.settings = settings or NodeLifecycleSettings()
        self.clock = clock
        self.probes: dict[str, float] = {}
        """Node name -> our clock when its last heartbeat (Lease renewal or status) was seen."""
        self._renewals: dict[str, str] = {}
        self._heartbeats: dict[str, str] = {}
        self._ready: dict[str, str] = {}
        self._retaint: set[str] = set()
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def on_write(self, rt: ResourceType, entry: Entry, deleted: bool) -> None:
        if rt.key == "nodes":
            self._observe_node(entry.obj, deleted)
        elif rt.key == LEASE_KEY and entry.obj["metadata"].get("namespace") == NODE_LEASE_NAMESPACE and not deleted:
            name = entry.obj["metadata"]["name"]
            renewed = str((entry.obj.get("spec") or {}).get("renewTime") or "")
            if renewed and renewed != self._renewals.get(name) and name in self.probes:
                self._renewals[name] = renewed
                self.probes[name] = self.clock()

    def _observe_node(self, node: JSON, deleted: bool) -> None:
        name = node["metadata"]["name"]
        if deleted:
            for known in (self.probes, self._renewals, self._heartbeats, self._ready):
                known.pop(name, None)
            self._retaint.discard(name)
            return
        beat = status_heartbeat(node)
        if name not in self.probes or beat != self._heartbeats.get(name):
            self._heartbeats[name] = beat
            self.probes[name] = self.clock()
        ready = ready_status(node)
        if ready != self._ready.get(name):
            self._ready[name] = ready
            if decide_taints(node, "") is not None:
                self._retaint.add(name)
                self._kick.set()

    def bootstrap(self) -> None:
        """After a restart every node gets a full grace period, as kube-controller-manager's do."""
        nodes = self.engine.registry.by_key("nodes")
        leases = self.engine.registry.by_key(LEASE_KEY)
        for rt, rkey in ((nodes, "nodes"), (leases, LEASE_KEY)):
            if rt is not None:
                for entry in self.engine.store.items(rkey):
                    self.on_write(rt, entry, False)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="apiserver-node-lifecycle")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancellation that arrives as
            # the kick does, and stop() would wait forever on this loop
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.monitor_period_s):
                    await self._kick.wait()
            self._kick.clear()
            try:
                await self.monitor_pass()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("node lifecycle pass failed; retrying at the next period")

    async def monitor_pass(self) -> list[str]:
        """Mark the overdue nodes Unknown (returns them), then bring taints in line."""
        marked = []
        for name in overdue(self.probes, self.clock(), self.settings.grace_period_s):
            if await self._mark_unknown(name):
                marked.append(name)
        for name in sorted(self._retaint):
            self._retaint.discard(name)
            await self._update_taints(name)
        return marked

    def _current(self, name: str) -> Entry | None:
        return self.engine.store.get("nodes", "", name)

    async def _mark_unknown(self, name: str) -> bool:
        entry = self._current(name)
        nodes = self.engine.registry.by_key("nodes")
        if entry is None or nodes is None:
            return False
        now = self.engine.now()
        conditions = decide_conditions_unknown(entry.obj, now)
        if conditions is None:
            return False
        was_ready = ready_status(entry.obj) == "True"
        node = entry.clone()
        node.setdefault("status", {})["conditions"] = conditions
        try:
            await self.engine.update(nodes, "", name, node, Ctx(manager=MANAGER), subresource="status")
        except APIError as exc:
            log.warning("node lifecycle: cannot mark node %s unknown: %s", name, exc.message)
            return False
        log.info("node %s: no heartbeat for %.0fs: Ready=Unknown", name, self.settings.grace_period_s)
        self._ready[name] = "Unknown"
        await self._update_taints(name)
        if was_ready:
            await self._record_not_ready(name, now)
            await self._mark_pods_not_ready(name, now)
        return True

    async def _update_taints(self, name: str) -> None:
        entry = self._current(name)
        nodes = self.engine.registry.by_key("nodes")
        if entry is None or nodes is None:
            return
        taints = decide_taints(entry.obj, self.engine.now())
        if taints is None:
            return
        node = entry.clone()
        spec = node.setdefault("spec", {})
        if taints:
            spec["taints"] = taints
        else:
            spec.pop("taints", None)
        try:
            await self.engine.update(nodes, "", name, node, Ctx(manager=MANAGER))
        except APIError as exc:
            log.warning("node lifecycle: cannot update the taints of node %s: %s", name, exc.message)

    async def _record_not_ready(self, name: str, now: str) -> None:
        events = self.engine.registry.by_key("events")
        if events is None:
            return
        suffix = format(time.time_ns(), "x")
        with contextlib.suppress(APIError):
            await self.engine.create(events, "default", build_not_ready_event(name, now, suffix), Ctx(manager=MANAGER))

    async def _mark_pods_not_ready(self, name: str, now: str) -> None:
        pods = self.engine.registry.by_key("pods")
        if pods is None:
            return
        on_node: Sequence[Entry] = [e for e in self.engine.store.items("pods")
                                    if (e.obj.get("spec") or {}).get("nodeName") == name]
        for entry in on_node:
            conditions = decide_pod_not_ready(entry.obj, now)
            if conditions is None:
                continue
            pod = entry.clone()
            pod["status"]["conditions"] = conditions
            meta = pod["metadata"]
            with contextlib.suppress(APIError):
                await self.engine.update(pods, meta.get("namespace", ""), meta["name"], pod, Ctx(manager=MANAGER),
                                         subresource="status")


__all__ = [
    "DEFAULT_SETTINGS",
    "NOT_READY_TAINT",
    "UNREACHABLE_TAINT",
    "NodeLifecycle",
    "NodeLifecycleSettings",
    "decide_conditions_unknown",
    "decide_pod_not_ready",
    "decide_taints",
    "overdue",
]
