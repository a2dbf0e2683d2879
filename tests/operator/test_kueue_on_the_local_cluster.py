"""Kueue admits TrainingJobs on the local cluster (issue 48): the operator process, the embedded API
server serving Kueue's Workload CRD (vendored), and the test playing Kueue's part as the record
shows it (tests/operator/fake_kueue.py: a ClusterQueue with a quota of 2 GPUs, LocalQueue
team-a). Two jobs of 2 GPUs each: the second stays Queued, without a pod, with Kueue's reason in
its condition, and starts when the first finished; deleting a running job leaves no Workload and
no pod."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
from tests.operator.conftest import MAIN_NS as NS
from tests.operator.conftest import (
    Api,
    OperatorProcess,
    Workload,
    _apply_crd,
    base_spec,
    on_exit_dump,
)
from tests.operator.fake_kueue import FakeKueue, kueue_workload_crd
from tests.waiting import wait_until

GROUP, VERSION, PLURAL = "kueue.x-k8s.io", "v1beta1", "workloads"


def _workloads(api: Api) -> dict[str, dict[str, Any]]:
    items = api.custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"]
    return {w["metadata"]["name"]: w for w in items}


def play_kueue(api: Api, kueue: FakeKueue, names: list[str]) -> None:
    """One pass of Kueue's scheduler over the jobs' Workloads (in ``names`` order, as created):
    what it decides is written on ``/status`` as Kueue writes it."""
    live = _workloads(api)
    kueue.workloads = {(NS, n): copy.deepcopy(live[n]) for n in names if n in live}
    before = {k: copy.deepcopy(w.get("status")) for k, w in kueue.workloads.items()}
    kueue.schedule()
    for key, wl in kueue.workloads.items():
        if wl.get("status") != before[key]:
            # as Kueue writes: server-side apply with its field manager (record 008), which the
            # owner's acknowledgement of an eviction (same manager, forced) can then take back
            body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Workload", "metadata": {"name": key[1]}, "status": wl["status"]}
            api.custom.patch_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, key[1], body, field_manager="kueue-admission",
                                                             force=True, _content_type="application/apply-patch+yaml")


def _admitted(api: Api, job: str) -> dict[str, Any] | None:
    return api.condition(NS, job, "Admitted")


@pytest.mark.cluster
def test_two_jobs_one_quota_the_second_queued_until_the_first_finished(
    api: Api, operator: OperatorProcess, workload: Workload, tmp_path: Path, job_name: str,
) -> None:
    asyncio.run(_apply_crd(api.kubeconfig, kueue_workload_crd()))
    wait_until(lambda: _workloads(api) is not None, timeout=30, message="Workloads served", retry_on=(Exception,))
    first, second = f"{job_name}-a", f"{job_name}-b"
    other = Workload(tmp_path / "control-b")
    kueue = FakeKueue(gpus=2)
    api.create_job(NS, first, base_spec(workload, gang={"scheduleTimeoutSeconds": 60, "queueName": "team-a"}))
    try:
        wait_until(lambda: first in _workloads(api) and api.status(NS, first).get("phase") == "Queued", timeout=60,
                   message="the first job Queued with its Workload", retry_on=(Exception,))
        assert api.pods(NS, first) == [], "no pod before the admission"
        api.create_job(NS, second, base_spec(other, gang={"scheduleTimeoutSeconds": 60, "queueName": "team-a"}))
        wait_until(lambda: second in _workloads(api), timeout=60, message="the second Workload", retry_on=(Exception,))
        play_kueue(api, kueue, [first, second])
        wait_until(lambda: api.status(NS, first).get("phase") == "Running", timeout=90, message="the first job Running",
                   retry_on=(Exception,))
        owner = _workloads(api)[first]["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "TrainingJob" and owner["name"] == first
        for pod in api.pods(NS, first):
            assert not any(k.startswith("kueue.x-k8s.io/") for k in pod.metadata.labels or {})

        def waits_in_kueues_words() -> bool:
            cond = _admitted(api, second)
            return bool(cond and cond["status"] == "False" and "2 more needed" in cond.get("message", ""))

        wait_until(waits_in_kueues_words, timeout=60, message="the second job's reason from Kueue", retry_on=(Exception,))
        assert api.status(NS, second)["phase"] == "Queued" and api.pods(NS, second) == []

        workload.exit(0)
        wait_until(lambda: api.status(NS, first).get("phase") == "Succeeded", timeout=90, message="the first job done",
                   retry_on=(Exception,))

        def finished() -> bool:
            conds = _workloads(api)[first].get("status", {}).get("conditions") or []
            return any(c["type"] == "Finished" and c["status"] == "True" for c in conds)

        wait_until(finished, timeout=30, message="the first Workload Finished", retry_on=(Exception,))
        play_kueue(api, kueue, [first, second])
        wait_until(lambda: api.status(NS, second).get("phase") == "Running", timeout=90, message="the second job Running",
                   retry_on=(Exception,))
        api.delete_job(NS, second)
        wait_until(lambda: second not in _workloads(api) and api.pods(NS, second) == [], timeout=60,
                   message="the deleted running job's Workload and pods gone", retry_on=(Exception,))
    except BaseException:
        print(on_exit_dump(api, NS, second, operator))
        print(on_exit_dump(api, NS, first, operator))
        raise
    finally:
        api.delete_job(NS, first)
        api.delete_job(NS, second)


def _ensure_priority_class(api: Api, name: str, value: int) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        client.SchedulingV1Api(api.client).create_priority_class({"metadata": {"name": name}, "value": value})
    except ApiException as exc:
        if exc.status != 409:
            raise


@pytest.mark.cluster
def test_a_higher_priority_job_preempts_a_running_one_which_requeues_and_resumes(
    api: Api, operator: OperatorProcess, workload: Workload, tmp_path: Path, job_name: str,
) -> None:
    asyncio.run(_apply_crd(api.kubeconfig, kueue_workload_crd()))
    wait_until(lambda: _workloads(api) is not None, timeout=30, message="Workloads served", retry_on=(Exception,))
    _ensure_priority_class(api, "railyard-test-low", 100)
    _ensure_priority_class(api, "railyard-test-high", 1000)
    low, high = f"{job_name}-lo", f"{job_name}-hi"
    other = Workload(tmp_path / "control-hi")
    kueue = FakeKueue(gpus=2)
    gang = {"scheduleTimeoutSeconds": 60, "queueName": "team-a"}
    api.create_job(NS, low, base_spec(workload, gang={**gang, "priorityClassName": "railyard-test-low"}))
    try:
        wait_until(lambda: low in _workloads(api), timeout=60, message="the low Workload", retry_on=(Exception,))
        assert _workloads(api)[low]["spec"]["priority"] == 100, "Kueue reads only spec.priority: the class's value"
        play_kueue(api, kueue, [low])
        wait_until(lambda: api.status(NS, low).get("phase") == "Running", timeout=90, message="the low job Running",
                   retry_on=(Exception,))
        api.create_job(NS, high, base_spec(other, gang={**gang, "priorityClassName": "railyard-test-high"}))
        wait_until(lambda: high in _workloads(api), timeout=60, message="the high Workload", retry_on=(Exception,))
        play_kueue(api, kueue, [low, high])  # evicts low (038): it keeps its quota until acknowledged
        wait_until(lambda: api.status(NS, low).get("phase") == "Queued" and api.pods(NS, low) == [], timeout=90,
                   message="the low job stopped and Queued", retry_on=(Exception,))
        assert _admitted(api, low)["reason"] == "Preempted"  # type: ignore[index]

        def acknowledged() -> bool:
            status = _workloads(api)[low].get("status") or {}
            reserved = [c for c in status.get("conditions") or [] if c["type"] == "QuotaReserved"]
            return "admission" not in status and bool(reserved) and reserved[0]["status"] == "False"

        wait_until(acknowledged, timeout=60, message="the eviction acknowledged (042)", retry_on=(Exception,))
        play_kueue(api, kueue, [low, high])
        wait_until(lambda: api.status(NS, high).get("phase") == "Running", timeout=90, message="the high job Running",
                   retry_on=(Exception,))
        other.exit(0)
        wait_until(lambda: api.status(NS, high).get("phase") == "Succeeded", timeout=90, message="the high job done",
                   retry_on=(Exception,))
        wait_until(lambda: any(c["type"] == "Finished" for c in _workloads(api)[high]["status"]["conditions"]), timeout=30,
                   message="the high Workload Finished", retry_on=(Exception,))
        play_kueue(api, kueue, [low, high])
        wait_until(lambda: api.status(NS, low).get("phase") == "Running" and api.status(NS, low).get("attempt") == 1,
                   timeout=90, message="the low job readmitted and Running its next attempt", retry_on=(Exception,))
    except BaseException:
        print(on_exit_dump(api, NS, low, operator))
        print(on_exit_dump(api, NS, high, operator))
        raise
    finally:
        api.delete_job(NS, low)
        api.delete_job(NS, high)
