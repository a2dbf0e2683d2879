"""Kueue labels, Volcano and scheduler-plugins PodGroups: built by railyard.logic.schedulers,
validated against those projects' published CRD schemas (vendored in schemas/)."""

from __future__ import annotations

from typing import Any

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


def test_kueue_plain_pod_group_labels() -> None:
    plan, pods = plan_and_pods(queueName="team-a")
    assert plan.objects == []
    for pod in pods:
        labels, ann = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        assert labels[s.KUEUE_QUEUE_LABEL] == "team-a"
        assert labels[s.KUEUE_GROUP_LABEL] == "tiny-a0"
        assert ann[s.KUEUE_TOTAL_ANNOTATION] == str(len(pods))
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
