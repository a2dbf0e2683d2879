"""The local cluster's scheduler: binds pending pods to nodes through pods/binding.

Runs only where the cluster has no scheduler of its own (embedded and envtest modes).
Watch-driven: the shared pod and node informers call :meth:`Scheduler.on_pod` and
:meth:`Scheduler.on_node`, which keep resource usage per node and queue pods that need a
decision; decisions are the pure rules of :mod:`railyard_local.scheduling`. A pod is "assumed"
on its node as soon as it is decided, so hundreds of bindings can be in flight at once without
overcommitting a node. Unschedulable pods wait until a node or a pod changes.

Pods that name a PodGroup (``spec.schedulingGroup.podGroupName``, scheduling.k8s.io/v1alpha2)
are decided together, as kube-scheduler's gang scheduling does: nothing is bound until at least
``minCount`` of them are there and all of them fit at once inside one placement of the group's
topology constraint; then all are bound and the PodGroup's ``PodGroupScheduled`` condition says
so (``False``/``Unschedulable`` while they do not fit). A pod whose PodGroup does not exist
waits for it, unmarked. ``on_podgroup`` is fed by a PodGroup informer where the API serves them.

Pods that claim devices (``spec.resourceClaims``, resource.k8s.io/v1) wait until each of their
claims exists (``status.resourceClaimStatuses``, written by the API server's resourceclaim
controller); their devices count as requests of the node's published devices
(:mod:`railyard_local.devices`), and binding first writes each claim's ``status.allocation``
(free devices of the chosen node) and ``reservedFor`` the pod, as kube-scheduler's DRA plugin
does in PreBind. ``on_claim``, ``on_slice`` and ``on_device_class`` are fed by informers where
the API serves resource.k8s.io/v1.

A pod with a priority that fits nowhere preempts as kube-scheduler does
(:func:`railyard_local.scheduling.plan_preemption`): the fewest lower-priority pods of one node
get ``DisruptionTarget=True`` (reason ``PreemptionByScheduler``), a Preempted event and a graceful
delete; the pod is nominated to that node (``status.nominatedNodeName``) and bound once they are
gone. Unschedulable pods are worded as kube-scheduler words them, PostFilter verdicts included.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from railyard.api.corev1 import compute_pod_requests
from railyard_local.devices import (
    DELETE_PROTECTION,
    DEVICE_RESOURCE_PREFIX,
    RESOURCE_API,
    allocated_devices,
    build_allocation,
    claim_needs,
    node_devices,
)
from railyard_local.kube import ApiError, KubeClient, Obj, key_of
from railyard_local.nodes import now_iso, now_micro
from railyard_local.scheduling import (
    GANG_WAITING_MESSAGE,
    DecisionCache,
    GangDecision,
    NodeInfo,
    Resident,
    build_gang_policy,
    build_node_info,
    decide_gang,
    decide_node,
    group_name_of,
    is_gated,
    is_terminated,
    plan_preemption,
)
from railyard_local.tasks import TaskSet

log = logging.getLogger(__name__)
SCHEDULER_NAMES = frozenset({"", "default-scheduler"})
#: kube-scheduler reports as "default-scheduler-<host>"; this one is the local cluster's.
REPORTING_INSTANCE = "default-scheduler-railyard-local"
PODGROUPS = "/apis/scheduling.k8s.io/v1alpha2"
#: Why a pod waits while one of its claims is not made yet (it is not marked unschedulable for it).
CLAIM_NOT_MADE = "waiting for the pod's ResourceClaim"
#: Queue keys of PodGroups start with this (pods' keys are "ns/name").
GROUP = "podgroup:"


def _allocation_nodes(allocation: Obj, default: str) -> set[str]:
    """The nodes an allocation's ``nodeSelector`` names by ``metadata.name`` (the one form
    build_allocation writes); an allocation without one is usable anywhere (``default``)."""
    terms = ((allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or [])
    names = {str(v) for t in terms for f in t.get("matchFields") or []
             if f.get("key") == "metadata.name" and f.get("operator") == "In" for v in f.get("values") or []}
    return names or {default}


class Scheduler:
    def __init__(self, client: KubeClient, pods: Mapping[str, Obj], *, concurrency: int = 48,
                 podgroups: Mapping[str, Obj] | None = None, field_manager: str | None = None,
                 claims: Mapping[str, Obj] | None = None, slices: Mapping[str, Obj] | None = None,
                 device_classes: Mapping[str, Obj] | None = None) -> None:
        self.client = client
        # resource.k8s.io/v1 informers' caches (by "ns/name", slices and classes by "name")
        self.claims: Mapping[str, Obj] = claims if claims is not None else {}
        self.slices: Mapping[str, Obj] = slices if slices is not None else {}
        self.device_classes: Mapping[str, Obj] = device_classes if device_classes is not None else {}
        self.devices: dict[str, dict[str, list[str]]] = {}  # node -> driver -> device names
        self._node_slices: dict[str, dict[str, Obj]] = {}  # node -> slice key -> slice
        self._slice_node: dict[str, str] = {}  # slice key -> its node
        #: Devices chosen for claims whose allocation is being written: claim "ns/name" -> devices.
        self.allocating: dict[str, set[tuple[str, str, str]]] = {}
        self.pods = pods  # the pod informer's cache, by "ns/name"
        self.podgroups: Mapping[str, Obj] = podgroups if podgroups is not None else {}  # by "ns/name"
        self.members: dict[str, set[str]] = {}  # PodGroup "ns/name" -> keys of the pods that name it
        self.group_conditions: dict[str, tuple[str, str, str]] = {}  # PodGroup -> (status, reason, message)
        self.gang_marks: dict[str, str] = {}  # waiting gang pod key -> the reason its event gave
        self.preempting: dict[str, set[str]] = {}  # preemptor key -> keys of the pods it evicts
        self.field_manager = field_manager
        self.nodes: dict[str, NodeInfo] = {}
        self.usage: dict[str, tuple[str, dict[str, int]]] = {}  # uid -> (node, requests)
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.queued: set[str] = set()
        self.waiting: dict[str, str] = {}  # unschedulable pod key -> last message
        self.in_flight: set[str] = set()
        self.decisions = DecisionCache()
        self.bound_count = 0
        self._start = 0
        self._sem = asyncio.Semaphore(concurrency)
        self._tasks = TaskSet("scheduler")

    # --- informer handlers (sync, quick) ---
    def on_node(self, kind: str, node: Obj, old: Obj | None) -> None:
        name = (node.get("metadata") or {}).get("name", "")
        if kind == "DELETED":
            self.nodes.pop(name, None)
            return
        info = build_node_info(node)
        self._add_devices(info)
        previous = self.nodes.get(name)
        if previous is not None:
            info.requested = previous.requested
        else:  # new, or deleted and added again: count the pods already bound to it
            for on, requests in self.usage.values():
                if on == name:
                    info.add(requests)
        self.nodes[name] = info
        self._wake_waiting()

    def on_slice(self, kind: str, piece: Obj, old: Obj | None) -> None:
        """Only the slice's node (and the one it named before) is counted again."""
        key = key_of(piece)
        touched = set()
        before = self._slice_node.pop(key, None)
        if before is not None:
            self._node_slices.get(before, {}).pop(key, None)
            touched.add(before)
        node = str((piece.get("spec") or {}).get("nodeName") or "")
        if kind != "DELETED" and node:
            self._node_slices.setdefault(node, {})[key] = piece
            self._slice_node[key] = node
            touched.add(node)
        for name in touched:
            self.devices[name] = node_devices(self._node_slices.get(name, {}).values()).get(name, {})
            info = self.nodes.get(name)
            if info is not None:
                self._add_devices(info)
        self._wake_waiting()

    def on_device_class(self, kind: str, device_class: Obj, old: Obj | None) -> None:
        self._wake_waiting()

    def on_claim(self, kind: str, claim: Obj, old: Obj | None) -> None:
        key = key_of(claim)
        if kind == "DELETED" or (claim.get("status") or {}).get("allocation"):
            self.allocating.pop(key, None)
        allocated_now = bool((claim.get("status") or {}).get("allocation")) and \
            not ((old or {}).get("status") or {}).get("allocation")
        if kind == "DELETED" or not (old or {}).get("metadata") or allocated_now:
            self._wake_waiting()  # devices freed, a claim a pod waits for is there, or a shared one allocated

    def _add_devices(self, info: NodeInfo) -> None:
        for key in [k for k in info.allocatable if k.startswith(DEVICE_RESOURCE_PREFIX)]:
            del info.allocatable[key]
        for driver, names in self.devices.get(info.name, {}).items():
            info.allocatable[DEVICE_RESOURCE_PREFIX + driver] = 1000 * len(names)
        info.version += 1

    def _pod_claims(self, pod: Obj) -> tuple[list[Obj], str]:
        """The pod's ResourceClaims, or a reason to wait: one not made (or not seen) yet."""
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        ns = (pod.get("metadata") or {}).get("namespace", "default")
        made = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []}
        out: list[Obj] = []
        for c in spec.get("resourceClaims") or []:
            name = c.get("resourceClaimName") or made.get(c.get("name"))
            claim = self.claims.get(f"{ns}/{name}") if name else None
            if claim is None:
                return [], f'{CLAIM_NOT_MADE} "{c.get("name")}" to be created'
            out.append(claim)
        return out, ""

    def _requests(self, pod: Obj) -> tuple[dict[str, int] | None, str]:
        """The pod's requests, its claims' devices included (None with a reason to wait)."""
        requests = compute_pod_requests(pod)
        if not (pod.get("spec") or {}).get("resourceClaims"):
            return requests, ""
        claims, why = self._pod_claims(pod)
        if why:
            return None, why
        for claim in claims:
            needs, problem = claim_needs(claim, self.device_classes)
            if problem is not None:
                return None, problem
            for k, v in needs.items():
                requests[k] = requests.get(k, 0) + v
        return requests, ""

    def _allocate(self, pod: Obj, node: str) -> list[tuple[Obj, dict[str, Any]]] | None:
        """Devices of ``node`` for each of the pod's unallocated claims (held at once, so that
        decisions in flight never hand out a device twice); None when too few are free."""
        claims, why = self._pod_claims(pod)
        if why:
            return None
        held = allocated_devices(self.claims.values())
        for devices in self.allocating.values():
            held |= devices
        out: list[tuple[Obj, dict[str, Any]]] = []
        for claim in claims:
            allocated = (claim.get("status") or {}).get("allocation")
            if allocated:  # shared and allocated already: usable on its node only, then reserved for this pod too
                if node not in _allocation_nodes(allocated, node):
                    return None
                out.append((claim, {}))
                continue
            if key_of(claim) in self.allocating:
                return None  # another pod's allocation of this claim is being written: wait for it
            allocation = build_allocation(claim, node, self.device_classes, self.devices.get(node, {}), held)
            if allocation is None:
                return None
            chosen = {(r["driver"], r["pool"], r["device"]) for r in allocation["devices"]["results"]}
            held |= chosen
            out.append((claim, allocation))
        for claim, allocation in out:
            if allocation:
                self.allocating[key_of(claim)] = {(r["driver"], r["pool"], r["device"])
                                                  for r in allocation["devices"]["results"]}
        return out

    def on_podgroup(self, kind: str, group: Obj, old: Obj | None) -> None:
        key = key_of(group)
        if kind == "DELETED":
            self.group_conditions.pop(key, None)
        self._enqueue(GROUP + key)

    def on_pod(self, kind: str, pod: Obj, old: Obj | None) -> None:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        uid = str(meta.get("uid", ""))
        key = key_of(pod)
        node = spec.get("nodeName")
        group = group_name_of(pod)
        group_key = f"{meta.get('namespace', 'default')}/{group}" if group else None
        if group_key is not None:
            if kind == "DELETED":
                self.members.get(group_key, set()).discard(key)
            else:
                self.members.setdefault(group_key, set()).add(key)
        if kind == "DELETED" or is_terminated(pod) or node:
            self.gang_marks.pop(key, None)
            self.preempting.pop(key, None)
        if kind == "DELETED" or is_terminated(pod):
            self.waiting.pop(key, None)
            if self._release(uid):
                self._wake_waiting()
            return
        if node:
            self.waiting.pop(key, None)
            if uid not in self.usage:
                self._account(uid, node, self._requests(pod)[0] or compute_pod_requests(pod))
            return
        if meta.get("deletionTimestamp") or is_gated(pod):
            return
        if (spec.get("schedulerName") or "") not in SCHEDULER_NAMES:
            return
        self._enqueue(GROUP + group_key if group_key is not None else key)

    # --- bookkeeping ---
    def _account(self, uid: str, node: str, requests: dict[str, int]) -> None:
        self.usage[uid] = (node, requests)
        info = self.nodes.get(node)
        if info is not None:
            info.add(requests)

    def _release(self, uid: str) -> bool:
        entry = self.usage.pop(uid, None)
        if entry is None:
            return False
        info = self.nodes.get(entry[0])
        if info is not None:
            info.add(entry[1], sign=-1)
        return True

    def _enqueue(self, key: str) -> None:
        if key not in self.queued and key not in self.in_flight:
            self.queued.add(key)
            self.queue.put_nowait(key)

    def _wake_waiting(self) -> None:
        for key in list(self.waiting):
            self._enqueue(key)

    # --- the loop ---
    async def run(self) -> None:
        while True:
            key = await self.queue.get()
            self.queued.discard(key)
            try:
                self._schedule_one(key)
            except Exception:
                log.exception("scheduling %s failed; it waits for the next change", key)
                self.waiting[key] = "scheduler error"
            if self.queue.empty():
                await asyncio.sleep(0)

    def _schedule_one(self, key: str) -> None:
        if key.startswith(GROUP):
            self._schedule_group(key)
            return
        pod = self.pods.get(key)
        if pod is None:
            self.waiting.pop(key, None)
            return
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        if spec.get("nodeName") or is_gated(pod) or meta.get("deletionTimestamp") or is_terminated(pod):
            return
        uid = str(meta.get("uid", ""))
        requests, why = self._requests(pod)
        if requests is None:
            self._unschedulable(key, pod, why)
            return
        self._start += 1
        decision = decide_node(pod, self.nodes, requests, start=self._start, cache=self.decisions)
        if decision.node is None:
            if not self._preempt(key, pod, requests, decision.message):
                self._unschedulable(key, pod, f"{decision.message} {decision.postfilter}".strip())
            return
        allocations = self._allocate(pod, decision.node)
        if allocations is None:
            self._unschedulable(key, pod, "cannot allocate all claims")
            return
        self.waiting.pop(key, None)
        self._account(uid, decision.node, requests)
        self.in_flight.add(key)
        self._spawn(self._bind(pod, decision.node, allocations))

    def _preempt(self, key: str, pod: Obj, requests: dict[str, int], message: str) -> bool:
        """kube-scheduler's preemption (scheduling.plan_preemption): lower-priority pods of one
        node get DisruptionTarget=True (PreemptionByScheduler), a Preempted event and a graceful
        delete; the pod is nominated to the node and waits for them to go. Whether it did (or
        still waits for earlier victims)."""
        victims_left = [v for v in self.preempting.get(key, ()) if v in self.pods]
        if victims_left:
            return True
        self.preempting.pop(key, None)
        if not (pod.get("spec") or {}).get("priority"):
            return False  # priority 0 (the default) has nobody below it but negative priorities: not worth a scan
        residents: dict[str, list[Resident]] = {}
        for other in self.pods.values():
            node = (other.get("spec") or {}).get("nodeName")
            ometa = other.get("metadata") or {}
            if not node or is_terminated(other):
                continue
            used = self.usage.get(str(ometa.get("uid", "")))
            residents.setdefault(node, []).append(Resident(
                key_of(other), int((other.get("spec") or {}).get("priority") or 0),
                used[1] if used is not None else compute_pod_requests(other), bool(ometa.get("deletionTimestamp"))))
        plan = plan_preemption(pod, requests, self.nodes, residents)
        if plan is None:
            return False
        node, victims = plan
        self.preempting[key] = set(victims)
        self.waiting[key] = message
        self._spawn(self._preempt_victims(pod, node, [self.pods[v] for v in victims if v in self.pods], message))
        return True

    async def _preempt_victims(self, pod: Obj, node: str, victims: list[Obj], message: str) -> None:
        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace", "default"), meta.get("name", "")
        try:
            for victim in victims:
                vmeta = victim.get("metadata") or {}
                vns, vname = vmeta.get("namespace", "default"), vmeta.get("name", "")
                conditions = [c for c in (victim.get("status") or {}).get("conditions") or []
                              if c.get("type") != "DisruptionTarget"]
                conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                                   "message": "default-scheduler: preempting to accommodate a higher priority pod",
                                   "lastTransitionTime": now_iso(), "lastProbeTime": None,
                                   "observedGeneration": vmeta.get("generation", 1)})
                await self.client.request("PATCH", f"/api/v1/namespaces/{vns}/pods/{vname}/status",
                                          params=self._params(), body={"status": {"conditions": conditions}},
                                          content_type="application/merge-patch+json")
                await self.client.request("POST", f"/apis/events.k8s.io/v1/namespaces/{vns}/events",
                                          params=self._params(), body=self._event(
                                              victim, "Preempted", "Preempting", "Normal",
                                              f"Preempted by pod {meta.get('uid', '')} on node {node}"))
                await self.client.request("DELETE", f"/api/v1/namespaces/{vns}/pods/{vname}")
            await self._mark_unschedulable(pod, message, message)
            await self.client.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", params=self._params(),
                                      body={"status": {"nominatedNodeName": node}},
                                      content_type="application/merge-patch+json")
        except (ApiError, OSError, TimeoutError) as exc:
            log.warning("preempting for %s/%s on %s failed: %s", ns, name, node, exc)

    @staticmethod
    def _event(pod: Obj, reason: str, action: str, kind: str, note: str) -> dict[str, Any]:
        """An events.k8s.io/v1 Event about ``pod``, as kube-scheduler writes them."""
        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace", "default"), meta.get("name", "")
        return {"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"generateName": f"{name}.", "namespace": ns},
                "regarding": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": ns,
                              "uid": meta.get("uid", ""), "resourceVersion": meta.get("resourceVersion", "")},
                "reason": reason, "action": action, "note": note, "type": kind,
                "reportingController": "default-scheduler", "reportingInstance": REPORTING_INSTANCE,
                "eventTime": now_micro()}

    def _unschedulable(self, key: str, pod: Obj, message: str) -> None:
        if self.waiting.get(key) != message:
            self.waiting[key] = message
            if not message.startswith(CLAIM_NOT_MADE):  # kcm makes it in moments: kube-scheduler waits unmarked
                self._spawn(self._mark_unschedulable(pod, message, message))

    def _pending(self, pod: Obj | None) -> bool:
        if pod is None:
            return False
        spec = pod.get("spec") or {}
        return not (spec.get("nodeName") or is_gated(pod) or (pod.get("metadata") or {}).get("deletionTimestamp")
                    or is_terminated(pod) or (spec.get("schedulerName") or "") not in SCHEDULER_NAMES)

    def _schedule_group(self, queue_key: str) -> None:
        """All of a PodGroup's pending pods, or none (see the module docstring)."""
        gkey = queue_key.removeprefix(GROUP)
        name = gkey.split("/", 1)[1]
        keys = self.members.get(gkey, set())
        pending: dict[str, Obj] = {}
        placed: list[str] = []  # nodes of the group's pods that are bound or assumed (binding in flight)
        for k in sorted(keys):
            pod = self.pods.get(k)
            if pod is None or is_terminated(pod):
                continue
            node = (pod.get("spec") or {}).get("nodeName")
            assumed = self.usage.get(str((pod.get("metadata") or {}).get("uid", "")))
            if node or assumed is not None or k in self.in_flight:
                placed.append(str(node or (assumed[0] if assumed else "")))
            elif self._pending(pod):
                pending[k] = pod
        if not pending:
            self.waiting.pop(queue_key, None)
            return
        group = self.podgroups.get(gkey)
        if group is None:  # kube-scheduler writes nothing either (tests/golden 020: orphan-0)
            self.waiting[queue_key] = f'PodGroup "{name}" not found: its pods wait for it'
            return
        policy = build_gang_policy(group)
        if policy.min_count is None:  # basic: each pod on its own
            for k in pending:
                self._schedule_one(k)
            return
        if len(placed) + len(pending) < policy.min_count:
            self._wait(queue_key, pending, GANG_WAITING_MESSAGE, GANG_WAITING_MESSAGE)
            return
        nodes: Mapping[str, NodeInfo] = self.nodes
        if placed and policy.topology_keys:  # the rest of a gang joins its domain
            first = self.nodes.get(placed[0])
            values = {k: (first.labels.get(k) if first else None) for k in policy.topology_keys}
            nodes = {n: i for n, i in self.nodes.items() if all(i.labels.get(k) == v for k, v in values.items())}
        requests: dict[str, dict[str, int]] = {}
        for k, pod in pending.items():
            wants, why = self._requests(pod)
            if wants is None:
                self._wait(queue_key, pending, GANG_WAITING_MESSAGE, why)
                return
            requests[k] = wants
        decision = decide_gang(pending, nodes, policy, requests)
        allocations: dict[str, list[tuple[Obj, dict[str, Any]]]] = {}
        for k, node in decision.nodes.items():
            got = self._allocate(pending[k], node)
            if got is None:  # fewer free devices than counted: give back what was chosen, wait
                for claims in allocations.values():
                    for claim, _ in claims:
                        self.allocating.pop(key_of(claim), None)
                decision = GangDecision(
                    group_message="cannot allocate all claims", pod_message="cannot allocate all claims"
                )
                break
            allocations[k] = got
        if not decision.nodes:
            self._wait(queue_key, pending, GANG_WAITING_MESSAGE, decision.pod_message)
            self._set_group_condition(gkey, ("False", "Unschedulable", decision.group_message))
            return
        self.waiting.pop(queue_key, None)
        for k, node in decision.nodes.items():
            pod = pending[k]
            self._account(str((pod.get("metadata") or {}).get("uid", "")), node, requests[k])
            self.in_flight.add(k)
            self._spawn(self._bind(pod, node, allocations.get(k, [])))
        self._set_group_condition(gkey, ("True", "Scheduled", ""))

    def _wait(self, queue_key: str, pods: Mapping[str, Obj], condition: str, event: str) -> None:
        """The gang waits: each of its pods says why, once per change of the reason."""
        self.waiting[queue_key] = event
        for key, pod in pods.items():
            if self.gang_marks.get(key) != event:
                self.gang_marks[key] = event
                self._spawn(self._mark_unschedulable(pod, condition, event))

    def _set_group_condition(self, gkey: str, cond: tuple[str, str, str]) -> None:
        group = self.podgroups.get(gkey)
        if group is None:
            return
        known = self.group_conditions.get(gkey)
        if known is None:
            for c in (group.get("status") or {}).get("conditions") or []:
                if c.get("type") == "PodGroupScheduled":
                    known = (str(c.get("status")), str(c.get("reason")), str(c.get("message") or ""))
        if known == cond:
            return
        self.group_conditions[gkey] = cond
        self._spawn(self._write_group_condition(gkey, cond))

    async def _write_group_condition(self, gkey: str, cond: tuple[str, str, str]) -> None:
        ns, name = gkey.split("/", 1)
        status, reason, message = cond
        body = {"status": {"conditions": [{"type": "PodGroupScheduled", "status": status, "reason": reason,
                                           "message": message, "lastTransitionTime": now_iso()}]}}
        try:
            await self.client.request("PATCH", f"{PODGROUPS}/namespaces/{ns}/podgroups/{name}/status",
                                      params=self._params(), body=body, content_type="application/merge-patch+json")
        except (ApiError, OSError, TimeoutError) as exc:
            log.debug("could not write the status of PodGroup %s: %s", gkey, exc)
            self.group_conditions.pop(gkey, None)

    def _params(self) -> dict[str, str] | None:
        return {"fieldManager": self.field_manager} if self.field_manager else None

    def _spawn(self, coro: Any) -> None:
        self._tasks.spawn(coro)

    async def _write_allocations(self, pod: Obj, node: str, allocations: list[tuple[Obj, dict[str, Any]]]) -> None:
        """PreBind of kube-scheduler's DRA plugin, after nominating ``node`` for the pod (as
        kube-scheduler does when PreBind has work): each claim protected by the delete-protection
        finalizer (its own write, as kube-scheduler does it), then allocated (``allocationTimestamp``
        included) and reserved for the pod in one status write; a claim allocated already (shared)
        only gains the pod in ``reservedFor``."""
        meta = pod.get("metadata") or {}
        me = {"resource": "pods", "name": meta.get("name", ""), "uid": meta.get("uid", "")}
        # kube-scheduler nominates the node first when PreBind has work to do (binding clears it)
        await self.client.request(
            "PATCH", f"/api/v1/namespaces/{meta.get('namespace', 'default')}/pods/{meta.get('name', '')}/status",
            params=self._params(), body={"status": {"nominatedNodeName": node}},
            content_type="application/merge-patch+json")
        for claim, allocation in allocations:
            cmeta = claim.get("metadata") or {}
            path = f"{RESOURCE_API}/namespaces/{cmeta.get('namespace')}/resourceclaims/{cmeta.get('name')}"
            if not allocation:
                await self._reserve(path, me)
                continue
            finalizers = list(cmeta.get("finalizers") or [])
            if DELETE_PROTECTION not in finalizers:
                await self.client.request("PATCH", path, params=self._params(),
                                          content_type="application/merge-patch+json",
                                          body={"metadata": {"finalizers": [*finalizers, DELETE_PROTECTION]}})
            body = {"status": {"allocation": {**allocation, "allocationTimestamp": now_iso()}, "reservedFor": [me]}}
            await self.client.request("PATCH", f"{path}/status", params=self._params(), body=body,
                                      content_type="application/merge-patch+json")

    async def _reserve(self, path: str, me: dict[str, Any]) -> None:
        """Add the pod to an allocated claim's ``reservedFor`` (read, then written with the read's
        resourceVersion: two pods sharing the claim may reserve it at once)."""
        for _ in range(5):
            claim = await self.client.request("GET", path)
            status = claim.get("status") or {}
            reserved = list(status.get("reservedFor") or [])
            if any(r.get("uid") == me["uid"] for r in reserved):
                return
            body = {"metadata": {"resourceVersion": (claim.get("metadata") or {}).get("resourceVersion")},
                    "status": {"reservedFor": [*reserved, me]}}
            try:
                await self.client.request("PATCH", f"{path}/status", params=self._params(), body=body,
                                          content_type="application/merge-patch+json")
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise
        raise ApiError(409, "the claim kept changing", "PATCH", f"{path}/status")

    async def _bind(self, pod: Obj, node: str, allocations: list[tuple[Obj, dict[str, Any]]] | None = None) -> None:
        meta = pod.get("metadata") or {}
        ns, name, uid = meta.get("namespace", "default"), meta.get("name", ""), str(meta.get("uid", ""))
        key = f"{ns}/{name}"
        if allocations:
            try:
                await self._write_allocations(pod, node, allocations)
            except (ApiError, OSError, TimeoutError) as exc:
                log.warning("allocating the claims of %s on %s failed: %s", key, node, exc)
                for claim, _ in allocations:
                    self.allocating.pop(key_of(claim), None)
                self._release(uid)
                self.in_flight.discard(key)
                await asyncio.sleep(1.0)
                self._enqueue(key)
                return
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": ns, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        retry_later = False
        try:
            async with self._sem:
                for attempt in range(5):
                    try:
                        await self.client.create(f"/api/v1/namespaces/{ns}/pods/{name}/binding", body, answer=False)
                        self.bound_count += 1
                        return
                    except ApiError as exc:
                        if exc.status in (404, 409, 400, 422):
                            # gone, already bound, or gated meanwhile: the pod's next event decides
                            self._release(uid)
                            if exc.status in (400, 422):
                                log.warning("binding %s to %s refused: %s", key, node, exc)
                            return
                        if exc.status < 500 and exc.status != 429:
                            raise
                    except (OSError, TimeoutError) as exc:
                        log.debug("binding %s: %r", key, exc)
                    await asyncio.sleep(0.05 * 2**attempt)
                self._release(uid)
                retry_later = True
        except Exception as exc:
            log.warning("binding %s to %s failed: %s", key, node, exc)
            self._release(uid)
            retry_later = True
        finally:
            self.in_flight.discard(key)
        if retry_later:
            await asyncio.sleep(1.0)
            self._enqueue(key)

    async def _mark_unschedulable(self, pod: Obj, message: str, note: str) -> None:
        """The pod's PodScheduled=False condition (``message``) and a FailedScheduling event
        (``note``), written as kube-scheduler writes them (an events.k8s.io/v1 Event)."""
        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace", "default"), meta.get("name", "")
        conditions = [
            c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") != "PodScheduled"
        ]
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": now_iso(),
                "lastProbeTime": None,
                "observedGeneration": meta.get("generation", 1),
            }
        )
        event = self._event(pod, "FailedScheduling", "Scheduling", "Warning", note)
        try:
            await self.client.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", params=self._params(),
                                      body={"status": {"conditions": conditions}},
                                      content_type="application/merge-patch+json")
            await self.client.request("POST", f"/apis/events.k8s.io/v1/namespaces/{ns}/events",
                                      params=self._params(), body=event)
        except (ApiError, OSError, TimeoutError) as exc:
            log.debug("could not mark %s/%s unschedulable: %s", ns, name, exc)


async def serves_podgroups(client: KubeClient) -> bool:
    """Whether the API server serves PodGroups (kube-apiserver only with the GenericWorkload gate)."""
    try:
        found = await client.get(PODGROUPS)
    except (ApiError, OSError, TimeoutError):
        return False
    return any(r.get("name") == "podgroups" for r in found.get("resources") or [])


async def serves_dra(client: KubeClient) -> bool:
    """Whether the API server serves resource.k8s.io/v1 ResourceClaims (Kubernetes >= 1.34)."""
    try:
        found = await client.get(RESOURCE_API)
    except (ApiError, OSError, TimeoutError):
        return False
    return any(r.get("name") == "resourceclaims" for r in found.get("resources") or [])
