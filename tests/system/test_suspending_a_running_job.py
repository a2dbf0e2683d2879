"""A job stopped on purpose and started again loses no step, end to end: the REAL trainer under the
operator on the local cluster (issues 47 and 48). Before the operator deletes the gang's pods for
``spec.suspend: true`` or Kueue's preemption of its Workload, it asks the ranks for a just-in-time
save to the memory tier (a tmpfs host path that outlives the pods) and waits for the heartbeats to
report it committed; resumed (or readmitted), the next attempt is placed on the same nodes and
restores that save. Kueue's part is played as the record shows it (tests/operator/fake_kueue.py).

| step | expected |
|---|---|
| suspend (or Kueue preempts) at step >= 10 | the ranks save at one step S (``jit_save`` in the pods' events), then the pods go; the job Suspended (Queued, the eviction acknowledged only then), its message naming S |
| resume (readmit) | attempt 1 restores the memory tier at S: its first step is S + 1; no step trained twice, none skipped |
| the job | Succeeds; no restart budget spent |

The figures are printed (``-s``).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from tests.operator.conftest import _apply_crd
from tests.operator.fake_kueue import FakeKueue, kueue_workload_crd
from tests.system.conftest import SYSTEM_NS, Api, OperatorProcess, base_spec, pod_events, unique, wait_status
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(420)]

STEPS = 40


def _steps(local_cluster: Any, pod: str) -> list[int]:
    return [int(e["step"]) for e in pod_events(local_cluster, SYSTEM_NS, pod) if e.get("event") == "step"]


def _training(api: Api, operator: OperatorProcess, name: str) -> dict[str, Any]:
    s = wait_status(api, name, "step 10 with a memory checkpoint",
                    lambda s: s if s.get("phase") in ("Succeeded", "Failed") or (
                        s.get("phase") == "Running" and s.get("step", 0) >= 10
                        and any(c["tier"] == "memory" for c in s.get("checkpoints") or [])) else None, 300, operator)
    assert s["phase"] == "Running", s.get("message")
    return dict(s)


def _saved_before_the_pods_went(local_cluster: Any, api: Api, name: str, stopped: dict[str, Any]) -> int:
    """The one just-in-time save the old pods made (their events outlive them), named in the job's message."""
    wait_until(lambda: api.pods(SYSTEM_NS, name) == [], timeout=60, interval=0.2, message="the gang's pods gone",
               retry_on=(Exception,))
    saves = [int(e["step"]) for e in pod_events(local_cluster, SYSTEM_NS, f"{name}-a0-0") if e.get("event") == "jit_save"]
    assert len(saves) == 1, f"one just-in-time save before the pods went: {saves}\n{stopped.get('message')}"
    assert f"resumes from the just-in-time save at step {saves[0]}" in stopped["message"], stopped["message"]
    return saves[0]


def _resumed_at_the_next_step(local_cluster: Any, api: Api, operator: OperatorProcess, name: str, *, saved: int,
                              at_stop: int, nodes: list[str], what: str) -> None:
    s = wait_status(api, name, "the job to finish", lambda s: s if s.get("phase") in ("Succeeded", "Failed") else None,
                    300, operator)
    before, after = _steps(local_cluster, f"{name}-a0-0"), _steps(local_cluster, f"{name}-a1-0")
    print(f"\n[{what}] " + json.dumps({
        "step_at_stop": at_stop, "saved": saved, "last_step_before": before[-1:], "first_step_after": after[:1],
        "restore": s.get("restore"), "restarts": s.get("restarts"), "nodes": nodes,
        "resumed_on": (s.get("placement") or {}).get("nodes"),
    }))
    assert s["phase"] == "Succeeded", f"{s.get('message')}\n{operator.log_tail(40)}"
    assert saved >= at_stop, (saved, at_stop)
    assert after and after[0] == saved + 1, f"the resumed run's first step: {after[:3]}, saved {saved}"
    assert before[-1] == saved, f"no step trained after the save: {before[-3:]}"
    assert before + after == list(range(before[0], STEPS + 1)), "no step trained twice, none skipped"
    restore = s.get("restore") or {}
    assert (restore.get("tier"), restore.get("step"), restore.get("stepsLost")) == ("memory", saved, 0), restore
    assert (s.get("restarts") or {}).get("total", 0) == 0, s.get("restarts")
    assert s["placement"]["nodes"] == nodes, "resumed on the nodes whose memory tier holds the save"


