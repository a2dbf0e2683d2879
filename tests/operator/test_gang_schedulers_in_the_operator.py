"""The operator hands a gang to the scheduler the TrainingJob names (spec.gang.schedulerName /
queueName): PodGroup first, then pods carrying the scheduler's name, labels and annotations,
still pinned by our node affinity. Unit tests of the API calls, then the operator on the local
cluster with Volcano's PodGroup CRD registered (Volcano itself is not running, so the pods stay
unbound: the test checks the objects, not that the job runs)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from tests.operator.builders import make_node
from tests.operator.conftest import (
    MAIN_NS,
    ROOT,
    Api,
    OperatorProcess,
    Workload,
    _apply_crd,
    base_spec,
    on_exit_dump,
)
from tests.operator.fake_cluster import Harness, make_job
from tests.waiting import wait_until

from railyard.api.trainingjob import TrainingJobSpec
from railyard.k8s import gang as ops
from railyard.k8s.client import ApiError
from railyard.logic import schedulers as s
from railyard.logic.conditions import find_condition
from railyard.logic.manifests import GANG_GATE, build_gang_pods
from railyard.protocol.control import Action

NS = MAIN_NS
OWNER = {"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "name": "tiny", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}


class RecordingKube:
    """Records create/delete calls; ``exists`` names answer AlreadyExists, ``fail`` raises."""

    def __init__(self, exists: frozenset[str] = frozenset(), fail: int | None = None) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.exists, self.fail = set(exists), fail

    async def create(self, path: str, body: dict[str, Any], **_: Any) -> dict[str, Any] | None:
        self.calls.append(("create", path, body))
        if self.fail:
            raise ApiError(self.fail, {"message": "nope"}, "POST", path)
        return None if body["metadata"]["name"] in self.exists else body

    async def delete(self, path: str, **_: Any) -> bool:
        self.calls.append(("delete", path, None))
        if self.fail:
            raise ApiError(self.fail, {"message": "nope"}, "DELETE", path)
        return path.rsplit("/", 1)[1] not in self.exists


def _gang(**gang: Any) -> tuple[s.GangSchedulingPlan, list[dict[str, Any]]]:
    """What the reconcile step builds: plan for the gang, then the pods passed through it."""
    spec = TrainingJobSpec.model_validate({"nodes": 3, "gang": gang, "resources": {"requests": {"cpu": "2"}}})
    nodes = ["n0", "n1", "n2"]
    pods = build_gang_pods(spec, job="tiny", namespace="ml", owner=OWNER, attempt=2, nodes=nodes, heartbeat_url="http://x")
    plan = s.plan_gang_scheduling(spec, job="tiny", namespace="ml", attempt=2, owner=OWNER, gang_size=len(pods))
    return plan, s.apply_to_pods(pods, plan)


def _pinned_node(pod: dict[str, Any]) -> str:
    term = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    values: list[str] = term["matchFields"][0]["values"]
    assert len(values) == 1
    return values[0]


@pytest.mark.parametrize(
    ("gang", "scheduler", "api_version", "path"),
    [
        ({"schedulerName": "volcano", "queueName": "research"}, "volcano", s.VOLCANO_API_VERSION,
         "/apis/scheduling.volcano.sh/v1beta1/namespaces/ml/podgroups"),
        ({"schedulerName": "scheduler-plugins-scheduler"}, "scheduler-plugins-scheduler", s.COSCHEDULING_API_VERSION,
         "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ml/podgroups"),
    ],
)
async def test_podgroup_schedulers_get_their_group_and_pods_keep_our_pinning(
    gang: dict[str, Any], scheduler: str, api_version: str, path: str
) -> None:
    plan, pods = _gang(**gang)
    [group] = plan.objects
    assert group["apiVersion"] == api_version and group["kind"] == "PodGroup"
    assert group["metadata"]["name"] == "tiny-a2" and group["metadata"]["ownerReferences"] == [OWNER]
    assert group["spec"]["minMember"] == 3 and group["spec"]["minResources"]["cpu"] == "6"
    for i, pod in enumerate(pods):
        assert pod["spec"]["schedulerName"] == scheduler
        assert _pinned_node(pod) == f"n{i}", "our placement still decides the node"
        assert {"name": GANG_GATE} in pod["spec"]["schedulingGates"], "our gate stays until the gang exists"
        meta = pod["metadata"]
        if api_version == s.VOLCANO_API_VERSION:
            assert meta["annotations"][s.VOLCANO_GROUP_ANNOTATION] == "tiny-a2"
        else:
            assert meta["labels"][s.COSCHEDULING_GROUP_LABEL] == "tiny-a2"

    kube = RecordingKube()
    assert await ops.create_podgroups(kube, plan.objects) == 1  # type: ignore[arg-type]
    assert kube.calls == [("create", path, group)]
    again = RecordingKube(exists=frozenset({"tiny-a2"}))
    assert await ops.create_podgroups(again, plan.objects) == 0, "AlreadyExists is not an error"  # type: ignore[arg-type]
    gone = RecordingKube(exists=frozenset({"tiny-a0"}))
    assert await ops.delete_podgroups(gone, "ml", api_version, ["tiny-a0", "tiny-a1"]) == 1  # type: ignore[arg-type]
    assert [c[1] for c in gone.calls] == [f"{path}/tiny-a0", f"{path}/tiny-a1"]


async def test_a_missing_podgroup_crd_is_an_error_but_deleting_old_groups_is_not() -> None:
    plan, _ = _gang(schedulerName="volcano")
    with pytest.raises(ApiError) as exc:
        await ops.create_podgroups(RecordingKube(fail=404), plan.objects)  # type: ignore[arg-type]
    assert exc.value.status == 404
    assert await ops.delete_podgroups(RecordingKube(fail=404), "ml", s.VOLCANO_API_VERSION, ["tiny-a1"]) == 0  # type: ignore[arg-type]


def test_kueue_leaves_the_pods_unlabelled_and_no_scheduler_leaves_pods_as_built() -> None:
    plan, pods = _gang(queueName="team-a")
    assert plan.objects == []
    for pod in pods:
        assert not set(s.KUEUE_POD_LABELS) & set(pod["metadata"]["labels"]), "Kueue's pod webhook must leave them alone"
        assert not any(k.startswith("kueue.x-k8s.io/") for k in pod["metadata"].get("annotations") or {})
        assert "schedulerName" not in pod["spec"]
    plan, pods = _gang()
    assert plan.objects == [] and plan.pod_labels == {} and plan.pod_annotations == {}
    spec = TrainingJobSpec.model_validate({"nodes": 3, "resources": {"requests": {"cpu": "2"}}})
    plain = build_gang_pods(spec, job="tiny", namespace="ml", owner=OWNER, attempt=2, nodes=["n0", "n1", "n2"], heartbeat_url="http://x")
    assert pods == plain


# Kubernetes' own gang scheduling: the API calls -----------------------------------------------

K8S_PATH = "/apis/scheduling.k8s.io/v1alpha2/namespaces/ml"


async def test_kubernetes_gets_its_workload_then_its_podgroup_and_both_go_with_old_attempts() -> None:
    spec = TrainingJobSpec.model_validate({"nodes": 3, "gang": {"scheduler": "kubernetes"}})
    plan = s.plan_gang_scheduling(spec, job="tiny", namespace="ml", attempt=2, owner=OWNER, gang_size=3, topology_key="railyard.dev/leaf")
    kube = RecordingKube()
    assert await ops.create_podgroups(kube, plan.objects) == 2  # type: ignore[arg-type]
    assert [(c[0], c[1], c[2]["kind"]) for c in kube.calls] == [
        ("create", f"{K8S_PATH}/workloads", "Workload"), ("create", f"{K8S_PATH}/podgroups", "PodGroup")]
    assert await ops.create_podgroups(RecordingKube(exists=frozenset({"tiny-a2"})), plan.objects) == 0  # type: ignore[arg-type]
    # deleting a Workload leaves its PodGroups (the record): both are deleted, by name
    gone = RecordingKube()
    await ops.delete_podgroups(gone, "ml", s.SCHEDULING_API_VERSION, ["tiny-a0", "tiny-a1"])  # type: ignore[arg-type]
    assert [c[1] for c in gone.calls] == [f"{K8S_PATH}/podgroups/tiny-a0", f"{K8S_PATH}/workloads/tiny-a0",
                                          f"{K8S_PATH}/podgroups/tiny-a1", f"{K8S_PATH}/workloads/tiny-a1"]
    assert await ops.delete_podgroups(RecordingKube(fail=403), "ml", s.SCHEDULING_API_VERSION, ["tiny-a0"]) == 0  # type: ignore[arg-type]


class DiscoveryKube:
    """Answers GET /apis/scheduling.k8s.io/v1alpha2 as a v1.36 server does (or with ``status``)."""

    def __init__(self, resources: list[str] | None = None, status: int = 200) -> None:
        self.resources, self.status = resources or [], status
        self.paths: list[str] = []

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.paths.append(f"{method} {path}")
        if self.status != 200:
            raise ApiError(self.status, {"message": "nope"}, method, path)
        return {"kind": "APIResourceList", "groupVersion": "scheduling.k8s.io/v1alpha2",
                "resources": [{"name": r, "namespaced": True, "kind": "x", "verbs": ["create"]} for r in self.resources]}


@pytest.mark.parametrize(
    ("resources", "status", "served"),
    [
        (["podgroups", "podgroups/status", "workloads"], 200, True),  # what the recorded server lists
        (["workloads"], 200, False),
        ([], 404, False),  # the group version is not served (no feature gates)
        ([], 403, False),
    ],
)
async def test_discovery_says_whether_workloads_and_podgroups_are_served(resources: list[str], status: int, served: bool) -> None:
    kube = DiscoveryKube(resources, status)
    assert await ops.serves_workload_api(kube) is served  # type: ignore[arg-type]
    assert kube.paths == ["GET /apis/scheduling.k8s.io/v1alpha2"]


async def test_discovery_errors_other_than_absent_or_forbidden_are_raised() -> None:
    with pytest.raises(ApiError):
        await ops.serves_workload_api(DiscoveryKube(status=500))  # type: ignore[arg-type]


# Kubernetes' own gang scheduling: the reconcile cycle, in-process (fake_cluster.py) --------------


def _k8s_cluster() -> list[dict[str, Any]]:
    return [make_node(f"node-{i}", gpus=2, leaf=f"leaf-{i // 2}") for i in range(4)]


def _group_of(pod: dict[str, Any]) -> str | None:
    return ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")


async def _running(h: Harness) -> None:
    await h.cycle()
    h.run_pods()
    for p in h.cluster.pods_of(spare=True):
        p["status"] = {"phase": "Running"}
    await h.cycle(1.0)
    assert all(o.action is Action.CONTINUE for o in h.all_report())
    await h.cycle(1.0)
    assert h.status.phase == "Running", h.cluster.events


async def test_auto_on_a_server_that_serves_it_gives_each_attempt_a_workload_and_podgroup() -> None:
    h = Harness(_k8s_cluster(), make_job(gang={"hotSpares": 1}))
    h.cluster.workload_api = True
    await _running(h)
    workload, podgroup = h.cluster.objects[("Workload", "j-a0")], h.cluster.objects[("PodGroup", "j-a0")]
    assert workload["spec"]["podGroupTemplates"][0]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    # both pods on one leaf (the placement packs them): the constraint names the leaf level
    assert len({h.cluster.nodes[n]["metadata"]["labels"]["railyard.dev/leaf"] for n in h.pod_nodes()}) == 1
    assert podgroup["spec"]["schedulingConstraints"] == {"topology": [{"key": "railyard.dev/leaf"}]}
    assert podgroup["spec"]["podGroupTemplateRef"]["workload"]["workloadName"] == "j-a0"
    assert [_group_of(p) for p in h.cluster.pods_of(0)] == ["j-a0", "j-a0"], "every pod in its group"
    assert all(_group_of(p) is None for p in h.cluster.pods_of(spare=True)), "placeholders are no gang"
    order = [w for v, w in h.cluster.calls if v == "create"]
    assert order.index("Workload/j-a0") < order.index("PodGroup/j-a0") < min(order.index(f"Pod/j-a0-{i}") for i in range(2))
    assert [c for c in h.cluster.calls if c[0] == "discover"] == [("discover", "scheduling.k8s.io/v1alpha2")], "asked once"


async def test_a_node_loss_in_place_puts_the_replacement_in_the_next_attempts_group_of_its_own() -> None:
    h = Harness(_k8s_cluster(), make_job(gang={"hotSpares": 1}))
    h.cluster.workload_api = True
    await _running(h)
    lost = h.pod_nodes()[1]
    h.node_down(lost)
    await h.cycle(5.0)
    st = h.status
    assert st.last_restart is not None and st.last_restart.mode == "InPlace" and st.last_restart.replaced == [1]
    kept, new = h.cluster.pods["j-a0-0"], h.cluster.pods["j-a1-1"]
    assert _group_of(kept) == "j-a0", "a pod's group is immutable: the kept pod stays in its own"
    assert _group_of(new) == "j-a1"
    replacement = h.cluster.objects[("PodGroup", "j-a1")]
    assert replacement["spec"]["schedulingPolicy"] == {"gang": {"minCount": 1}}, "all the replaced pods, or none"
    assert h.cluster.objects[("Workload", "j-a1")]["spec"]["podGroupTemplates"][0]["schedulingPolicy"] == {"gang": {"minCount": 1}}
    assert ("PodGroup", "j-a0") in h.cluster.objects, "the kept pod's group stays while it runs"
    h.cluster.finish_deletions()
    await h.cycle(0.5)
    h.run_pods()
    h.report(0, "running", attempt=1)
    h.report(1, "running", attempt=1)
    await h.cycle(0.5)
    assert h.status.phase == "Running" and h.status.last_restart.state == "Done"  # type: ignore[union-attr]
    assert [q.node for q in h.status.quarantined_nodes] == [lost]


async def test_a_full_restart_makes_a_new_group_and_deletes_the_old_ones() -> None:
    h = Harness(_k8s_cluster(), make_job(gang={"scheduler": "kubernetes"}, restartPolicy={"inPlace": False, "application": {"limit": 3, "backoffSeconds": 0}}))
    await _running(h)
    h.exit_pod(0, 1)
    await h.cycle(1.0)
    h.cluster.finish_deletions()
    for _ in range(3):
        await h.cycle(1.0)
    assert h.status.attempt == 1 and {_group_of(p) for p in h.cluster.pods_of(1)} == {"j-a1"}
    assert ("Workload", "j-a1") in h.cluster.objects and ("PodGroup", "j-a1") in h.cluster.objects
    assert ("Workload", "j-a0") not in h.cluster.objects and ("PodGroup", "j-a0") not in h.cluster.objects
    assert not [c for c in h.cluster.calls if c[0] == "discover"], "scheduler kubernetes: nothing to detect"


async def test_auto_without_the_api_leaves_the_pods_as_before() -> None:
    h = Harness(_k8s_cluster(), make_job())
    await h.cycle()
    assert h.status.phase == "Starting"
    assert not [k for k in h.cluster.objects if k[0] in ("Workload", "PodGroup")]
    assert all(_group_of(p) is None for p in h.cluster.pods_of(0))


@pytest.mark.parametrize("status", [404, 403])
async def test_kubernetes_asked_for_but_refused_keeps_the_job_placing_with_the_fix(status: int) -> None:
    h = Harness(_k8s_cluster(), make_job(gang={"scheduler": "kubernetes"}))
    h.cluster.podgroup_error = status
    await h.cycle()
    st = h.status
    placed = find_condition(st.conditions, "Placed")
    assert st.phase == "Placing" and placed is not None and (placed.status, placed.reason) == ("False", "PodGroupUnavailable")
    assert h.reasons() == ["PodGroupUnavailable"]
    assert st.message.startswith("spec.gang.scheduler=kubernetes: creating Workload and PodGroup scheduling.k8s.io/v1alpha2 j-a0")
    assert h.cluster.pods == {}, "no pod before its group"


async def test_auto_refused_by_rbac_falls_back_to_no_group_for_this_operator() -> None:
    h = Harness(_k8s_cluster(), make_job())
    h.cluster.workload_api = True
    h.cluster.podgroup_error = 403
    await h.cycle()
    assert h.status.phase == "Placing" and h.status.message.startswith("spec.gang.scheduler=auto:")
    assert h.runtime.workload_api is False
    await h.cycle(10.0)
    assert h.status.phase == "Starting"
    assert all(_group_of(p) is None for p in h.cluster.pods_of(0)) and len(h.cluster.pods_of(0)) == 2


async def test_auto_refused_at_an_in_place_restart_replaces_the_pod_without_a_group() -> None:
    """A new operator process (discovery says served) whose first group is a replacement's, and
    RBAC without workloads: the restart goes on, without Kubernetes' gang scheduling."""
    h = Harness(_k8s_cluster(), make_job(gang={"hotSpares": 1}))
    h.cluster.workload_api = True
    await _running(h)
    h.cluster.podgroup_error = 403
    h.node_down(h.pod_nodes()[1])
    await h.cycle(5.0)
    assert h.status.last_restart is not None and h.status.last_restart.mode == "InPlace"
    assert _group_of(h.cluster.pods["j-a1-1"]) is None and h.runtime.workload_api is False
    assert _group_of(h.cluster.pods["j-a0-0"]) == "j-a0"


