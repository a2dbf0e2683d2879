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
from tests.operator.conftest import (
    MAIN_NS,
    ROOT,
    Api,
    OperatorProcess,
    Workload,
    _apply_crd,
    base_spec,
    on_exit_dump,
    wait_for,
)

from railyard.api.trainingjob import TrainingJobSpec
from railyard.k8s import gang as ops
from railyard.k8s.client import ApiError
from railyard.logic import schedulers as s
from railyard.logic.manifests import GANG_GATE, build_gang_pods

NS = MAIN_NS
OWNER = {"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "name": "tiny", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}


class RecordingKube:
    """Records create/delete calls; ``exists`` names answer AlreadyExists, ``fail`` raises."""

    def __init__(self, exists: frozenset[str] = frozenset(), fail: int | None = None) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.exists, self.fail = set(exists), fail

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
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


def test_kueue_gets_labels_only_and_no_scheduler_leaves_pods_as_built() -> None:
    plan, pods = _gang(queueName="team-a")
    assert plan.objects == []
    for pod in pods:
        assert pod["metadata"]["labels"][s.KUEUE_QUEUE_LABEL] == "team-a"
        assert pod["metadata"]["labels"][s.KUEUE_GROUP_LABEL] == "tiny-a2"
        assert pod["metadata"]["annotations"][s.KUEUE_TOTAL_ANNOTATION] == "3"
        assert "schedulerName" not in pod["spec"]
    plan, pods = _gang()
    assert plan.objects == [] and plan.pod_labels == {} and plan.pod_annotations == {}
    spec = TrainingJobSpec.model_validate({"nodes": 3, "resources": {"requests": {"cpu": "2"}}})
    plain = build_gang_pods(spec, job="tiny", namespace="ml", owner=OWNER, attempt=2, nodes=["n0", "n1", "n2"], heartbeat_url="http://x")
    assert pods == plain


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
    wait_for("the PodGroup CRD to serve",
             lambda: api.custom.list_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", NS, "podgroups") is not None)
    spec = base_spec(workload, nodes=2, gang={"scheduleTimeoutSeconds": 60, "schedulerName": "volcano", "queueName": "research"})
    api.create_job(NS, job_name, spec)
    try:
        pods = wait_for("both pods created", lambda: len(api.pods(NS, job_name)) == 2 and api.pods(NS, job_name), 60)
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
        wait_for("our gates lifted", lambda: all(not p.spec.scheduling_gates for p in api.pods(NS, job_name)), 30)
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

        wait_for("reason PodGroupUnavailable", lambda: "PodGroupUnavailable" in reasons(), 60)
        st = api.status(NS, job_name)
        assert st["phase"] == "Placing"
        assert "spec.gang.schedulerName" in st["message"] and "scheduling.x-k8s.io/v1alpha1" in st["message"]
        assert api.pods(NS, job_name) == [], "no pod before its PodGroup"
    except BaseException:
        print(on_exit_dump(api, NS, job_name, operator))
        raise
    finally:
        api.delete_job(NS, job_name)
