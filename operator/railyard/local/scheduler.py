"""The local cluster's scheduler: binds pending pods to nodes through pods/binding.

Runs only where the cluster has no scheduler of its own (embedded and envtest modes).
Watch-driven: the shared pod and node informers call :meth:`Scheduler.on_pod` and
:meth:`Scheduler.on_node`, which keep resource usage per node and queue pods that need a
decision; decisions are the pure rules of :mod:`railyard.local.scheduling`. A pod is "assumed"
on its node as soon as it is decided, so hundreds of bindings can be in flight at once without
overcommitting a node. Unschedulable pods wait until a node or a pod changes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from railyard.api.corev1 import compute_pod_requests
from railyard.local.kube import ApiError, KubeClient, Obj, key_of
from railyard.local.nodes import now_iso
from railyard.local.scheduling import (
    DecisionCache,
    NodeInfo,
    build_node_info,
    decide_node,
    is_gated,
    is_terminated,
)
from railyard.local.tasks import TaskSet

log = logging.getLogger(__name__)
SCHEDULER_NAMES = frozenset({"", "default-scheduler"})


class Scheduler:
    def __init__(self, client: KubeClient, pods: Mapping[str, Obj], *, concurrency: int = 48) -> None:
        self.client = client
        self.pods = pods  # the pod informer's cache, by "ns/name"
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
        previous = self.nodes.get(name)
        if previous is not None:
            info.requested = previous.requested
        else:  # new, or deleted and added again: count the pods already bound to it
            for on, requests in self.usage.values():
                if on == name:
                    info.add(requests)
        self.nodes[name] = info
        self._wake_waiting()

    def on_pod(self, kind: str, pod: Obj, old: Obj | None) -> None:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        uid = str(meta.get("uid", ""))
        key = key_of(pod)
        node = spec.get("nodeName")
        if kind == "DELETED" or is_terminated(pod):
            self.waiting.pop(key, None)
            if self._release(uid):
                self._wake_waiting()
            return
        if node:
            self.waiting.pop(key, None)
            if uid not in self.usage:
                self._account(uid, node, compute_pod_requests(pod))
            return
        if meta.get("deletionTimestamp") or is_gated(pod):
            return
        if (spec.get("schedulerName") or "") not in SCHEDULER_NAMES:
            return
        self._enqueue(key)

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
        pod = self.pods.get(key)
        if pod is None:
            self.waiting.pop(key, None)
            return
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        if spec.get("nodeName") or is_gated(pod) or meta.get("deletionTimestamp") or is_terminated(pod):
            return
        uid = str(meta.get("uid", ""))
        requests = compute_pod_requests(pod)
        self._start += 1
        decision = decide_node(pod, self.nodes, requests, start=self._start, cache=self.decisions)
        if decision.node is None:
            if self.waiting.get(key) != decision.message:
                self.waiting[key] = decision.message
                self._spawn(self._mark_unschedulable(pod, decision.message))
            return
        self.waiting.pop(key, None)
        self._account(uid, decision.node, requests)
        self.in_flight.add(key)
        self._spawn(self._bind(pod, decision.node))

    def _spawn(self, coro: Any) -> None:
        self._tasks.spawn(coro)

    async def _bind(self, pod: Obj, node: str) -> None:
        meta = pod.get("metadata") or {}
        ns, name, uid = meta.get("namespace", "default"), meta.get("name", ""), str(meta.get("uid", ""))
        key = f"{ns}/{name}"
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
                        await self.client.create(f"/api/v1/namespaces/{ns}/pods/{name}/binding", body)
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

    async def _mark_unschedulable(self, pod: Obj, message: str) -> None:
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
            }
        )
        stamp = now_iso()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": ns},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": ns, "uid": meta.get("uid", "")},
            "reason": "FailedScheduling",
            "message": message,
            "type": "Warning",
            "source": {"component": "railyard-local-scheduler"},
            "reportingComponent": "railyard-local-scheduler",
            "reportingInstance": "railyard-local",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.client.patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": {"conditions": conditions}})
            await self.client.create(f"/api/v1/namespaces/{ns}/events", event)
        except (ApiError, OSError, TimeoutError) as exc:
            log.debug("could not mark %s/%s unschedulable: %s", ns, name, exc)
