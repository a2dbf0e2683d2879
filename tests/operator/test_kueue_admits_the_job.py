"""Kueue admits the TrainingJob, not its pods (issue 48): one Workload per job, shaped as the one a
real Kueue v0.13.1 admitted (kube-golden/kueue-v0.13-workload), no pod before its admission, the
job ``Queued`` with Kueue's words meanwhile, restarts inside the admission, the end written as
``Finished``, the Workload deleted with the job. Kueue's part is tests/operator/fake_kueue.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.operator.builders import make_node
from tests.operator.fake_cluster import Harness, make_job
from tests.operator.fake_kueue import KUEUE_KINDS, SCHEMAS, FakeKueue, is_true

from railyard.api.trainingjob import TrainingJobSpec
from railyard.logic.conditions import find_condition
from railyard.logic.jitsave import LEAD_STEPS
from railyard.logic.kueue import (
    Admitted,
    CreateWorkload,
    Evict,
    StayQueued,
    apply_flavor,
    decide_admission,
    kueue_queue,
    merge_flavors,
)
from railyard.logic.manifests import configmap_name
from railyard.logic.manifests.kueue import (
    KUEUE_PRIORITY_SOURCE,
    build_eviction_ack,
    build_finished_apply,
    build_kueue_workload,
)
from railyard.logic.schedulers import KUEUE_POD_LABELS
from railyard.protocol.control import Action
from railyard.protocol.heartbeat import CheckpointEvent, HeartbeatBatch, RankBeat

ROOT = Path(__file__).resolve().parents[2]
#: The copy of kube-golden/kueue-v0.13-workload (tests/golden/test_corpora_are_the_record.py keeps it the record)
RECORD = ROOT / "tests" / "golden" / "kueue-v0.13-workload"
SCHEMA = ROOT / "tests" / "deployment" / "schemas" / "kueue.x-k8s.io_v1beta1_Workload.json"
#: The docs' example: a queue, a quota and two jobs, one waiting (docs/deploy.md, "Kueue").
EXAMPLE = ROOT / "examples" / "kueue-two-jobs.yaml"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"


def _record(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORD / name).read_text())
    return data


# the Workload, as recorded ---------------------------------------------------------------------

OWNER = {"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "name": "tj-a",
         "uid": "f9126c0d-7101-41b2-9f8c-c84090699b75", "controller": True, "blockOwnerDeletion": True}
RECORDED_SPEC = {"image": "railyard/trainer:dev", "nodes": 4, "gpusPerPod": 1,
                 "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}, "gang": {"queueName": "team-a"}}


def test_the_workload_is_the_one_kueue_admitted_in_the_record() -> None:
    recorded = _record("007-a01-workload-create.json")["request"]["body"]
    spec = TrainingJobSpec.model_validate(RECORDED_SPEC)
    built = build_kueue_workload(spec, job="tj-a", namespace="kq-wl", owner=OWNER, queue="team-a", priority=100,
                                 priority_class="wl-low", priority_source=KUEUE_PRIORITY_SOURCE)
    assert built == recorded


def test_the_workload_validates_against_kueues_published_schema() -> None:
    import jsonschema

    vendored = json.loads(SCHEMA.read_text())
    assert vendored["source"]["repository"] == "kubernetes-sigs/kueue" and vendored["source"]["tag"] == "v0.13.1"
    spec = TrainingJobSpec.model_validate({**RECORDED_SPEC, "nodes": 64, "gang": {"queueName": "team-a", "hotSpares": 2}})
    built = build_kueue_workload(spec, job="big", namespace="ml", owner=OWNER, queue="team-a")
    jsonschema.validate(built, vendored["openAPIV3Schema"])
    assert [(p["name"], p["count"]) for p in built["spec"]["podSets"]] == [("workers", 64), ("spares", 2)]
    assert "priority" not in built["spec"] and "priorityClassName" not in built["spec"], "a class without a value is refused (014)"


def test_the_end_is_the_recorded_finished_condition() -> None:
    recorded = _record("031-b06-finish-workload-ssa.json")["request"]
    built = build_finished_apply("tj-a", "kq-wl", succeeded=True, message="TrainingJob tj-a succeeded: all 4 pods exited 0",
                                 time=recorded["body"]["status"]["conditions"][0]["lastTransitionTime"])
    assert built == recorded["body"]
    assert recorded["query"] == {"fieldManager": "railyard-operator"}


@pytest.mark.parametrize(("gang", "labels", "queue"), [
    ({"queueName": "team-a"}, {}, "team-a"),
    ({}, {"kueue.x-k8s.io/queue-name": "team-b"}, "team-b"),
    ({"schedulerName": "volcano", "queueName": "research"}, {}, None),  # Volcano's queue, not Kueue's
    ({}, {}, None),
])
def test_which_jobs_kueue_admits(gang: dict[str, Any], labels: dict[str, str], queue: str | None) -> None:
    assert kueue_queue(TrainingJobSpec.model_validate({"gang": gang}), labels) == queue


def _status_of(name: str) -> dict[str, Any]:
    body = _record(name)["response"]["body"]
    return {"spec": body["spec"], "status": body.get("status") or {}}


@pytest.mark.parametrize(("record", "expected"), [
    (None, CreateWorkload),
    ("007-a01-workload-create.json", StayQueued),
    ("008-a02-workload-admitted.json", Admitted),
    ("020-a21b-workload-tj-x-noqueue-status.json", StayQueued),
    ("027-b02-workload-pending.json", StayQueued),
])
def test_what_the_job_does_about_what_kueue_wrote(record: str | None, expected: type) -> None:
    workload = None if record is None else _status_of(record)
    got = decide_admission(workload, job="tj", queue="team-a")
    assert isinstance(got, expected)
    if record is None:
        return
    said = [c["message"] for c in (workload or {}).get("status", {}).get("conditions") or [] if c["type"] == "QuotaReserved"]
    if isinstance(got, StayQueued) and said:
        assert said[0] in got.message and "Workload tj" in got.message and "team-a" in got.message
    if isinstance(got, Admitted):
        assert got.cluster_queue == "railyard-cq"


def test_a_topology_assignment_is_named_as_not_honoured() -> None:
    """Kueue's Topology-Aware Scheduling assigns pods per node (107); the job says it does not
    place inside that assignment, in its Admitted condition and Event (docs/deploy.md)."""
    got = decide_admission(_status_of("107-t12-workload-tas-admitted.json"), job="tj-t1", queue="tas-q")
    assert isinstance(got, Admitted) and got.cluster_queue == "tas-cq"
    assert "(kubernetes.io/hostname: kq-tas-0 x2, kq-tas-1 x2) is not honoured" in got.message
    plain = decide_admission(_status_of("008-a02-workload-admitted.json"), job="tj-a", queue="team-a")
    assert isinstance(plain, Admitted) and "Topology" not in plain.message


# the operator, in-process ----------------------------------------------------------------------


def _nodes(count: int = 4) -> list[dict[str, Any]]:
    return [make_node(f"node-{i}", gpus=2, leaf=f"leaf-{i // 2}") for i in range(count)]


def _job(name: str, **gang: Any) -> dict[str, Any]:
    return make_job(name, gang={"queueName": "team-a", **gang})


async def _admitted_and_running(h: Harness) -> None:
    await h.cycle()
    h.cluster.kueue.schedule()
    await h.cycle(1.0)
    h.run_pods()
    await h.cycle(1.0)
    for o in h.all_report():
        assert o is not None
    await h.cycle(1.0)
    assert h.status.phase == "Running", h.cluster.events


async def test_no_pod_before_admission_and_the_job_queued_meanwhile() -> None:
    h = Harness(_nodes(), _job("a"))
    await h.cycle()
    assert h.status.phase == "Queued" and h.cluster.pods == {}
    [workload] = h.cluster.kueue.workloads.values()
    assert workload["metadata"]["ownerReferences"][0]["name"] == "a" and workload["spec"]["queueName"] == "team-a"
    h.cluster.kueue.schedule()
    await h.cycle(1.0)
    admitted = find_condition(h.status.conditions, "Admitted")
    assert admitted is not None and admitted.status == "True" and "railyard-cq" in admitted.message
    assert "Admitted" in h.reasons()
    assert h.status.phase in ("Placing", "Starting") and len(h.cluster.pods_of(0)) == 2
    for pod in h.cluster.pods_of(0):
        assert not set(KUEUE_POD_LABELS) & set(pod["metadata"]["labels"])


async def test_two_jobs_quota_for_one_the_second_waits_in_kueues_words_and_starts_after_the_first() -> None:
    kueue = FakeKueue(gpus=4)  # make_job: 2 pods x 2 GPUs: one job fits
    first = Harness(_nodes(), _job("a"), kueue=kueue)
    second = Harness(_nodes(), _job("b"), kueue=kueue)
    await _admitted_and_running(first)
    await second.cycle()
    kueue.schedule()
    await second.cycle(2.0)
    st = second.status
    assert st.phase == "Queued" and second.cluster.pods == {}
    waiting = find_condition(st.conditions, "Admitted")
    assert waiting is not None and waiting.status == "False" and waiting.reason == "Pending"
    assert "insufficient unused quota for nvidia.com/gpu in flavor gpu-a100, 4 more needed" in waiting.message
    assert "Workload b in LocalQueue team-a" in st.message
    for i in range(2):
        first.exit_pod(i, 0)
    await first.cycle(1.0)
    assert first.status.phase == "Succeeded"
    finished = kueue.workloads[("ns", "a")]["status"]["conditions"]
    assert any(c["type"] == "Finished" and c["status"] == "True" and c["reason"] == "Succeeded" for c in finished)
    kueue.schedule()
    await second.cycle(2.0)
    assert second.status.phase in ("Placing", "Starting") and len(second.cluster.pods_of(0)) == 2


@pytest.mark.parametrize("fault", ["exit", "node"])
async def test_a_restart_stays_inside_the_admission(fault: str) -> None:
    """A rank's failure or a node's loss: the replacement is created at once, inside the running
    admission (no second Workload, no quota held twice, no wait in the queue)."""
    kueue = FakeKueue(gpus=4)
    h = Harness(_nodes(), _job("a"), kueue=kueue)
    await _admitted_and_running(h)
    if fault == "exit":
        h.exit_pod(1, 1, message="CUDA error: an illegal memory access was encountered")
    else:
        h.node_down(h.pod_nodes()[1])
    for _ in range(6):
        await h.cycle(2.0)
        h.cluster.finish_deletions()
        if h.status.attempt >= 1 and h.cluster.pods_of(h.status.attempt):
            break
    assert h.status.attempt >= 1 and h.cluster.pods_of(h.status.attempt), h.reasons()
    assert h.status.phase != "Queued"
    assert [c for c in h.cluster.calls if c[1].startswith("Workload/")] == [("create", "Workload/a")]
    assert len(kueue.workloads) == 1 and kueue.used_gpus() == 4, "one Workload, its quota held once"


async def test_a_queued_job_deleted_leaves_no_workload() -> None:
    h = Harness(_nodes(), _job("a"))
    await h.cycle()
    assert h.status.phase == "Queued" and len(h.cluster.kueue.workloads) == 1
    h.worker.body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:10Z"
    await h.cycle(1.0)
    assert h.cluster.kueue.workloads == {} and h.cluster.pods == {}


async def test_a_running_job_deleted_leaves_no_workload_and_no_pod() -> None:
    kueue = FakeKueue(gpus=4)
    h = Harness(_nodes(), _job("a"), kueue=kueue)
    await _admitted_and_running(h)
    assert h.status.phase == "Running" and len(h.cluster.pods_of(0)) == 2 and kueue.used_gpus() == 4
    h.worker.body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:10Z"
    await h.cycle(1.0)
    h.cluster.finish_deletions()
    await h.cycle(1.0)
    assert kueue.workloads == {} and h.cluster.pods == {} and kueue.used_gpus() == 0


async def test_a_lost_node_restarts_the_admitted_gang_in_place_and_the_job_finishes() -> None:
    """The acceptance of issue 48: a node failure under a Kueue-admitted gang is restarted in
    place (the lost pod moves to the spare, the others stay) inside the same admission: no second
    Workload, the quota held once, never Queued; the job then finishes and its Workload with it."""
    kueue = FakeKueue(gpus=6)  # 2 pods x 2 GPUs and 1 hot spare of 2: the Workload's two pod sets
    h = Harness(_nodes(), _job("a", hotSpares=1), kueue=kueue)
    await h.cycle()
    kueue.schedule()
    await h.cycle(1.0)
    h.run_pods()
    for _ in range(2):
        for spare in h.cluster.pods_of(spare=True):
            spare["status"] = {"phase": "Running"}
        await h.cycle(1.0)
    assert all(order.action is Action.CONTINUE for order in h.all_report())
    await h.cycle(1.0)
    assert h.status.phase == "Running", h.reasons()
    h.node_down(h.pod_nodes()[1])
    await h.cycle(5.0)
    st = h.status
    assert st.last_restart is not None and st.last_restart.mode == "InPlace" and st.attempt == 1, st.last_restart
    h.cluster.finish_deletions()
    await h.cycle(0.5)
    h.run_pods()
    await h.cycle(0.5)
    assert h.report(0, "failed", attempt=0, code=70).action is Action.RESTART
    h.report(0, "running", attempt=1)
    h.report(1, "running", attempt=1)
    await h.cycle(0.5)
    restart = h.status.last_restart
    assert h.status.phase == "Running" and restart is not None and restart.state == "Done", h.reasons()
    assert [c for c in h.cluster.calls if c[1].startswith("Workload/")] == [("create", "Workload/a")]
    assert len(kueue.workloads) == 1 and kueue.used_gpus() == 6, "one Workload, its quota held once"
    for member in h.members():
        member_pod = h.cluster.pods[member["metadata"]["name"]]
        member_pod["status"] = {"phase": "Succeeded", "containerStatuses": [
            {"name": "trainer", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}
    await h.cycle(1.0)
    await h.cycle(1.0)
    assert h.status.phase == "Succeeded", h.reasons()
    assert is_true(kueue.workloads[("ns", "a")], "Finished") and kueue.used_gpus() == 0


@pytest.mark.parametrize(("labels", "gang", "classes", "expected"), [
    ({}, {"priorityClassName": "high"}, {(False, "high"): 1000},
     {"priority": 1000, "priorityClassName": "high", "priorityClassSource": "scheduling.k8s.io/priorityclass"}),
    ({"kueue.x-k8s.io/priority-class": "wl-low"}, {}, {(True, "wl-low"): 100},
     {"priority": 100, "priorityClassName": "wl-low", "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass"}),
    ({}, {"priorityClassName": "missing"}, {}, {}),
])
async def test_the_priority_kueue_reads_is_the_classs_value(labels: dict[str, str], gang: dict[str, Any],
                                                           classes: dict[tuple[bool, str], int], expected: dict[str, Any]) -> None:
    job = _job("a", **gang)
    job["metadata"]["labels"] = labels
    h = Harness(_nodes(), job)
    h.cluster.priority_classes = classes
    await h.cycle()
    [workload] = h.cluster.kueue.workloads.values()
    got = {k: workload["spec"][k] for k in ("priority", "priorityClassName", "priorityClassSource") if k in workload["spec"]}
    assert got == expected


async def test_a_gang_of_64_pods_is_admitted_whole() -> None:
    kueue = FakeKueue(gpus=128)
    h = Harness(_nodes(64), make_job("big", nodes=64, gang={"queueName": "team-a"}), kueue=kueue)
    await h.cycle()
    [workload] = kueue.workloads.values()
    assert [(p["name"], p["count"]) for p in workload["spec"]["podSets"]] == [("workers", 64)]
    kueue.schedule()
    await h.cycle(1.0)
    assert len(h.cluster.pods_of(0)) == 64 and kueue.used_gpus() == 128


async def test_the_gang_is_placed_on_nodes_of_the_admitted_flavor() -> None:
    """Kueue's admission names a flavor, not nodes (008); the flavor's nodeLabels and tolerations
    (the recorded ResourceFlavor, 012) select the nodes our placement chooses from and go on the pods."""
    kueue = FakeKueue(gpus=8)
    kueue.flavors["gpu-a100"] = _record("012-a06-resourceflavor.json")["response"]["body"]
    nodes = _nodes(4)
    for node in nodes[2:]:
        node["metadata"]["labels"]["railyard.dev/pool"] = "a100"
    h = Harness(nodes, _job("a", hotSpares=0), kueue=kueue)
    await h.cycle()
    kueue.schedule()
    await h.cycle(1.0)
    assert sorted(h.pod_nodes(0)) == ["node-2", "node-3"]
    for pod in h.cluster.pods_of(0):
        assert pod["spec"]["nodeSelector"] == {"railyard.dev/pool": "a100"}
        assert {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"} in pod["spec"]["tolerations"]


def test_a_flavor_applied_twice_is_applied_once() -> None:
    flavor = merge_flavors([_record("012-a06-resourceflavor.json")["response"]["body"]])
    spec = TrainingJobSpec.model_validate({"nodeSelector": {"railyard.dev/pool": "mine", "zone": "a"}})
    once = apply_flavor(spec, flavor)
    assert once.node_selector == {"railyard.dev/pool": "mine", "zone": "a"}, "the job's own choice wins"
    assert apply_flavor(once, flavor) == once and len(once.tolerations) == 1


# eviction: preemption and deactivation ---------------------------------------------------------


def test_the_eviction_is_acknowledged_as_recorded() -> None:
    """From the deactivated Workload as Kueue left it (051) to the recorded acknowledgement (054):
    every condition of that type, status and reason, ``status.admission`` removed, conditional on
    the resourceVersion."""
    got_there = _record("051-d03-deactivated-workload.json")["response"]["body"]
    workload = {"metadata": {"resourceVersion": "624", "generation": 2}, "status": got_there["status"]}
    assert isinstance(decide_admission(workload, job="tj-b", queue="team-a"), Evict)
    sent = _record("054-d06-ack-deactivation-merge.json")["request"]
    built = build_eviction_ack(workload, time="2026-12-07T02:51:50Z")
    assert sent["contentType"] == "application/merge-patch+json" and sent["path"].endswith("/status")
    assert built["metadata"] == sent["body"]["metadata"] and built["status"]["admission"] is None
    as_set = sorted((c["type"], c["status"], c["reason"]) for c in built["status"]["conditions"])
    assert as_set == sorted((c["type"], c["status"], c["reason"]) for c in sent["body"]["status"]["conditions"])
    requeued = next(c for c in built["status"]["conditions"] if c["type"] == "Requeued")
    assert requeued == next(c for c in sent["body"]["status"]["conditions"] if c["type"] == "Requeued")


def beat(h: Harness, step: int, *, saved: int = -1) -> None:
    """Every rank of the gang (2 pods of 2 ranks) reports ``step``; a committed memory save at ``saved``."""
    for pod, node in enumerate(h.pod_nodes()):
        done = (CheckpointEvent(step=saved, tier="memory", ok=True),) if saved >= 0 else ()
        batch = HeartbeatBatch(job=h.worker.name, attempt=h.status.attempt, pod_index=pod, node=node, sent_at=h.now,
                               ranks=tuple(RankBeat(rank=r, step=step, step_time_s=1.0, compute_s=0.9, loss=2.5,
                                                    tokens_per_s=100.0) for r in (2 * pod, 2 * pod + 1)),
                               checkpoints=done)
        h.runtime.store.ingest("ns", h.worker.name, batch, h.now)


def _with_priority(name: str, cls: str) -> dict[str, Any]:
    return _job(name, priorityClassName=cls)


async def test_a_higher_priority_job_evicts_a_running_one_which_stops_requeues_and_resumes() -> None:
    kueue = FakeKueue(gpus=4)
    low = Harness(_nodes(), _with_priority("low", "low"), kueue=kueue)
    high = Harness(_nodes(), _with_priority("high", "high"), kueue=kueue)
    for h in (low, high):
        h.cluster.priority_classes = {(False, "low"): 100, (False, "high"): 1000}
    await _admitted_and_running(low)
    await high.cycle()
    kueue.schedule()
    said = [c["message"] for c in kueue.workloads[("ns", "high")]["status"]["conditions"] if c["type"] == "QuotaReserved"]
    assert said and said[0].endswith("Pending the preemption of 1 workload(s)")  # record 039
    # Kueue holds the quota until acknowledged: the gang first saves at a step boundary (issue 47)
    beat(low, 7, saved=5)
    await low.cycle(2.0)
    target = 7 + LEAD_STEPS
    assert low.status.phase == "Running" and not any(p["metadata"].get("deletionTimestamp") for p in low.cluster.pods_of(0))
    assert [(o.action, o.save_step) for o in low.all_report()] == [(Action.SAVE, target)] * 2
    assert any(r == "SavingBeforeStop" and "Kueue's eviction (Preempted)" in m for _, r, m in low.cluster.events)
    beat(low, target, saved=target)
    await low.cycle(1.0)
    st = low.status
    assert st.phase == "Queued" and find_condition(st.conditions, "Admitted").reason == "Preempted"  # type: ignore[union-attr]
    assert "Preempted to accommodate a workload" in st.message
    assert f"resumes from the just-in-time save at step {target}" in st.message
    assert all(p["metadata"]["name"] in low.worker.deleting for p in low.cluster.pods_of(0)), "then the pods go"
    placed = low.pod_nodes(0)
    assert kueue.used_gpus() == 4, "Kueue holds the quota until the owner acknowledges (041)"
    low.cluster.finish_deletions()
    await low.cycle(2.0)
    assert low.cluster.pods_of() == [] and ("acknowledge", "Workload/low") in low.cluster.calls
    assert "admission" not in kueue.workloads[("ns", "low")]["status"] and kueue.used_gpus() == 0
    kueue.schedule()
    await high.cycle(2.0)
    assert len(high.cluster.pods_of(0)) == 2, "the preemptor starts once the quota is released"
    await low.cycle(2.0)
    assert low.status.phase == "Queued" and "insufficient unused quota" in low.status.message and low.cluster.pods_of() == []
    high.run_pods()
    for i in range(2):
        high.exit_pod(i, 0)
    await high.cycle(1.0)
    await high.cycle(1.0)
    assert high.status.phase == "Succeeded"
    kueue.schedule()
    await low.cycle(2.0)
    assert low.status.attempt == 1 and len(low.cluster.pods_of(1)) == 2, "the next attempt, inside the new admission"
    # readmitted, it restores the save, on the nodes whose memory holds it: its first step is the saved one + 1
    config = json.loads(low.cluster.objects[("ConfigMap", configmap_name("low", 1))]["data"]["config.json"])
    assert (config["restore"]["tier"], config["restore"]["step"]) == ("memory", target), config["restore"]
    assert low.pod_nodes(1) == placed
    assert [c for c in low.cluster.calls if c[1] == "Workload/low" and c[0] == "create"] == [("create", "Workload/low")]


async def test_a_deactivated_job_stops_at_once_and_waits() -> None:
    kueue = FakeKueue(gpus=4)
    h = Harness(_nodes(), _job("a"), kueue=kueue)
    await _admitted_and_running(h)
    kueue.deactivate("ns", "a")
    assert kueue.used_gpus() == 0, "a deactivated Workload frees its quota at once (052)"
    await h.cycle(2.0)
    assert h.status.phase == "Queued" and find_condition(h.status.conditions, "Admitted").reason == "Deactivated"  # type: ignore[union-attr]
    assert all(name in h.worker.deleting for name in (p["metadata"]["name"] for p in h.cluster.pods_of(0)))
    h.cluster.finish_deletions()
    await h.cycle(2.0)
    requeued = [c for c in kueue.workloads[("ns", "a")]["status"]["conditions"] if c["type"] == "Requeued"]
    assert requeued and requeued[0]["status"] == "False" and requeued[0]["reason"] == "Deactivated"
    await h.cycle(2.0)
    assert h.status.phase == "Queued" and h.cluster.pods_of() == []


# the docs' example: a queue, a quota and two jobs, one waiting -----------------------------------


def _example() -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all(EXAMPLE.read_text())}


def test_the_examples_kueue_objects_are_the_recorded_ones() -> None:
    """What a real Kueue v0.13.1 ran with (000-002), in a namespace of the reader's choosing, and
    valid against Kueue's published schemas."""
    import jsonschema

    example = _example()
    for name, record in (("gpu-a100", "000-s00-resourceflavor-create.json"), ("railyard-cq", "001-s01-clusterqueue-create.json"),
                         ("team-a", "002-s02-localqueue-create.json")):
        recorded = _record(record)["request"]["body"]
        recorded["metadata"].pop("namespace", None)
        assert example[name] == recorded
        kind = example[name]["kind"]
        vendored = json.loads((SCHEMAS / f"kueue.x-k8s.io_{KUEUE_KINDS[kind]}_{kind}.json").read_text())
        jsonschema.validate(example[name], vendored["openAPIV3Schema"])


