"""Kueue admits TrainingJobs on the local cluster (issue 48): the operator process, the embedded API
server serving Kueue's Workload CRD (vendored), and the test playing Kueue's part as the record
shows it (tests/operator/fake_kueue.py: a ClusterQueue with a quota of 2 GPUs, LocalQueue
team-a). Two jobs of 2 GPUs each: the second stays Queued, without a pod, with Kueue's reason in
its condition, and starts when the first finished; deleting a job deletes its Workload."""

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
            api.custom.patch_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, key[1], {"status": wl["status"]})


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
        wait_until(lambda: second not in _workloads(api), timeout=60, message="the deleted job's Workload gone",
                   retry_on=(Exception,))
    except BaseException:
        print(on_exit_dump(api, NS, second, operator))
        print(on_exit_dump(api, NS, first, operator))
        raise
    finally:
        api.delete_job(NS, first)
        api.delete_job(NS, second)
