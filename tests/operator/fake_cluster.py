"""An in-memory cluster behind the reconcile cycle's I/O seam (railyard.handlers.cycle.GangIO),
and a harness that drives railyard.handlers.reconcile.reconcile_job in-process with a clock the
test controls. The fake keeps what a real API server would: pods (gated, bound when the gates
lift, Terminating after a graceful delete), ConfigMaps, Secrets, Services, PodGroups, Events,
the job's status (merge patches) and node quarantine patches; it fills the kopf indexes the
runtime reads."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from tests.operator.fake_kueue import FakeKueue

from railyard.api.trainingjob import TrainingJobStatus
from railyard.handlers.reconcile import reconcile_job
from railyard.handlers.runtime import JobWorker, OperatorSettings, Runtime
from railyard.k8s.client import ApiError
from railyard.logic.conditions import format_time
from railyard.logic.manifests import (
    ATTEMPT_LABEL,
    CLEANUP_LABEL,
    CONFIG_FILE,
    GANG_GATE,
    JOB_LABEL,
    POD_INDEX_LABEL,
    RANK_TABLE_FILE,
    SPARE_LABEL,
    configmap_name,
)
from railyard.logic.quarantine import apply_merge_patch, build_quarantine_patch
from railyard.protocol.ranktable import RankTable

Obj = Mapping[str, Any]


def _pinned_node(pod: Obj) -> str:
    terms = (((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms") or []
    for term in terms:
        for expr in term.get("matchFields") or ():
            if expr.get("key") == "metadata.name":
                return str(expr["values"][0])
    return ""


class FakeCluster:
    """GangIO on dicts. ``calls`` records every write, in order, as (verb, what)."""

    def __init__(self, nodes: Iterable[dict[str, Any]], *, clock: Any = None, kueue: FakeKueue | None = None) -> None:
        self.nodes: dict[str, dict[str, Any]] = {n["metadata"]["name"]: copy.deepcopy(n) for n in nodes}
        self.pods: dict[str, dict[str, Any]] = {}
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[tuple[str, str, str]] = []
        self.status: dict[str, Any] = {}
        self.finalizers: list[str] = []
        self.calls: list[tuple[str, str]] = []
        self.podgroup_error: int | None = None
        #: (status, Status body, pods created before the refusal): the API server refuses pods
        self.pod_create_error: tuple[int, dict[str, Any], int] | None = None
        #: kind -> (status, Status body): the API server refuses creating objects of that kind
        self.create_errors: dict[str, tuple[int, dict[str, Any]]] = {}
        self.clock = clock
        self.tokens = 0
        #: False: the scheduler binds nothing (pods stay Pending without a node, as when it refuses)
        self.scheduler_binds = True
        #: What discovery says of scheduling.k8s.io/v1alpha2 Workloads and PodGroups
        self.workload_api = False
        #: Kueue (tests/operator/fake_kueue.py; shared between clusters for jobs sharing a quota)
        self.kueue = kueue if kueue is not None else FakeKueue()
        #: (workload class?, name) -> value: PriorityClasses and Kueue's WorkloadPriorityClasses
        self.priority_classes: dict[tuple[bool, str], int] = {}

    # -- what the runtime's kopf indexes would hold
    def bind(self, rt: Runtime) -> None:
        job_pods: dict[tuple[str, str], list[dict[str, Any]]] = {}
        bound: dict[str, list[dict[str, Any]]] = {}
        from railyard.handlers.kopf_handlers import compact_pod

        for p in self.pods.values():
            meta = p["metadata"]
            # what kopf's index holds: the compact copy (no annotations, no env, no volumes); only
            # pods with the job label (kopf_handlers.railyard_job_pods), any pod once bound
            job = (meta.get("labels") or {}).get(JOB_LABEL)
            if job is not None:
                job_pods.setdefault((meta["namespace"], job), []).append(compact_pod(copy.deepcopy(p)))
            node = (p.get("spec") or {}).get("nodeName")
            if node:  # finished pods too, as the operator's index keeps them (with their phase)
                bound.setdefault(node, []).append(compact_pod(copy.deepcopy(p)))
        rt.job_pods = job_pods
        rt.bound_pods = bound
        rt.nodes = {name: [copy.deepcopy(n)] for name, n in self.nodes.items()}

    # -- GangIO
    async def create_object(self, obj: Obj) -> bool:
        key = (str(obj["kind"]), str(obj["metadata"]["name"]))
        if key[0] in self.create_errors:
            status, body = self.create_errors[key[0]]
            raise ApiError(status, body, "POST", f"/api/v1/namespaces/{obj['metadata']['namespace']}/{key[0].lower()}s")
        if key in self.objects:
            return False
        self.objects[key] = copy.deepcopy(dict(obj))
        self.calls.append(("create", f"{key[0]}/{key[1]}"))
        return True

    async def create_pods(self, pods: Sequence[Obj]) -> int:
        new = 0
        for i, p in enumerate(pods):
            name = p["metadata"]["name"]
            if self.pod_create_error is not None and i >= self.pod_create_error[2]:
                status, body, _ = self.pod_create_error
                raise ApiError(status, {**body, "details": {"name": name, "kind": "pods"}}, "POST", f"/api/v1/namespaces/{p['metadata']['namespace']}/pods")
            if name in self.pods:
                continue
            pod = copy.deepcopy(dict(p))
            pod.setdefault("status", {})["phase"] = "Pending"
            if not pod["spec"].get("schedulingGates") and self.scheduler_binds:
                pod["spec"]["nodeName"] = _pinned_node(pod)  # the scheduler binds ungated pods at once
            self.pods[name] = pod
            self.calls.append(("create", f"Pod/{name}"))
            new += 1
        return new

    async def lift_gates(self, pods: Sequence[Obj]) -> int:
        lifted = 0
        for p in pods:
            pod = self.pods.get(p["metadata"]["name"])
            if pod is None:
                continue
            gates = pod["spec"].get("schedulingGates") or []
            if any(g.get("name") == GANG_GATE for g in gates):
                pod["spec"]["schedulingGates"] = [g for g in gates if g.get("name") != GANG_GATE]
                if self.scheduler_binds:
                    pod["spec"]["nodeName"] = _pinned_node(pod)  # the scheduler binds where we pinned
                lifted += 1
        if lifted:
            self.calls.append(("lift", f"{lifted} gates"))
        return lifted

    async def delete_pods(self, namespace: str, names: Iterable[str], *, grace_seconds: int | None = None) -> int:
        n = 0
        for name in names:
            pod = self.pods.get(name)
            if pod is None:
                continue
            self.calls.append(("delete", f"Pod/{name}" + (" force" if grace_seconds == 0 else "")))
            if grace_seconds == 0:
                del self.pods[name]
            else:
                pod["metadata"]["deletionTimestamp"] = format_time(self.clock() if self.clock else 0.0)
            n += 1
        return n

    def finish_deletions(self) -> None:
        """The kubelets confirm every graceful deletion."""
        for name in [n for n, p in self.pods.items() if p["metadata"].get("deletionTimestamp")]:
            del self.pods[name]

    async def delete_owned(self, namespace: str, job: str) -> None:
        self.calls.append(("delete", f"owned by {job}"))
        self.pods = {n: p for n, p in self.pods.items() if p["metadata"]["labels"].get(JOB_LABEL) != job}
        self.objects.clear()

    async def delete_configmaps(self, namespace: str, names: Iterable[str]) -> None:
        for name in names:
            if self.objects.pop(("ConfigMap", name), None) is not None:
                self.calls.append(("delete", f"ConfigMap/{name}"))

    async def ensure_disruption_budget(self, budget: Obj) -> str:
        key = ("PodDisruptionBudget", str(budget["metadata"]["name"]))
        current = self.objects.get(key)
        if current is not None and current.get("spec") == budget.get("spec"):
            return "kept"
        self.objects.pop(key, None)
        await self.create_object(budget)
        return "created" if current is None else "replaced"

    async def create_podgroups(self, objects: Sequence[Obj]) -> int:
        if self.podgroup_error is not None:
            raise ApiError(self.podgroup_error, {"reason": "NotFound", "message": "the server could not find the requested resource"}, "POST", "/apis/podgroups")
        return sum([await self.create_object(o) for o in objects])

    async def delete_podgroups(self, namespace: str, api_version: str, names: Iterable[str]) -> int:
        gone = [self.objects.pop((kind, name), None) for name in names for kind in ("PodGroup", "Workload")]
        return sum(1 for o in gone if o is not None)

    async def serves_workload_api(self) -> bool:
        self.calls.append(("discover", "scheduling.k8s.io/v1alpha2"))
        return self.workload_api

    async def read_podgroup_condition(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("read", f"PodGroup/{name}"))
        group = self.objects.get(("PodGroup", name)) or {}
        return next((dict(c) for c in (group.get("status") or {}).get("conditions") or () if c.get("type") == "PodGroupScheduled"), None)

    async def read_rank_table(self, namespace: str, job: str, attempt: int) -> RankTable | None:
        cm = self.objects.get(("ConfigMap", configmap_name(job, attempt)))
        if cm is None:
            return None
        return RankTable.from_json(cm["data"][RANK_TABLE_FILE])

    async def read_attempt_config(self, namespace: str, job: str, attempt: int) -> dict[str, Any] | None:
        cm = self.objects.get(("ConfigMap", configmap_name(job, attempt)))
        return None if cm is None else dict(json.loads(cm["data"][CONFIG_FILE]))

    async def read_token(self, namespace: str, job: str) -> str | None:
        secret = self.objects.get(("Secret", f"{job}-heartbeat"))
        return base64.b64decode(secret["data"]["token"]).decode() if secret else None

    async def ensure_secret(self, secret: Obj) -> str:
        await self.create_object(secret)
        stored = self.objects[("Secret", secret["metadata"]["name"])]
        return base64.b64decode(stored["data"]["token"]).decode()

    def new_token(self) -> str:
        self.tokens += 1
        return f"token-{self.tokens}"

    async def quarantine_node(self, node: str, *, reason: str, job: str, now: float) -> bool:
        if node not in self.nodes:
            return False
        self.nodes[node] = apply_merge_patch(self.nodes[node], build_quarantine_patch(self.nodes[node], reason=reason, job=job, time=format_time(now)))
        self.calls.append(("quarantine", node))
        return True

    async def release_node(self, node: str) -> bool:
        self.calls.append(("release", node))
        return True

    async def patch_job_status(self, namespace: str, name: str, status_patch: Obj) -> dict[str, Any] | None:
        self.status = apply_merge_patch(self.status, status_patch)
        self.calls.append(("status", ",".join(sorted(status_patch))))
        return {"status": self.status}

    async def patch_job_finalizers(self, namespace: str, name: str, finalizers: Sequence[str], resource_version: str | None) -> bool:
        self.finalizers = list(finalizers)
        self.calls.append(("finalizers", ",".join(finalizers)))
        return True

    async def create_event(self, involved: Obj, *, type_: str, reason: str, message: str, now: float) -> None:
        self.events.append((type_, reason, message))

    # -- what kubelets and nodes do
    async def read_kueue_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        got = self.kueue.workloads.get((namespace, name))
        return copy.deepcopy(got) if got is not None else None

    async def create_kueue_workload(self, workload: Obj) -> bool:
        created = self.kueue.add(copy.deepcopy(dict(workload)))
        if created:
            self.calls.append(("create", f"Workload/{workload['metadata']['name']}"))
        return created

    async def finish_kueue_workload(self, apply: Obj) -> bool:
        self.calls.append(("finish", f"Workload/{apply['metadata']['name']}"))
        return self.kueue.finish(apply["metadata"]["namespace"], apply["metadata"]["name"], apply["status"]["conditions"])

    async def delete_kueue_workload(self, namespace: str, name: str) -> bool:
        self.calls.append(("delete", f"Workload/{name}"))
        return self.kueue.workloads.pop((namespace, name), None) is not None

    async def read_priority_value(self, name: str, *, workload_class: bool) -> int | None:
        return self.priority_classes.get((workload_class, name))

    async def acknowledge_eviction(self, namespace: str, name: str, patch: Obj) -> bool:
        self.calls.append(("acknowledge", f"Workload/{name}"))
        return self.kueue.acknowledge(namespace, name, dict(patch))

    async def read_resource_flavor(self, name: str) -> dict[str, Any] | None:
        got = self.kueue.flavors.get(name)
        return copy.deepcopy(got) if got is not None else None

    def pods_of(self, attempt: int | None = None, *, cleanup: bool = False, spare: bool = False) -> list[dict[str, Any]]:
        out = [p for p in self.pods.values() if (p["metadata"]["labels"].get(CLEANUP_LABEL) == "true") == cleanup
               and (p["metadata"]["labels"].get(SPARE_LABEL) == "true") == spare]
        if attempt is not None:
            out = [p for p in out if int(p["metadata"]["labels"].get(ATTEMPT_LABEL, -1)) == attempt]
        return sorted(out, key=lambda p: int(p["metadata"]["labels"].get(POD_INDEX_LABEL, 0)))


def make_job(name: str = "j", namespace: str = "ns", *, generation: int = 1, **spec: Any) -> dict[str, Any]:
    body = {"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": generation,
                         "creationTimestamp": "2026-01-01T00:00:00Z", "resourceVersion": "1"},
            "spec": {"nodes": 2, "procsPerNode": 2, "parallelism": {"tensor": 2}, **spec}}
    return body


class Harness:
    """One job, one fake cluster, one operator runtime; ``cycle()`` is one reconcile at ``now``."""

    def __init__(self, nodes: Iterable[dict[str, Any]], job: dict[str, Any], *, now: float = 1_767_225_600.0,
                 kueue: FakeKueue | None = None, **settings: Any) -> None:
        self.now = now
        self.cluster = FakeCluster(nodes, clock=lambda: self.now, kueue=kueue)
        self.runtime = Runtime(OperatorSettings(metrics_port=0, registry=CollectorRegistry(), coalesce_s=0, **settings), reconcile_job)
        meta = job["metadata"]
        self.worker = JobWorker(meta["namespace"], meta["name"], body=copy.deepcopy(job))
        self.delays: list[float | None] = []

    @property
    def job(self) -> dict[str, Any]:
        return self.worker.body

    @property
    def status(self) -> TrainingJobStatus:
        return TrainingJobStatus.model_validate(self.cluster.status)

    async def cycle(self, after: float = 0.0) -> float | None:
        self.now += after
        self.cluster.bind(self.runtime)
        delay = await reconcile_job(self.runtime, self.worker, now=self.now, io=self.cluster, clock=lambda: self.now)
        # the watch delivers what was written
        self.worker.body["status"] = copy.deepcopy(self.cluster.status)
        self.worker.body["metadata"]["finalizers"] = list(self.cluster.finalizers)
        self.delays.append(delay)
        return delay

    def edit_spec(self, **spec: Any) -> None:
        self.worker.body["spec"] = {**self.worker.body["spec"], **spec}
        self.worker.body["metadata"]["generation"] += 1

    # -- pod lifecycles, as the kubelet reports them
    def run_pods(self, attempt: int | None = None) -> None:
        a = self.status.attempt if attempt is None else attempt
        for p in self.cluster.pods_of(a):
            p["status"] = {"phase": "Running", "startTime": format_time(self.now),
                           "containerStatuses": [{"name": "trainer", "state": {"running": {"startedAt": format_time(self.now)}}}]}

    def exit_pod(self, index: int, code: int, *, reason: str = "Error", message: str = "") -> None:
        """Pod ``index`` of the current attempt exits ``code``; ``message``: its termination
        message (what the kubelet puts in ``state.terminated.message``)."""
        pod = self.cluster.pods_of(self.status.attempt)[index]
        term: dict[str, Any] = {"exitCode": code, "reason": reason, "finishedAt": format_time(self.now)}
        if message:
            term["message"] = message
        pod["status"] = {"phase": "Succeeded" if code == 0 else "Failed",
                         "containerStatuses": [{"name": "trainer", "state": {"terminated": term}}]}

    def node_down(self, name: str) -> None:
        self.cluster.nodes[name]["status"]["conditions"] = [{"type": "Ready", "status": "False", "lastTransitionTime": format_time(self.now)}]

    def pod_nodes(self, attempt: int | None = None) -> list[str]:
        a = self.status.attempt if attempt is None else attempt
        return [_pinned_node(p) for p in self.cluster.pods_of(a)]

    def reasons(self) -> list[str]:
        return [r for _, r, _ in self.cluster.events]

    # -- the pods' launchers on the restart control channel (railyard.protocol.control)
    def members(self) -> list[dict[str, Any]]:
        """The gang's pods of the current attempt (an in-place restart keeps older ones)."""
        from railyard.logic.gang import gang_members
        from railyard.logic.inplace import members_since

        st = self.status
        gang, _ = gang_members(self.cluster.pods_of(), attempt=st.attempt, since=members_since(st))
        return [dict(p) for p in gang]

    def report(self, index: int, state: str = "running", *, attempt: int | None = None, code: int = 0, pod: str | None = None,
               save_step: int = -1, left_step: int = -1) -> Any:
        """The launcher of pod ``index`` reports; returns the operator's answer (ControlOrder)."""
        from railyard.protocol.control import LauncherReport, LauncherState, parse_order

        member = next((p for p in self.members() if int(p["metadata"]["labels"][POD_INDEX_LABEL]) == index), None)
        name = pod or (member["metadata"]["name"] if member else f"j-a0-{index}")
        a = self.status.attempt if attempt is None else attempt
        r = LauncherReport(job=self.worker.name, attempt=a, pod_index=index, pod=name, state=LauncherState(state), code=code,
                           workers=((index, code),) if code else (), sent_at=self.now, save_step=save_step,
                           left_step=left_step)
        self.runtime.control.clock = lambda: self.now
        self.runtime.control.record(self.worker.namespace, self.worker.name, r)
        order, _ = self.runtime.control.answer(self.worker.namespace, self.worker.name, r)
        return parse_order(order) if isinstance(order, bytes) else order

    def all_report(self, state: str = "running", **kw: Any) -> list[Any]:
        return [self.report(int(p["metadata"]["labels"][POD_INDEX_LABEL]), state, **kw) for p in self.members()]


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)