async def test_the_examples_second_job_waits_queued_until_the_first_finished() -> None:
    example = _example()
    [gpus] = [r["nominalQuota"] for r in example["railyard-cq"]["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
              if r["name"] == "nvidia.com/gpu"]
    kueue = FakeKueue(gpus=int(gpus))
    kueue.flavors["gpu-a100"] = example["gpu-a100"]
    nodes = _nodes(4)
    for node in nodes:
        node["metadata"]["labels"]["railyard.dev/pool"] = "a100"
    first = Harness(nodes, {**make_job("first"), "spec": example["first"]["spec"]}, kueue=kueue)
    second = Harness(nodes, {**make_job("second"), "spec": example["second"]["spec"]}, kueue=kueue)
    await _admitted_and_running(first)
    await second.cycle()
    kueue.schedule()
    await second.cycle(2.0)
    assert first.status.phase == "Running" and second.status.phase == "Queued" and second.cluster.pods == {}
    waiting = find_condition(second.status.conditions, "Admitted")
    assert waiting is not None and (waiting.status, waiting.reason) == ("False", "Pending")
    # what docs/deploy.md shows the reader, word for word
    assert second.status.message == waiting.message
    assert f"message: {waiting.message}" in " ".join(DEPLOY_DOC.read_text().split())
    for i in range(2):
        first.exit_pod(i, 0)
    await first.cycle(1.0)
    assert first.status.phase == "Succeeded"
    kueue.schedule()
    await second.cycle(2.0)
    assert second.status.phase in ("Placing", "Starting") and len(second.cluster.pods_of(0)) == 2
