"""``spec.suspend: true`` on a running job and back, end to end: the REAL trainer under the operator
on the local cluster (issue 47). Before the operator deletes the gang's pods it asks the ranks for
a just-in-time save to the memory tier (a tmpfs host path that outlives the pods) and waits for
the heartbeats to report it committed; resumed, the next attempt is placed on the same nodes and
restores that save.

| step | expected |
|---|---|
| suspend at step >= 10 | the ranks save at one step S (``jit_save`` in the pods' events), then the pods go; the job Suspended, its message naming S |
| resume | attempt 1 restores the memory tier at S: its first step is S + 1; no step trained twice, none skipped |
| the job | Succeeds; no restart budget spent |

The figures are printed (``-s``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.system.conftest import SYSTEM_NS, Api, OperatorProcess, base_spec, pod_events, unique, wait_status
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(420)]

STEPS = 60


def _steps(local_cluster: Any, pod: str) -> list[int]:
    return [int(e["step"]) for e in pod_events(local_cluster, SYSTEM_NS, pod) if e.get("event") == "step"]


def test_a_suspended_job_resumes_at_the_step_after_its_save(
    local_cluster: Any, api: Api, operator: OperatorProcess,
) -> None:
    name = unique("suspend")
    spec = base_spec(trainer={"steps": STEPS}, nodeSelector=local_cluster.node_selector)
    api.create_job(SYSTEM_NS, name, spec)
    try:
        s = wait_status(api, name, "step 10 with a memory checkpoint",
                        lambda s: s if s.get("phase") in ("Succeeded", "Failed") or (
                            s.get("phase") == "Running" and s.get("step", 0) >= 10
                            and any(c["tier"] == "memory" for c in s.get("checkpoints") or [])) else None, 300, operator)
        assert s["phase"] == "Running", s.get("message")
        nodes = list(s["placement"]["nodes"])
        step_at_suspend = int(s.get("step", 0))
        api.patch_spec(SYSTEM_NS, name, {"suspend": True})
        s = wait_status(api, name, "the job Suspended", lambda s: s if s.get("phase") in ("Suspended", "Failed") else None,
                        120, operator)
        assert s["phase"] == "Suspended", s.get("message")
        wait_until(lambda: api.pods(SYSTEM_NS, name) == [], timeout=60, interval=0.2, message="the gang's pods gone",
                   retry_on=(Exception,))
        old = [e for e in pod_events(local_cluster, SYSTEM_NS, f"{name}-a0-0") if e.get("event") in ("jit_save", "step")]
        saves = [int(e["step"]) for e in old if e["event"] == "jit_save"]
        assert len(saves) == 1, f"one just-in-time save before the pods went: {saves}\n{s.get('message')}"
        saved = saves[0]
        assert f"resumes from the just-in-time save at step {saved}" in s["message"], s["message"]
        assert saved >= step_at_suspend, (saved, step_at_suspend)
        api.patch_spec(SYSTEM_NS, name, {"suspend": False})
        s = wait_status(api, name, "the job to finish", lambda s: s if s.get("phase") in ("Succeeded", "Failed") else None,
                        300, operator)
        before, after = _steps(local_cluster, f"{name}-a0-0"), _steps(local_cluster, f"{name}-a1-0")
        print("\n[suspend] " + json.dumps({
            "step_at_suspend": step_at_suspend, "saved": saved, "last_step_before": before[-1:],
            "first_step_after": after[:1], "restore": s.get("restore"), "restarts": s.get("restarts"),
            "nodes": nodes, "resumed_on": (s.get("placement") or {}).get("nodes"),
        }))
        assert s["phase"] == "Succeeded", f"{s.get('message')}\n{operator.log_tail(40)}"
        assert after and after[0] == saved + 1, f"the resumed run's first step: {after[:3]}, saved {saved}"
        assert before[-1] == saved, f"no step trained after the save: {before[-3:]}"
        assert before + after == list(range(before[0], STEPS + 1)), "no step trained twice, none skipped"
        restore = s.get("restore") or {}
        assert (restore.get("tier"), restore.get("step"), restore.get("stepsLost")) == ("memory", saved, 0), restore
        assert (s.get("restarts") or {}).get("total", 0) == 0, s.get("restarts")
    finally:
        api.delete_job(SYSTEM_NS, name)