@pytest.mark.parametrize("began_with_group", [False, True])
async def test_a_resumed_creation_keeps_the_group_choice_of_the_operator_that_began_it(began_with_group: bool) -> None:
    """An operator killed between two pods (or one of another version, or on a server that
    changed) began the gang with or without the group; its successor finishes it the same way,
    whatever discovery tells it: one group of minCount 2 with a pod missing would never bind."""
    h = Harness(_k8s_cluster(), make_job())
    h.cluster.workload_api = began_with_group
    await h.cycle()
    names = sorted(p["metadata"]["name"] for p in h.cluster.pods_of(0))
    del h.cluster.pods[names[1]]
    h.cluster.pods[names[0]]["spec"]["schedulingGates"] = [{"name": GANG_GATE}]
    h.worker.status_wire = None
    h.worker.body["status"] = {**h.cluster.status, "phase": "Placing"}
    h.cluster.status = dict(h.worker.body["status"])
    h.runtime.workload_api = None  # a new operator process
    h.cluster.workload_api = not began_with_group
    await h.cycle(1.0)
    assert h.status.phase == "Starting" and "GangResumed" in h.reasons()
    groups = [_group_of(p) for p in h.cluster.pods_of(0)]
    assert groups == (["j-a0", "j-a0"] if began_with_group else [None, None])
    assert (("PodGroup", "j-a0") in h.cluster.objects) is began_with_group


