"""Kueue labels, Volcano and scheduler-plugins PodGroups: built by railyard.logic.schedulers,
validated against those projects' published CRD schemas (vendored in schemas/)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from railyard.api.trainingjob import TrainingJobSpec
from railyard.logic import schedulers as s
from railyard.logic.manifests import GANG_GATE, build_gang_pods, owner_reference

from .chart import ROOT, validate

LABEL_VALUE_MAX = 63


def job_spec(**gang: Any) -> tuple[dict[str, Any], TrainingJobSpec]:
    job = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    job["metadata"].update(namespace="ml", uid="u-1")
    job["spec"]["gang"] = {**job["spec"].get("gang", {}), **gang}
    job["spec"]["resources"] = {"requests": {"cpu": "500m", "memory": "1536Mi"}}
    return job, TrainingJobSpec.model_validate(job["spec"])


def plan_and_pods(attempt: int = 0, **gang: Any) -> tuple[s.GangSchedulingPlan, list[dict[str, Any]]]:
    job, spec = job_spec(**gang)
    owner = owner_reference(job)
    nodes = [f"n{i}" for i in range(spec.nodes)]
    pods = build_gang_pods(spec, job="tiny", namespace="ml", owner=owner, attempt=attempt, nodes=nodes,
                           heartbeat_url="http://railyard.railyard-system.svc:8080")
    plan = s.plan_gang_scheduling(spec, job="tiny", namespace="ml", attempt=attempt, owner=owner, gang_size=len(pods))
    return plan, s.apply_to_pods(pods, plan)


@pytest.mark.parametrize(
    ("gang", "integration"),
    [
        ({}, s.Integration.DEFAULT),
        ({"queueName": "team-a"}, s.Integration.KUEUE),
        ({"schedulerName": "volcano"}, s.Integration.VOLCANO),
        ({"schedulerName": "volcano", "queueName": "research"}, s.Integration.VOLCANO),
        ({"schedulerName": "scheduler-plugins-scheduler"}, s.Integration.COSCHEDULING),
        ({"schedulerName": "my-scheduler"}, s.Integration.DEFAULT),
    ],
)
def test_the_named_scheduler_picks_the_integration(gang: dict[str, Any], integration: s.Integration) -> None:
    assert s.decide_integration(job_spec(**gang)[1]) is integration


def test_kueue_pods_carry_no_kueue_label() -> None:
    """Kueue admits the TrainingJob's Workload (tests/operator/test_kueue_admits_the_job.py): the
    pods carry no Kueue label, so Kueue's pod webhook adds no gate or finalizer (record 013)."""
    plan, pods = plan_and_pods(queueName="team-a")
    assert plan.objects == []
    for pod in pods:
        assert not set(s.KUEUE_POD_LABELS) & set(pod["metadata"]["labels"])
        assert {"name": GANG_GATE} in pod["spec"]["schedulingGates"]  # our gate stays: we lift it
        assert validate(pod) == []


def test_volcano_podgroup_has_min_member_equal_to_the_gang() -> None:
    plan, pods = plan_and_pods(schedulerName="volcano", queueName="research", priorityClassName="high")
    [pg] = plan.objects
    assert validate(pg) == []
    assert pg["apiVersion"] == "scheduling.volcano.sh/v1beta1" and pg["kind"] == "PodGroup"
    assert pg["spec"]["minMember"] == len(pods) == 2
    assert pg["spec"]["queue"] == "research" and pg["spec"]["priorityClassName"] == "high"
    # the whole gang's requests: 2 pods x (500m, 1536Mi, and whatever GPUs each pod requests)
    per_pod = pods[0]["spec"]["containers"][0]["resources"]["requests"]
    assert pg["spec"]["minResources"]["cpu"] == "1000m" and pg["spec"]["minResources"]["memory"] == "3072Mi"
    assert set(pg["spec"]["minResources"]) == set(per_pod)
    assert pg["metadata"]["ownerReferences"][0]["kind"] == "TrainingJob"
    for pod in pods:
        assert pod["spec"]["schedulerName"] == "volcano"
        assert pod["metadata"]["annotations"][s.VOLCANO_GROUP_ANNOTATION] == pg["metadata"]["name"]
        assert pod["metadata"]["namespace"] == pg["metadata"]["namespace"]
        assert validate(pod) == []


