"""A finished job keeps the finished pods of its last attempt (for kubectl logs and exit codes)
until spec.cleanup.ttlSecondsAfterFinished, deletes everything else at once, and a kept pod
never counts as using GPUs. Pure rules table-driven; the cycle in-process (fake cluster)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from tests.operator.builders import make_node, make_pod
from tests.operator.fake_cluster import Harness, make_job

from railyard.api.trainingjob import Cleanup, TrainingJob
from railyard.handlers import kopf_handlers
from railyard.logic.conditions import find_condition
from railyard.logic.finished import decide_finished_pods
from railyard.logic.placement import Placement, build_placement_input, plan_placement
from railyard.protocol.heartbeat import HeartbeatBatch, RankBeat

T0 = 1_767_225_600.0


@dataclass(frozen=True)
class Case:
    name: str
    #: the pods, a letter each: S succeeded, F failed, R running, D failed and being deleted,
    #: o failed in an earlier attempt, p a running pod of the job that is no gang member (a placeholder)
    pods: str
    job_phase: str
    policy: str
    ttl: int
    age: float  # seconds since the job finished
    kept: str  # indices of the pods kept, e.g. "01"
    due_in: float | None
    settling: str = ""  # indices of running members given time to exit


CASES = [
    Case("success keeps every finished pod", "SS", "Succeeded", "Keep", 600, 0, "01", 600),
    Case("a running peer gets time to exit", "FR", "Failed", "Keep", 600, 10, "0", 20, settling="1"),
    Case("then it is deleted", "FR", "Failed", "Keep", 600, 30, "0", 570),
    Case("a placeholder goes at once", "Sp", "Succeeded", "Keep", 600, 0, "0", 600),
    Case("pods of earlier attempts go", "oF", "Failed", "Keep", 600, 0, "1", 600),
    Case("a pod being deleted is not kept", "DF", "Failed", "Keep", 600, 0, "1", 600),
    Case("the TTL is up", "SS", "Succeeded", "Keep", 600, 600, "", None),
    Case("TTL 0 deletes at once", "SS", "Succeeded", "Keep", 0, 0, "", None),
    Case("Delete keeps nothing", "FF", "Failed", "Delete", 600, 0, "", None),
    Case("KeepFailed keeps a failure's pods", "FF", "Failed", "KeepFailed", 600, 0, "01", 600),
    Case("KeepFailed keeps nothing of a success", "SS", "Succeeded", "KeepFailed", 600, 0, "", None),
]


def _pods(spec: str) -> list[dict[str, Any]]:
    out = []
    for i, k in enumerate(spec):
        b = make_pod(attempt=0 if k == "o" else 1, index=i, node=f"node-{i}")
        if k == "p":
            pod = b.obj()
            del pod["metadata"]["labels"]["railyard.dev/pod-index"]
            out.append(pod)
            continue
        if k == "S":
            b.exited(0)
        elif k in "FoD":
            b.exited(1)
        if k == "D":
            b.deleting()
        out.append(b.obj())
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_which_pods_a_finished_job_keeps(case: Case) -> None:
    pods = _pods(case.pods)
    done = decide_finished_pods(pods, job_phase=case.job_phase, attempt=1, cleanup=Cleanup(pods=case.policy, ttl_seconds_after_finished=case.ttl),  # type: ignore[arg-type]
                                completion_time=T0, now=T0 + case.age)
    kept = "".join(p["metadata"]["labels"]["railyard.dev/pod-index"] for p in done.keep)
    settling = "".join(p["metadata"]["labels"]["railyard.dev/pod-index"] for p in done.settling)
    assert (kept, settling) == (case.kept, case.settling)
    assert len(done.keep) + len(done.settling) + len(done.delete) == len(pods), "every pod is decided"
    assert done.due_in == (pytest.approx(case.due_in) if case.due_in is not None else None)


def test_an_attempt_started_in_place_keeps_its_kept_pods_and_its_replacements() -> None:
    # attempt 0 created pods 0..2; attempt 1 started in place: pod 1 replaced, 0 and 2 kept
    kept0 = make_pod(attempt=0, index=0, node="node-0").exited(0).obj()
    old1 = make_pod(attempt=0, index=1, node="node-1").exited(1).obj()
    new1 = make_pod(attempt=1, index=1, node="node-3").exited(0).obj()
    kept2 = make_pod(attempt=0, index=2, node="node-2").exited(0).obj()
    pods = [kept0, old1, new1, kept2]
    done = decide_finished_pods(pods, job_phase="Succeeded", attempt=1, cleanup=Cleanup(), completion_time=T0, now=T0, since=0)
    assert [p["metadata"]["name"] for p in done.keep] == [kept0["metadata"]["name"], new1["metadata"]["name"], kept2["metadata"]["name"]]
    assert done.delete == (old1,)
    # without ``since`` (a full restart) only pods of the last attempt are members
    full = decide_finished_pods(pods, job_phase="Succeeded", attempt=1, cleanup=Cleanup(), completion_time=T0, now=T0)
    assert full.keep == (new1,)


def test_the_defaults_keep_pods_for_a_day() -> None:
    assert TrainingJob.model_validate({"spec": {}}).spec.cleanup == Cleanup(pods="Keep", ttl_seconds_after_finished=86400)


def cluster(n: int = 4) -> list[dict[str, Any]]:
    return [make_node(f"node-{i}", gpus=2, leaf=f"leaf-{i // 2}") for i in range(n)]


async def _finished(h: Harness, code: int = 0) -> None:
    await h.cycle()
    h.run_pods()
    await h.cycle(1.0)
    for i in range(2):
        h.exit_pod(i, code)
    await h.cycle(1.0)


async def test_kept_pods_go_when_their_ttl_is_up_and_the_cycle_is_due_then() -> None:
    h = Harness(cluster(), make_job(cleanup={"ttlSecondsAfterFinished": 120}))
    await _finished(h)
    assert h.status.phase == "Succeeded" and len(h.cluster.pods_of(0)) == 2
    assert h.delays[-1] == pytest.approx(120.0), "the worker looks again when the TTL is up"
    await h.cycle(60.0)
    assert len(h.cluster.pods_of(0)) == 2 and h.delays[-1] == pytest.approx(60.0)
    await h.cycle(60.0)
    assert not h.cluster.pods_of(0), "deleted at the TTL"
    assert h.status.phase == "Succeeded" and h.status.completion_time is not None, "the job and its status stay"


async def test_a_peer_still_running_when_the_job_failed_may_exit_on_its_own_or_is_deleted() -> None:
    h = Harness(cluster(), make_job(restartPolicy={"application": {"limit": 0}}))
    await h.cycle()
    h.run_pods()
    await h.cycle(1.0)
    h.exit_pod(0, 1)
    await h.cycle(1.0)
    assert h.status.phase == "Failed" and h.delays[-1] == pytest.approx(30.0)
    h.exit_pod(1, 70)  # the peer sees the broken collective and exits: kept, with its last words
    await h.cycle(5.0)
    assert [p["status"]["phase"] for p in h.cluster.pods_of(0)] == ["Failed", "Failed"]
    assert not any(c[0] == "delete" for c in h.cluster.calls)

    h2 = Harness(cluster(), make_job(restartPolicy={"application": {"limit": 0}}))
    await h2.cycle()
    h2.run_pods()
    await h2.cycle(1.0)
    h2.exit_pod(0, 1)
    await h2.cycle(1.0)
    await h2.cycle(29.0)
    assert len(h2.cluster.pods_of(0)) == 2 and not any(p["metadata"].get("deletionTimestamp") for p in h2.cluster.pods_of(0))
    await h2.cycle(1.0)  # a peer that is still running after the settle time is deleted
    phases = {p["metadata"]["name"]: (p["status"]["phase"], bool(p["metadata"].get("deletionTimestamp"))) for p in h2.cluster.pods_of(0)}
    assert phases == {"j-a0-0": ("Failed", False), "j-a0-1": ("Running", True)}


async def test_a_shorter_ttl_set_after_the_finish_applies_at_once() -> None:
    h = Harness(cluster(), make_job())
    await _finished(h, code=64)
    assert h.status.phase == "Failed" and len(h.cluster.pods_of(0)) == 2
    h.edit_spec(cleanup={"ttlSecondsAfterFinished": 0})
    await h.cycle(1.0)
    assert not h.cluster.pods_of(0)
    assert h.status.phase == "Failed", "a finished job stays finished on an edit"


def _gpu_free(placed: Any) -> bool:
    return isinstance(placed, Placement)


async def test_a_finished_pod_in_the_operators_index_leaves_its_gpus_free() -> None:
    # what kopf stores for a pod of another job that finished on node-0 (the index handler as
    # kopf calls it, on the pod's last event): placement must see its node as free
    finished = make_pod(job="other", attempt=0, index=0, node="node-0").exited(0).obj()
    finished["spec"]["containers"] = [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "2"}}}]
    running = {**finished, "status": {"phase": "Running"}}
    job = TrainingJob.model_validate({"metadata": {"name": "j", "namespace": "ns"}, "spec": {"nodes": 1, "procsPerNode": 2}})
    nodes = [make_node("node-0", gpus=2)]

    async def place(pod: dict[str, Any]) -> Any:
        indexed = await kopf_handlers.railyard_bound_pods(spec=pod["spec"], body=pod, status=pod["status"])
        assert indexed is not None, "bound pods are indexed whatever their phase (kopf keeps the last value of a None)"
        return plan_placement(build_placement_input(job, nodes=nodes, pods=list(indexed.values())))

    assert not _gpu_free(await place(running)), "a running pod holds its GPUs"
    assert _gpu_free(await place(finished)), "a finished pod holds none"


def _beats(h: Harness, step: int, slow_compute: float) -> None:
    for pod, ranks, compute in ((0, (0, 1), 0.3), (1, (2, 3), slow_compute)):
        beat = HeartbeatBatch(job="j", attempt=0, pod_index=pod, node=h.pod_nodes()[pod], sent_at=h.now,
                              ranks=tuple(RankBeat(rank=r, step=step, step_time_s=1.0, compute_s=compute, loss=2.0, tokens_per_s=10.0) for r in ranks))
        h.runtime.store.ingest("ns", "j", beat, h.now)


async def test_no_health_warning_after_the_job_finished() -> None:
    h = Harness(cluster(), make_job(health={"straggler": {"windowSteps": 3}}))
    await h.cycle()
    h.run_pods()
    await h.cycle(1.0)
    for step in range(1, 6):
        _beats(h, step, 0.3)
        await h.cycle(1.0)
    # the last steps' beats show rank 2-3's pod 3x slower, and arrive with the gang's exit: the
    # cycle that sees the success is the first to see them
    for step in range(6, 12):
        _beats(h, step, 0.9)
    for i in range(2):
        h.exit_pod(i, 0)
    events_before = len(h.cluster.events)
    await h.cycle(1.0)
    await h.cycle(1.0)
    after = h.cluster.events[events_before:]
    assert [r for _, r, _ in after] == ["AllRanksSucceeded"], after
    degraded = find_condition(h.status.conditions, "Degraded")
    assert degraded is None or degraded.status == "False"
    assert h.status.stragglers == [] and h.status.step == 11, "progress is still recorded"


async def test_a_job_degraded_when_it_finishes_is_not_degraded_after_and_says_nothing() -> None:
    h = Harness(cluster(), make_job(health={"straggler": {"windowSteps": 3}}))
    await h.cycle()
    h.run_pods()
    await h.cycle(1.0)
    for step in range(1, 12):
        _beats(h, step, 0.9)
        await h.cycle(1.0)
    degraded = find_condition(h.status.conditions, "Degraded")
    assert degraded is not None and degraded.status == "True" and h.status.stragglers, h.cluster.events
    for i in range(2):
        h.exit_pod(i, 0)
    events_before = len(h.cluster.events)
    await h.cycle(1.0)
    after = h.cluster.events[events_before:]
    assert [r for _, r, _ in after] == ["AllRanksSucceeded"], after
    degraded = find_condition(h.status.conditions, "Degraded")
    assert degraded is not None and (degraded.status, degraded.reason) == ("False", "Finished")
    assert h.status.stragglers == []