def test_a_suspended_job_resumes_at_the_step_after_its_save(
    local_cluster: Any, api: Api, operator: OperatorProcess,
) -> None:
    name = unique("suspend")
    api.create_job(SYSTEM_NS, name, base_spec(trainer={"steps": STEPS}, nodeSelector=local_cluster.node_selector))
    try:
        s = _training(api, operator, name)
        api.patch_spec(SYSTEM_NS, name, {"suspend": True})
        stopped = wait_status(api, name, "the job Suspended",
                              lambda s: s if s.get("phase") in ("Suspended", "Failed") else None, 120, operator)
        assert stopped["phase"] == "Suspended", stopped.get("message")
        saved = _saved_before_the_pods_went(local_cluster, api, name, stopped)
        api.patch_spec(SYSTEM_NS, name, {"suspend": False})
        _resumed_at_the_next_step(local_cluster, api, operator, name, saved=saved, at_stop=int(s["step"]),
                                  nodes=list(s["placement"]["nodes"]), what="suspend")
    finally:
        api.delete_job(SYSTEM_NS, name)


GROUP, VERSION, PLURAL = "kueue.x-k8s.io", "v1beta1", "workloads"


def _workload(api: Api, name: str) -> dict[str, Any]:
    return dict(api.custom.get_namespaced_custom_object(GROUP, VERSION, SYSTEM_NS, PLURAL, name))


def _kueue_writes(api: Api, name: str, decide: Callable[[FakeKueue], None]) -> None:
    """One decision of Kueue's on the job's Workload as read, written on ``/status`` as Kueue writes
    it (server-side apply, field manager kueue-admission: record 008)."""
    kueue = FakeKueue()
    kueue.workloads = {(SYSTEM_NS, name): copy.deepcopy(_workload(api, name))}
    decide(kueue)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Workload", "metadata": {"name": name},
            "status": kueue.workloads[(SYSTEM_NS, name)]["status"]}
    api.custom.patch_namespaced_custom_object_status(GROUP, VERSION, SYSTEM_NS, PLURAL, name, body,
                                                     field_manager="kueue-admission", force=True,
                                                     _content_type="application/apply-patch+yaml")


def test_a_job_preempted_by_kueue_saves_requeues_and_resumes_at_the_step_after_its_save(
    local_cluster: Any, api: Api, operator: OperatorProcess,
) -> None:
    asyncio.run(_apply_crd(api.kubeconfig, kueue_workload_crd()))
    wait_until(lambda: api.custom.list_namespaced_custom_object(GROUP, VERSION, SYSTEM_NS, PLURAL) is not None,
               timeout=30, message="Workloads served", retry_on=(Exception,))
    name = unique("evicted")
    api.create_job(SYSTEM_NS, name, base_spec(trainer={"steps": STEPS}, nodeSelector=local_cluster.node_selector,
                                              gang={"queueName": "team-a"}))
    try:
        wl = name  # one Workload per job, named as the job
        wait_until(lambda: _workload(api, wl), timeout=60, interval=0.2, message="the job's Workload", retry_on=(Exception,))
        _kueue_writes(api, wl, FakeKueue.schedule)  # admitted (008)
        s = _training(api, operator, name)
        _kueue_writes(api, wl, lambda k: k.preempt(SYSTEM_NS, wl, by="higher"))  # 038: the quota held until acknowledged
        stopped = wait_status(api, name, "the job Queued", lambda s: s if s.get("phase") in ("Queued", "Failed") else None,
                              120, operator)
        assert stopped["phase"] == "Queued" and "Preempted" in stopped["message"], stopped.get("message")
        saved = _saved_before_the_pods_went(local_cluster, api, name, stopped)

        def acknowledged() -> bool:
            status = _workload(api, wl).get("status") or {}
            reserved = [c for c in status.get("conditions") or [] if c["type"] == "QuotaReserved"]
            return "admission" not in status and bool(reserved) and reserved[0]["status"] == "False"

        wait_until(acknowledged, timeout=60, interval=0.2, message="the eviction acknowledged (042)", retry_on=(Exception,))
        _kueue_writes(api, wl, FakeKueue.schedule)  # readmitted (046)
        _resumed_at_the_next_step(local_cluster, api, operator, name, saved=saved, at_stop=int(s["step"]),
                                  nodes=list(s["placement"]["nodes"]), what="kueue-preemption")
    finally:
        api.delete_job(SYSTEM_NS, name)
