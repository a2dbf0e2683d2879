"""`kubectl drain` of a node under a running job, end to end: the REAL trainer under the operator
on the local cluster (issue 47). What a drain does, done through the API as kubectl does it: the
node is cordoned, then each pod on it is evicted (the eviction API), retried while refused.

| step | expected |
|---|---|
| evict the training pod before anything else | 429 with the DisruptionBudget cause: the job's PodDisruptionBudget covers its training pods |
| cordon the node | the operator asks the launchers for a just-in-time save to the memory tier, waits for it, then moves the pod ahead of time: a planned move (MoveAhead), pod 0 kept, pod 1 on the spare, resumed from that save |
| evict again, as the drain retries | passes once the operator's own deletion has moved the pod: the drain completes |
| the job | Succeeds; no restart budget spent (every budget is 0 here), ``restarts.planned`` 1 |

With faultTolerance ReplicaGroups (two groups of one pod, a hot spare) the same drain moves only
group 1 onto the spare: it first leaves the quorum at a step boundary (the operator's order to its
launcher alone), then is moved; group 0's pod and worker processes carry on and never fail a step
(one quorum change without group 1, right after the step group 1 left after), and both groups end
with the same parameters.

No step is trained twice (from the kept pod's step events): the move resumes from the save made
for it (docs/disruptions.md). The figures are printed (``-s``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from tests.system.conftest import (
    SYSTEM_NS,
    Api,
    OperatorProcess,
    base_spec,
    cluster_nodes,
    pod_events,
    unique,
    wait_status,
)
from tests.system.test_replica_groups_under_the_operator import (
    STEPS,
    events_of,
    release_when_joined,
    two_groups,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(480)]

POOL = "e2e.railyard.dev/pool"
NO_BUDGET = {"limit": 0, "backoffSeconds": 0}


def _gang_pods(api: Api, job: str) -> dict[str, str]:
    """Gang pod name -> node, for the pods not being deleted (placeholders apart)."""
    pods = api.core.list_namespaced_pod(SYSTEM_NS, label_selector=f"railyard.dev/job={job}").items
    return {p.metadata.name: p.spec.node_name for p in pods
            if (p.metadata.labels or {}).get("railyard.dev/spare") != "true" and not p.metadata.deletion_timestamp}


def _evict(api: Api, pod: str) -> tuple[int, str]:
    """One eviction, as ``kubectl drain`` asks it: (HTTP status, the refusal's cause)."""
    from kubernetes.client.rest import ApiException

    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": SYSTEM_NS}}
    try:
        api.core.create_namespaced_pod_eviction(pod, SYSTEM_NS, body)
    except ApiException as exc:
        causes = ((json.loads(exc.body or "{}").get("details") or {}).get("causes") or [{}]) if exc.body else [{}]
        return exc.status, str(causes[0].get("reason", ""))
    return 201, ""


def test_a_drain_waits_for_the_operator_then_completes_and_spends_no_budget(
    local_cluster: Any, api: Api, operator: OperatorProcess,
) -> None:
    nodes = cluster_nodes(local_cluster)[:3]
    for n in nodes:
        api.core.patch_node(n, {"metadata": {"labels": {POOL: "drain"}}})
    name = unique("drain")
    spec = base_spec(nodeSelector={POOL: "drain"}, trainer={"steps": 60}, gang={"scheduleTimeoutSeconds": 180, "hotSpares": 1},
                     restartPolicy={"application": NO_BUDGET, "infrastructure": NO_BUDGET, "sdc": NO_BUDGET,
                                    "straggler": NO_BUDGET})
    api.create_job(SYSTEM_NS, name, spec)
    victim = ""
    try:
        s = wait_status(api, name, "step 10 with a memory checkpoint",
                        lambda s: s if s.get("phase") in ("Succeeded", "Failed") or (
                            s.get("phase") == "Running" and s.get("step", 0) >= 10
                            and any(c["tier"] == "memory" for c in s.get("checkpoints") or [])) else None, 300, operator)
        assert s["phase"] == "Running", s.get("message")
        victim = s["placement"]["nodes"][1]
        before = _gang_pods(api, name)
        on_victim = next(p for p, n in before.items() if n == victim)
        # the budget's status is computed by the disruption controller: wait for it to count the gang
        wait_until(lambda: (api.custom.get_namespaced_custom_object("policy", "v1", SYSTEM_NS, "poddisruptionbudgets", name)
                            .get("status") or {}).get("currentHealthy") == 2,
                   timeout=30, interval=0.2, message="the budget to count 2 healthy pods", retry_on=(Exception,))
        assert _evict(api, on_victim) == (429, "DisruptionBudget"), "the job's budget refuses the eviction"
        assert on_victim in _gang_pods(api, name), "refused: the pod is still there"
        # kubectl drain: cordon, then evict every 5 s until nothing the budget protects is left
        step_at_cordon = int(api.status(SYSTEM_NS, name).get("step", 0))
        t_cordon = time.time()
        api.core.patch_node(victim, {"spec": {"unschedulable": True}})
        drained: list[tuple[int, str]] = []

        def drain_done() -> bool:
            got = _evict(api, on_victim)
            drained.append(got)
            return got[0] in (201, 404)

        wait_until(drain_done, timeout=120, interval=1.0, message="the drain to complete")
        t_drained = time.time()
        s = wait_status(api, name, "the job to finish", lambda s: s if s.get("phase") in ("Succeeded", "Failed") else None, 300,
                        operator)
        after = _gang_pods(api, name)
        last = s.get("lastRestart") or {}
        kept = [p for p in before if p in after or p.endswith("-0")]
        events = pod_events(local_cluster, SYSTEM_NS, kept[0]) if kept else []
        steps = [int(e["step"]) for e in events if e.get("event") == "step"]
        twice = len(steps) - len(set(steps))
        print("\n[drain] " + json.dumps({
            "victim": victim, "step_at_cordon": step_at_cordon, "drain_s": round(t_drained - t_cordon, 2),
            "evictions": drained, "restore": s.get("restore"), "restarts": s.get("restarts"), "last_restart": last,
            "steps_trained_twice_by_pod_0": twice,
        }))
        assert s["phase"] == "Succeeded", f"{s.get('message')}\n{operator.log_tail(40)}"
        restarts = s.get("restarts") or {}
        assert restarts.get("planned") == 1 and restarts.get("total", 0) == 0, restarts
        assert (last.get("mode"), last.get("reason"), last.get("replaced")) == ("InPlace", "PlannedMove", [1]), last
        assert victim not in s["placement"]["nodes"], s["placement"]
        assert drained[0][0] in (429, 201, 404) and drained[-1][0] in (201, 404), drained
        assert twice == 0, f"steps trained twice by pod 0: {sorted(x for x in set(steps) if steps.count(x) > 1)}"
    finally:
        if victim:
            api.core.patch_node(victim, {"spec": {"unschedulable": False}})
        for n in nodes:
            api.core.patch_node(n, {"metadata": {"labels": {POOL: None}}})


def _wait_budget_counts(api: Api, name: str, healthy: int) -> None:
    wait_until(lambda: (api.custom.get_namespaced_custom_object("policy", "v1", SYSTEM_NS, "poddisruptionbudgets", name)
                        .get("status") or {}).get("currentHealthy") == healthy,
               timeout=30, interval=0.2, message=f"the budget to count {healthy} healthy pods", retry_on=(Exception,))


def test_with_replica_groups_a_drain_moves_only_the_group_on_the_node(
    local_cluster: Any, api: Api, operator: OperatorProcess, tmp_path: Path,
) -> None:
    name = unique("drain-rg")
    hold = tmp_path / "release"
    spec = two_groups(local_cluster, hold=hold, restartPolicy={"application": NO_BUDGET, "infrastructure": NO_BUDGET,
                                                               "sdc": NO_BUDGET, "straggler": NO_BUDGET})
    api.create_job(SYSTEM_NS, name, spec)
    victim = ""
    try:
        s = wait_status(api, name, "both groups training", lambda s: s if s.get("phase") in ("Succeeded", "Failed") or (
            s.get("phase") == "Running" and s.get("step", 0) >= 10) else None, 400, operator)
        assert s["phase"] == "Running", s.get("message")
        keep, lose = f"{name}-a0-0", f"{name}-a0-1"
        uid = api.core.read_namespaced_pod(keep, SYSTEM_NS).metadata.uid
        pids = [e["pids"] for e in events_of(local_cluster, keep) if e.get("event") == "workers_started"]
        victim = s["placement"]["nodes"][1]
        _wait_budget_counts(api, name, 2)
        assert _evict(api, lose) == (429, "DisruptionBudget")
        api.core.patch_node(victim, {"spec": {"unschedulable": True}})
        drained: list[tuple[int, str]] = []

        def drain_done() -> bool:
            got = _evict(api, lose)
            drained.append(got)
            return got[0] in (201, 404)

        wait_until(drain_done, timeout=120, interval=1.0, message="the drain to complete")
        s = wait_status(api, name, "the planned move", lambda s: s if (s.get("lastRestart") or {}).get("attempt") == 1 else None,
                        120, operator)
        lr = s["lastRestart"]
        assert (lr["mode"], lr["reason"], lr["carriedOn"], lr["replaced"]) == ("InPlace", "ReplicaGroupReplaced", [0], [1]), lr
        assert lr["message"].startswith(f"moving ahead of {victim} (cordoned)"), lr
        # the operator writes a cycle's status first, then its Events: wait for the move's Event
        def said_moved() -> list[tuple[str, str]] | None:
            said = [(e.reason, e.message) for e in api.events(SYSTEM_NS, name)]
            return said if any(r == "PlannedMove" for r, _ in said) else None

        said = wait_until(said_moved, timeout=30, message="the PlannedMove Event", retry_on=(Exception,))
        assert any(r == "PlannedMoveLeaving" and m.startswith("pods [1] leave the replica groups' quorum") for r, m in said), said
        assert any(r == "PlannedMove" and "pods [1] left the replica groups' quorum after step" in m for r, m in said), said
        release_when_joined(local_cluster, f"{name}-a1-1", hold)
        s = wait_status(api, name, "the job to finish", lambda s: s if s.get("phase") in ("Succeeded", "Failed") else None, 500,
                        operator)
        kept = events_of(local_cluster, keep)
        gone = events_of(local_cluster, lose)
        left = [e["step"] for e in gone if e.get("event") == "replica_left"]
        steps = [e for e in kept if e.get("event") == "step"]
        failed = [e for e in kept if e.get("event") in ("step_not_committed", "replica_collective_failed")]
        alone = next((e for e in steps if e.get("participants") == 1 and left and e["step"] > left[0]), None)
        before = next((e for e in reversed(steps) if left and e["step"] == left[0]), None)
        print("\n[drain-rg] " + json.dumps({
            "victim": victim, "evictions": drained, "restarts": s.get("restarts"), "last_restart": s.get("lastRestart"),
            "left_after_step": left, "survivor_failed_steps": len(failed),
            "survivor_pause_s": round(alone["time"] - before["time"], 3) if alone and before else None,
            "survivor_quorum_change_s": alone.get("quorum_s") if alone else None,
        }))
        assert s["phase"] == "Succeeded", json.dumps(s)[:3000]
        restarts = s.get("restarts") or {}
        assert restarts.get("planned") == 1 and restarts.get("total", 0) == 0, restarts
        assert api.core.read_namespaced_pod(keep, SYSTEM_NS).metadata.uid == uid, "group 0's pod is the same object"
        assert [e["pids"] for e in kept if e.get("event") == "workers_started"] == pids, "and the same worker processes"
        # group 1 left the quorum at a step boundary and trained nothing after; group 0 never failed
        # a step, trained none twice, and went on alone from the very next step (one quorum change)
        assert len(left) == 1 and max(e["step"] for e in gone if e.get("event") == "step") == left[0], left
        assert not failed, failed
        numbers = [e["step"] for e in steps]  # (from 1, or from where group 0 healed at the start)
        assert numbers and numbers == list(range(numbers[0], STEPS + 1)), "every step once, none tried again"
        assert alone is not None and alone["step"] == left[0] + 1, (left, [(e["step"], e.get("participants")) for e in steps])
        replaced = events_of(local_cluster, f"{name}-a1-1")
        done = [e for p in (kept, replaced) for e in p if e.get("event") == "done"]
        assert len(done) == 2 and {d["step"] for d in done} == {STEPS}, done
        assert len({d["params_crc32"] for d in done}) == 1, f"the groups' parameters differ: {done}"
    finally:
        if victim:
            api.core.patch_node(victim, {"spec": {"unschedulable": False}})