# the operator on the local cluster ------------------------------------------------------------


def _volcano_crd() -> dict[str, Any]:
    schema = json.loads((ROOT / "tests" / "deployment" / "schemas" / "scheduling.volcano.sh_v1beta1_PodGroup.json").read_text())
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "podgroups.scheduling.volcano.sh"},
        "spec": {
            "group": "scheduling.volcano.sh",
            "scope": "Namespaced",
            "names": {"plural": "podgroups", "singular": "podgroup", "kind": "PodGroup", "listKind": "PodGroupList"},
            "versions": [{"name": "v1beta1", "served": True, "storage": True, "schema": schema,
                          "subresources": {"status": {}}}],
        },
    }


@pytest.mark.cluster
def test_a_volcano_job_gets_its_podgroup_before_pods_that_name_volcano(
    api: Api, operator: OperatorProcess, workload: Workload, job_name: str
) -> None:
    asyncio.run(_apply_crd(api.kubeconfig, _volcano_crd()))
    wait_until(lambda: api.custom.list_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", NS, "podgroups") is not None,
               timeout=30,
               message="the PodGroup CRD to serve",
               retry_on=(Exception,))
    spec = base_spec(workload, nodes=2, gang={"scheduleTimeoutSeconds": 60, "schedulerName": "volcano", "queueName": "research"})
    api.create_job(NS, job_name, spec)
    try:
        pods = wait_until(lambda: len(api.pods(NS, job_name)) == 2 and api.pods(NS, job_name), timeout=60, message="both pods created", retry_on=(Exception,))
        group = api.custom.get_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", NS, "podgroups", f"{job_name}-a0")
        assert group["spec"]["minMember"] == 2 and group["spec"]["queue"] == "research"
        owner = group["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "TrainingJob" and owner["name"] == job_name
        created = group["metadata"]["creationTimestamp"]
        for p in pods:
            assert p.spec.scheduler_name == "volcano"
            assert p.metadata.annotations[s.VOLCANO_GROUP_ANNOTATION] == f"{job_name}-a0"
            term = p.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms[0]
            assert term.match_fields[0].values == [p.metadata.annotations["railyard.dev/node"]]
            assert p.metadata.creation_timestamp.isoformat().replace("+00:00", "Z") >= created
        wait_until(lambda: all(not p.spec.scheduling_gates for p in api.pods(NS, job_name)), timeout=30, message="our gates lifted", retry_on=(Exception,))
        # nobody runs Volcano here: the pods wait for it, unbound
        assert all(not p.spec.node_name for p in api.pods(NS, job_name))
    except BaseException:
        print(on_exit_dump(api, NS, job_name, operator))
        raise
    finally:
        api.delete_job(NS, job_name)


@pytest.mark.cluster
def test_a_scheduler_whose_crd_is_missing_keeps_the_job_placing_with_the_fix(
    api: Api, operator: OperatorProcess, workload: Workload, job_name: str
) -> None:
    spec = base_spec(workload, nodes=2, gang={"scheduleTimeoutSeconds": 60, "schedulerName": "scheduler-plugins-scheduler"})
    api.create_job(NS, job_name, spec)
    try:
        def reasons() -> set[str]:
            return {c.get("reason") for c in api.status(NS, job_name).get("conditions") or []}

        wait_until(lambda: "PodGroupUnavailable" in reasons(), timeout=60, message="reason PodGroupUnavailable", retry_on=(Exception,))
        st = api.status(NS, job_name)
        assert st["phase"] == "Placing"
        assert "spec.gang.schedulerName" in st["message"] and "scheduling.x-k8s.io/v1alpha1" in st["message"]
        assert api.pods(NS, job_name) == [], "no pod before its PodGroup"
    except BaseException:
        print(on_exit_dump(api, NS, job_name, operator))
        raise
    finally:
        api.delete_job(NS, job_name)


# Kubernetes' gang scheduling on the local cluster ---------------------------------------------

K8S_GROUP, K8S_VERSION = "scheduling.k8s.io", "v1alpha2"


def _serves_workload_api(api: Api) -> bool:
    from railyard.k8s.client import Kube

    async def ask() -> bool:
        kube = Kube.from_config(str(api.kubeconfig))
        try:
            return await ops.serves_workload_api(kube)
        finally:
            await kube.close()

    return asyncio.run(ask())


def _raw_pods(api: Api, job: str) -> list[dict[str, Any]]:
    """The job's pods as the server sends them (the generated client drops fields it predates,
    such as spec.schedulingGroup)."""
    resp = api.core.list_namespaced_pod(NS, label_selector=f"railyard.dev/job={job}", _preload_content=False)
    items: list[dict[str, Any]] = json.loads(resp.data)["items"]
    return items


def _k8s_object(api: Api, plural: str, name: str) -> dict[str, Any] | None:
    from kubernetes.client.rest import ApiException

    try:
        got: dict[str, Any] = api.custom.get_namespaced_custom_object(K8S_GROUP, K8S_VERSION, NS, plural, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return got


#: Before the stand-in records that it started, it sends the report its launcher sends from a
#: thread of its own once its workers run (this attempt, this pod, running), and waits for the
#: answer: the started file then means the operator has heard this pod's launcher, which an
#: in-place restart needs (without it, a node lost right after the start is a full restart).
REPORTED = r"""
import os, time, urllib.request
from railyard.protocol.control import LauncherReport, LauncherState
e = os.environ
body = LauncherReport(e["RAILYARD_JOB"], int(e["RAILYARD_ATTEMPT"]), int(e["RAILYARD_POD_INDEX"]), e["RAILYARD_POD_NAME"],
                      LauncherState.RUNNING, sent_at=time.time()).to_json().encode()
while True:
    req = urllib.request.Request(e["RAILYARD_CONTROL_URL"] + "?wait=0", data=body, method="POST",
                                 headers={"Authorization": "Bearer " + e["RAILYARD_HEARTBEAT_TOKEN"], "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            if r.status == 200:
                break
    except OSError:
        pass
    time.sleep(0.2)
"""


def _scheduled(api: Api, group: str) -> bool:
    pg = _k8s_object(api, "podgroups", group) or {}
    return any(c.get("type") == "PodGroupScheduled" and c.get("status") == "True" for c in (pg.get("status") or {}).get("conditions") or [])


def _launched_spec(workload: Workload, **extra: Any) -> dict[str, Any]:
    """base_spec's stand-in workload started by railyard-train (trainer.program), whose launcher
    speaks the restart control protocol: what an in-place restart needs."""
    spec = base_spec(workload, **extra)
    python, flag, program, folder = spec.pop("command")
    spec["trainer"] = {**spec["trainer"], "program": {"command": [python, flag, REPORTED + program, folder]}}
    return spec


@pytest.mark.cluster
def test_kubernetes_binds_the_whole_gang_in_its_group_and_a_lost_node_is_replaced_in_place(
    api: Api, operator: OperatorProcess, workload: Workload, job_name: str
) -> None:
    if not _serves_workload_api(api):
        pytest.skip("the API server does not serve scheduling.k8s.io/v1alpha2 Workloads and PodGroups")
    from railyard_local.nodes import FAIL_ANNOTATION

    spec = _launched_spec(workload, nodes=2, gang={"scheduleTimeoutSeconds": 60, "scheduler": "kubernetes", "hotSpares": 1})
    api.create_job(NS, job_name, spec)
    victim = ""
    try:
        def running(attempt: int | None = None) -> list[dict[str, Any]]:
            return [p for p in _raw_pods(api, job_name) if (p.get("status") or {}).get("phase") == "Running"
                    and not p["metadata"].get("deletionTimestamp")
                    and p["metadata"]["labels"].get("railyard.dev/attempt") is not None  # not a spare's placeholder
                    and (attempt is None or p["metadata"]["labels"]["railyard.dev/attempt"] == str(attempt))]

        wait_until(lambda: api.status(NS, job_name).get("phase") == "Running", timeout=120, message="the gang Running", retry_on=(Exception,))
        wait_until(lambda: len(workload.started(0)) == 2, timeout=60, message="both launchers heard by the operator", retry_on=(Exception,))
        group = f"{job_name}-a0"
        wl, pg = _k8s_object(api, "workloads", group), _k8s_object(api, "podgroups", group)
        assert wl is not None and pg is not None, "a Workload and a PodGroup for the attempt"
        [template] = wl["spec"]["podGroupTemplates"]
        assert template["schedulingPolicy"] == {"gang": {"minCount": 2}}
        assert pg["spec"]["podGroupTemplateRef"]["workload"] == {"workloadName": group, "podGroupTemplateName": "gang"}
        for obj in (wl, pg):
            assert obj["metadata"]["ownerReferences"][0]["name"] == job_name
        # the scheduler bound the group as a whole, and says so (kube-golden/v1.36-workload 021)
        wait_until(lambda: _scheduled(api, group), timeout=30, message="PodGroupScheduled", retry_on=(Exception,))
        placed = api.status(NS, job_name)["placement"]["nodes"]
        pods = running(0)
        assert sorted(p["metadata"]["name"] for p in pods) == [f"{group}-0", f"{group}-1"]
        for p in pods:
            assert p["spec"]["schedulingGroup"] == {"podGroupName": group}, "every pod in its group"
            assert p["spec"]["nodeName"] == placed[int(p["metadata"]["labels"]["railyard.dev/pod-index"])], "bound where we placed it"
        kept = next(p for p in pods if p["metadata"]["name"] == f"{group}-0")

        victim = placed[1]
        api.annotate_node(victim, {FAIL_ANNOTATION: "true"})
        wait_until(lambda: (api.status(NS, job_name).get("lastRestart") or {}).get("state") == "Done"
                 and api.status(NS, job_name).get("phase") == "Running",
                   timeout=120,
                   message="the restart in place done",
                   retry_on=(Exception,))
        st = api.status(NS, job_name)
        assert st["lastRestart"]["mode"] == "InPlace" and st["lastRestart"]["replaced"] == [1], st["lastRestart"]
        assert [q["node"] for q in st["quarantinedNodes"]] == [victim]
        now = {p["metadata"]["name"]: p for p in running()}
        assert now[f"{group}-0"]["metadata"]["uid"] == kept["metadata"]["uid"], "the pod on the healthy node stayed"
        new = now[f"{job_name}-a1-1"]
        assert new["spec"]["nodeName"] not in (victim, kept["spec"]["nodeName"])
        # the replacement's group is the next attempt's, of its own: all the replaced pods or none
        assert new["spec"]["schedulingGroup"] == {"podGroupName": f"{job_name}-a1"}
        assert now[f"{group}-0"]["spec"]["schedulingGroup"] == {"podGroupName": group}
        replacement = _k8s_object(api, "podgroups", f"{job_name}-a1")
        assert replacement is not None and replacement["spec"]["schedulingPolicy"] == {"gang": {"minCount": 1}}
        wait_until(lambda: _scheduled(api, f"{job_name}-a1"), timeout=30, message="the replacement's PodGroupScheduled", retry_on=(Exception,))
    except BaseException:
        print(on_exit_dump(api, NS, job_name, operator))
        raise
    finally:
        if victim:
            api.annotate_node(victim, {FAIL_ANNOTATION: None, "railyard.dev/release": "true"})
            wait_until(lambda: any(c.type == "Ready" and c.status == "True" for c in api.node(victim).status.conditions), timeout=90, message="node Ready", retry_on=(Exception,))
        api.delete_job(NS, job_name)