def test_coscheduling_podgroup_has_min_member_equal_to_the_gang() -> None:
    plan, pods = plan_and_pods(schedulerName="scheduler-plugins-scheduler", scheduleTimeoutSeconds=120)
    [pg] = plan.objects
    assert validate(pg) == []
    assert pg["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert pg["spec"]["minMember"] == len(pods)
    assert pg["spec"]["scheduleTimeoutSeconds"] == 120
    for pod in pods:
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
        assert pod["metadata"]["labels"][s.COSCHEDULING_GROUP_LABEL] == pg["metadata"]["name"]
        assert validate(pod) == []


def test_the_vendored_schemas_reject_a_wrong_podgroup() -> None:
    plan, _ = plan_and_pods(schedulerName="volcano")
    pg = plan.objects[0]
    pg["spec"]["minMember"] = "two"
    assert validate(pg)
    pg["spec"]["minMember"] = 2
    pg["spec"]["minMembers"] = 2
    assert validate(pg)


def test_each_attempt_is_its_own_group() -> None:
    a0, _ = plan_and_pods(attempt=0, schedulerName="volcano")
    a1, _ = plan_and_pods(attempt=1, schedulerName="volcano")
    assert a0.group_name != a1.group_name


def test_group_names_stay_valid_label_values() -> None:
    name = s.group_name("x" * 63, 12345)
    assert len(name) <= LABEL_VALUE_MAX and name.endswith("-a12345")


def test_apply_to_pods_is_idempotent_and_does_not_mutate() -> None:
    job, spec = job_spec(queueName="q")
    pods = build_gang_pods(spec, job="tiny", namespace="ml", owner=owner_reference(job), attempt=0,
                           nodes=["n0", "n1"], heartbeat_url="http://x:1")
    before = yaml.safe_dump(pods)
    plan = s.plan_gang_scheduling(spec, job="tiny", namespace="ml", attempt=0, owner=owner_reference(job), gang_size=2)
    once = s.apply_to_pods(pods, plan)
    assert s.apply_to_pods(once, plan) == once
    assert yaml.safe_dump(pods) == before


@pytest.mark.parametrize(("value", "count", "want"), [("500m", 4, "2000m"), ("1.5Gi", 2, "3Gi"), ("8", 3, "24"), ("0.25", 3, "0.75")])
def test_quantities_multiply_keeping_their_unit(value: str, count: int, want: str) -> None:
    assert s._quantity_sum(value, count) == want


def test_gang_size_must_be_positive() -> None:
    job, spec = job_spec(schedulerName="volcano")
    with pytest.raises(ValueError, match="gang_size"):
        s.plan_gang_scheduling(spec, job="tiny", namespace="ml", attempt=0, owner=owner_reference(job), gang_size=0)


# Kubernetes' own gang scheduling (scheduling.k8s.io/v1alpha2, kube v1.36) --------------------

#: The Kubernetes version whose published schemas (kubernetes-validate, strict) know Workload,
#: PodGroup and a pod's spec.schedulingGroup.
WORKLOAD_KUBE_VERSION = "1.36"
LEAF, SPINE = "railyard.dev/leaf", "railyard.dev/spine"


def validate_136(obj: dict[str, Any]) -> list[str]:
    try:
        kubernetes_validate.validate(obj, WORKLOAD_KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    return []


def k8s_plan(attempt: int = 0, *, key: str | None = LEAF, **gang: Any) -> tuple[s.GangSchedulingPlan, list[dict[str, Any]]]:
    job, spec = job_spec(**gang)
    owner = owner_reference(job)
    pods = build_gang_pods(spec, job="tiny", namespace="ml", owner=owner, attempt=attempt, nodes=["n0", "n1"],
                           heartbeat_url="http://railyard.railyard-system.svc:8080")
    plan = s.plan_gang_scheduling(spec, job="tiny", namespace="ml", attempt=attempt, owner=owner, gang_size=len(pods),
                                  workload_api=True, topology_key=key)
    return plan, s.apply_to_pods(pods, plan)


@pytest.mark.parametrize(
    ("gang", "served", "integration"),
    [
        ({}, True, s.Integration.KUBERNETES),  # auto is the default
        ({}, False, s.Integration.DEFAULT),
        ({"scheduler": "auto", "schedulerName": "default-scheduler"}, True, s.Integration.KUBERNETES),
        ({"scheduler": "auto", "schedulerName": "my-scheduler"}, True, s.Integration.DEFAULT),
        ({"scheduler": "auto", "queueName": "team-a"}, True, s.Integration.KUEUE),
        ({"scheduler": "auto", "schedulerName": "volcano"}, True, s.Integration.VOLCANO),
        ({"scheduler": "none"}, True, s.Integration.DEFAULT),
        ({"scheduler": "kubernetes"}, False, s.Integration.KUBERNETES),  # asked for: its absence is reported
        ({"scheduler": "kubernetes", "schedulerName": "my-scheduler"}, False, s.Integration.KUBERNETES),
    ],
)
def test_gang_scheduler_auto_uses_kubernetes_where_served_and_nothing_else_is_named(
    gang: dict[str, Any], served: bool, integration: s.Integration
) -> None:
    assert s.decide_integration(job_spec(**gang)[1], workload_api=served) is integration


@pytest.mark.parametrize(
    ("gang", "asks"),
    [
        ({}, True),
        ({"schedulerName": "default-scheduler"}, True),
        ({"schedulerName": "my-scheduler"}, False),
        ({"queueName": "team-a"}, False),
        ({"schedulerName": "volcano"}, False),
        ({"scheduler": "none"}, False),
        ({"scheduler": "kubernetes"}, False),
    ],
)
def test_discovery_is_asked_only_where_its_answer_decides(gang: dict[str, Any], asks: bool) -> None:
    assert s.needs_workload_api(job_spec(**gang)[1]) is asks


def test_a_workload_and_its_podgroup_per_attempt_as_v136_takes_them() -> None:
    plan, pods = k8s_plan(attempt=3)
    workload, podgroup = plan.objects
    assert validate_136(workload) == [] and validate_136(podgroup) == []
    assert (workload["kind"], podgroup["kind"]) == ("Workload", "PodGroup"), "the Workload first: the PodGroup refers to it"
    assert workload["apiVersion"] == podgroup["apiVersion"] == "scheduling.k8s.io/v1alpha2"
    assert workload["metadata"]["name"] == podgroup["metadata"]["name"] == plan.group_name == plan.pod_group == "tiny-a3"
    for obj in plan.objects:
        assert obj["metadata"]["namespace"] == "ml"
        assert obj["metadata"]["ownerReferences"][0]["kind"] == "TrainingJob"
        assert obj["metadata"]["labels"] == {"railyard.dev/job": "tiny", "railyard.dev/attempt": "3"}
    policy = {"gang": {"minCount": 2}}
    constraint = {"topology": [{"key": LEAF}]}
    assert workload["spec"] == {"podGroupTemplates": [{"name": "gang", "schedulingPolicy": policy, "schedulingConstraints": constraint}]}
    assert podgroup["spec"] == {
        "podGroupTemplateRef": {"workload": {"workloadName": "tiny-a3", "podGroupTemplateName": "gang"}},
        "schedulingPolicy": policy, "schedulingConstraints": constraint,
    }
    for pod in pods:
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": "tiny-a3"}
        assert "schedulerName" not in pod["spec"], "kube-scheduler binds them"
        assert {"name": GANG_GATE} in pod["spec"]["schedulingGates"], "our gate stays until every pod exists"
        assert validate_136(pod) == []
    assert s.apply_to_pods(pods, plan) == pods


def test_no_topology_constraint_where_no_level_holds_the_gang() -> None:
    plan, _ = k8s_plan(key=None)
    workload, podgroup = plan.objects
    assert "schedulingConstraints" not in workload["spec"]["podGroupTemplates"][0]
    assert "schedulingConstraints" not in podgroup["spec"]
    assert validate_136(workload) == [] and validate_136(podgroup) == []


def test_the_objects_do_not_share_dicts() -> None:
    plan, _ = k8s_plan()
    workload, podgroup = plan.objects
    podgroup["spec"]["schedulingPolicy"]["gang"]["minCount"] = 9
    podgroup["metadata"]["labels"]["x"] = "y"
    assert workload["spec"]["podGroupTemplates"][0]["schedulingPolicy"]["gang"]["minCount"] == 2
    assert "x" not in workload["metadata"]["labels"]


def _node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}}}


@pytest.mark.parametrize(
    ("nodes", "key"),
    [
        ([_node("a", **{SPINE: "s0", LEAF: "l0"}), _node("b", **{SPINE: "s0", LEAF: "l0"})], LEAF),
        ([_node("a", **{SPINE: "s0", LEAF: "l0"}), _node("b", **{SPINE: "s0", LEAF: "l1"})], SPINE),
        ([_node("a", **{SPINE: "s0", LEAF: "l0"}), _node("b", **{SPINE: "s1", LEAF: "l2"})], None),
        ([_node("a", **{SPINE: "s0", LEAF: "l0"})], LEAF),
        # a node without the leaf label: a leaf constraint would strand its pod
        ([_node("a", **{SPINE: "s0", LEAF: "l0"}), _node("b", **{SPINE: "s0"})], SPINE),
        ([_node("a", **{SPINE: "s0", LEAF: ""}), _node("b", **{SPINE: "s0", LEAF: ""})], SPINE),
        ([_node("a"), _node("b")], None),
        ([], None),
    ],
)
def test_the_constraint_names_the_narrowest_level_holding_every_node(nodes: list[dict[str, Any]], key: str | None) -> None:
    assert s.decide_topology_key([SPINE, LEAF], nodes) == key


def test_the_topology_key_follows_the_jobs_levels() -> None:
    nodes = {n["metadata"]["name"]: n for n in [_node("a", rack="r0", row="w0"), _node("b", rack="r1", row="w0")]}
    spec = job_spec()[1].model_copy(update={"topology": job_spec()[1].topology.model_copy(update={"levels": ["row", "rack"]})})
    assert s.topology_key_for(spec, ["a", "b"], nodes) == "row"
    assert s.topology_key_for(spec, ["a"], nodes) == "rack"
    assert s.topology_key_for(spec, ["a", "gone"], nodes) is None, "a node not in the cluster: no constraint"


def test_unavailable_says_what_is_missing_and_the_fix() -> None:
    asked, _ = k8s_plan(scheduler="kubernetes")
    msg = s.describe_unavailable(asked, 404, retry_s=10)
    assert msg.startswith("spec.gang.scheduler=kubernetes: creating Workload and PodGroup scheduling.k8s.io/v1alpha2 tiny-a0 failed (404)")
    assert "GenericWorkload=true,GangScheduling=true" in msg and "set spec.gang.scheduler to auto or none" in msg
    assert "RBAC" in s.describe_unavailable(asked, 403, retry_s=10)
    detected, _ = k8s_plan()
    assert detected.detected and not asked.detected
    msg = s.describe_unavailable(detected, 403, retry_s=10)
    assert msg.startswith("spec.gang.scheduler=auto:") and "created without it" in msg
    volcano, _ = plan_and_pods(schedulerName="volcano")
    assert "install that scheduler's CRDs" in s.describe_unavailable(volcano, 404, retry_s=10)
