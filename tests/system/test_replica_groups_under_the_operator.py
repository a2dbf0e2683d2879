"""faultTolerance ReplicaGroups end to end: the REAL trainer under the operator on the local
cluster. Two replica groups of one pod x one rank (tiny preset), a hot spare.

The node of group 1's pod fails mid-run: only that group restarts, its pod replaced (on the
spare). Group 0's pod is the same object (UID) with the same worker process throughout, the
restarted group heals from group 0, and the job Succeeds with both groups at the last step and
the same parameters (``params_crc32`` of each ``done`` event). With ``minReplicas: 2`` one group
alone could commit no step: the operator falls back to the ordinary in-place restart of the whole
gang (group 0's pod kept, its workers restarted), and the job ends the same way.
(A killed worker, restarted in place, is one of the faults of
tests/system/test_replica_group_faults.py, with SDC and a hang, in one job.)
Group 0 keeps running its older attempt: the operator accepts its heartbeats throughout (none
refused with 409).

Every wait is on an observable condition, bounded only to catch hangs; nothing is timed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.system.conftest import (
    SYSTEM_NS,
    Api,
    OperatorProcess,
    base_spec,
    pod_events,
    refused_heartbeats,
    unique,
    wait_status,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.torch, pytest.mark.timeout(600)]

FAIL = "local.railyard.dev/fail"
STEPS = 80
HOLD_AT = 60  #: a survivor waits before this step until the replacement group joined
#: The lost-node and fence jobs: their faults come by step 15 (a node failed once the status says
#: step 10; a flip at FLIP_AT, seen at the next fingerprint step), and what they assert holds at
#: any later end, so they stop sooner. The straggler's job keeps STEPS and HOLD_AT: its flag comes
#: a window of slow steps after SLOW_FROM, and a group held before it would never be flagged.
SHORT_STEPS = 40
SHORT_HOLD_AT = 30


def events_of(local_cluster: Any, pod: str) -> list[dict[str, Any]]:
    return pod_events(local_cluster, SYSTEM_NS, pod)


def two_groups(local_cluster: Any, *, min_replicas: int = 1, faults: tuple[dict[str, Any], ...] = (), hold: Path | None = None,
               steps: int = STEPS, hold_at: int = HOLD_AT, **overrides: Any) -> dict[str, Any]:
    """Two replica groups of one pod x one rank, ``steps`` steps, a hot spare, ``faults`` injected;
    ``hold``: every group waits before step ``hold_at`` until that file exists
    (:func:`release_when_joined`)."""
    return base_spec(
        parallelism={"dataReplicas": 2},
        faultTolerance={"mode": "ReplicaGroups", "minReplicas": min_replicas},
        gang={"hotSpares": 1, "scheduleTimeoutSeconds": 240},
        trainer={"steps": steps, "batchSize": 8, **({"faults": list(faults)} if faults else {})},
        nodeSelector=local_cluster.node_selector,  # on a given API server, not another's nodes
        **({"env": [{"name": "RAILYARD_TEST_HOLD", "value": f"{hold_at}:{hold}"}]} if hold is not None else {}),
        **overrides,
    )


def release_when_joined(local_cluster: Any, pod: str, hold: Path) -> None:
    """The survivor must not finish before the replacement group heals from it (a group that
    joins after the end never heals: docs/fault-tolerance.md, "The end of a run with a late
    group"); with the Lighthouse's 1 s heartbeat timeout it barely pauses for the loss. It is
    held before a late step (the trainer's test hold: paused, so neither hung nor timed out)
    until the replacement's Manager has joined; then both meet in the next quorum."""
    wait_until(lambda: any(e.get("event") == "replica_joining" for e in events_of(local_cluster, pod)), timeout=300,
               message=f"{pod} to join the quorum", retry_on=(Exception,))
    hold.touch()


@pytest.mark.parametrize("min_replicas", [1, 2], ids=["group-repair", "below-minReplicas-in-place"])
def test_a_lost_node_restarts_only_its_replica_group(api: Api, operator: OperatorProcess, local_cluster: Any, min_replicas: int,
                                                    tmp_path: Path) -> None:
    alone = min_replicas == 1  # group 0 can commit steps alone: only group 1 restarts
    name = unique("rg")
    hold = tmp_path / "release"
    spec = two_groups(local_cluster, min_replicas=min_replicas, hold=hold if alone else None,
                      steps=SHORT_STEPS, hold_at=SHORT_HOLD_AT)
    api.create_job(SYSTEM_NS, name, spec)
    victim = ""
    try:
        s = wait_status(api, name, "both groups training", lambda s: s if s.get("phase") == "Running" and s.get("step", 0) >= 10
                        else (pytest.fail(f"ended early: {s}") if s.get("phase") in ("Succeeded", "Failed") else None), 400, operator)
        pods = {p.metadata.name: p for p in api.pods(SYSTEM_NS, name)}
        assert f"{name}-lighthouse" in pods, sorted(pods)
        keep, lose = f"{name}-a0-0", f"{name}-a0-1"
        uid = pods[keep].metadata.uid
        pids = [e["pids"] for e in events_of(local_cluster, keep) if e.get("event") == "workers_started"]
        victim = s["placement"]["nodes"][1]
        api.annotate_node(victim, {FAIL: "true"})
        s = wait_status(api, name, "the restart", lambda s: s if (s.get("lastRestart") or {}).get("mode") == "InPlace" and s["lastRestart"].get("attempt") == 1
                        else (pytest.fail(f"a full restart: {s.get('lastRestart')}") if (s.get("lastRestart") or {}).get("mode") == "Full" else None),
                        240, operator)
        lr = s["lastRestart"]
        if alone:
            assert (lr["reason"], lr["carriedOn"], lr["replaced"]) == ("ReplicaGroupReplaced", [0], [1]), lr
        else:  # below minReplicas: the whole gang restarts in place, nobody carries on
            assert (lr["reason"], lr["carriedOn"], lr["replaced"]) == ("", [], [1]), lr
        if alone:
            release_when_joined(local_cluster, f"{name}-a1-1", hold)
        s = wait_status(api, name, "the job to finish", lambda s: s if s.get("phase") in ("Succeeded", "Failed") else None, 500, operator)
        assert s["phase"] == "Succeeded", json.dumps(s)[:3000]
        assert s.get("attempt") == 1 and s["restarts"]["total"] == 1, "one restart"
        after = {p.metadata.name: p for p in api.pods(SYSTEM_NS, name)}
        assert after[keep].metadata.uid == uid, "group 0's pod is the same object"
        kept = events_of(local_cluster, keep)
        started = [e["pids"] for e in kept if e.get("event") == "workers_started"]
        if alone:
            assert started == pids, "and the same worker process"
        else:
            assert started[:len(pids)] == pids and len(started) > len(pids), "its workers restarted in place"
        new = next(n for n in after if n.startswith(f"{name}-a1-1"))
        assert after[new].spec.node_name != victim
        replaced = events_of(local_cluster, new)
        if alone:
            assert any(e.get("event") == "replica_healed" for e in replaced), replaced[-20:]
            # the heal reached the operator as this attempt's restore (the survivor's beats do not count)
            assert (s.get("restore") or {}).get("tier") == "peer", s.get("restore")
        done = [e for p in (kept, replaced) for e in p if e.get("event") == "done"]
        assert len(done) == 2 and {d["step"] for d in done} == {SHORT_STEPS}, done
        assert len({d["params_crc32"] for d in done}) == 1, f"the groups' parameters differ: {done}"
        assert lose not in after or after[lose].metadata.deletion_timestamp or after[lose].status.phase != "Running"
        if alone:
            assert refused_heartbeats(local_cluster, keep) == [], "the carried-on group's beats are accepted after the repair"
        else:  # attempt 0's last post may come after the restart began: refused, as it should be
            assert refused_heartbeats(local_cluster, keep, over=(0,)) == [], "the restarted workers' beats are accepted"
    finally:
        hold.touch()
        if victim:
            api.annotate_node(victim, {FAIL: None})
        api.delete_job(SYSTEM_NS, name)


FLIP_AT = 12  #: group 1: a low parameter bit flipped after the optimizer step (no local check sees it)


def test_two_groups_that_disagree_go_back_behind_a_fence(api: Api, operator: OperatorProcess, local_cluster: Any) -> None:
    """With two groups the cross-group vote cannot name the corrupt one: a flip in group 1 makes
    the fingerprints differ with no majority, and the whole job restarts in place from the
    checkpoint tiers, no newer than the last step the groups agreed on. That bound stays up
    (``status.checkpointFence``) for every later restart; here the job Succeeds with both groups
    at the last step and the same parameters, nobody quarantined (nobody was named)."""
    name = unique("rgf")
    # minReplicas 2: no step is committed without both groups, so group 1 trains step FLIP_AT
    # (with 1, a loaded machine once started group 1's pod late: group 0 trained 28 steps alone,
    # group 1 healed to step 28 and never ran the flip)
    spec = two_groups(local_cluster, min_replicas=2,
                      faults=({"kind": "bitflip", "target": "param", "bit": 16, "group": 1, "rank": 0, "step": FLIP_AT, "attempt": 0},),
                      health={"sdc": {"intervalSteps": 5}}, steps=SHORT_STEPS)
    api.create_job(SYSTEM_NS, name, spec)
    try:
        s = wait_status(api, name, "the job to finish", lambda s: s if s.get("phase") in ("Succeeded", "Failed") else None, 500, operator)
        assert s["phase"] == "Succeeded", json.dumps(s)[:3000]
        assert s["restarts"]["total"] == 1 and s["restarts"]["lastReason"].startswith("SDCVerdict"), s["restarts"]
        lr, fence = s["lastRestart"], s.get("checkpointFence")
        assert (lr["mode"], lr["reason"], lr["carriedOn"]) == ("InPlace", "", []), lr
        # the groups agreed at a fingerprint step before the flip, not after it
        assert fence is not None and fence["attempt"] == 1 and 0 <= fence["step"] < FLIP_AT, fence
        assert (s.get("restore") or {}).get("step", -1) <= fence["step"], s.get("restore")
        assert not s.get("quarantinedNodes"), "no majority named a node"
        assert all(c["step"] <= fence["step"] or c["step"] > FLIP_AT for c in s.get("checkpoints") or []), s.get("checkpoints")
        done = [e for i in range(2) for e in events_of(local_cluster, f"{name}-a0-{i}") if e.get("event") == "done"]
        assert len(done) == 2 and {d["step"] for d in done} == {SHORT_STEPS}, done
        assert len({d["params_crc32"] for d in done}) == 1, f"the groups' parameters differ: {done}"
    finally:
        api.delete_job(SYSTEM_NS, name)


SLOW_FROM = 20  #: group 1's device 2x slower from this step (its speed probe too)


def test_a_straggling_group_is_moved_to_the_spare_while_the_other_trains_on(api: Api, operator: OperatorProcess, local_cluster: Any,
                                                                          tmp_path: Path) -> None:
    """``straggler.action: Restart`` with replica groups: group 1's device slows down, the
    straggler rule flags its rank, and only group 1 restarts, its pod moved to the spare (its
    node quarantined) where it heals from group 0; group 0 keeps its pod and worker process,
    and both groups end at the last step with the same parameters."""
    name = unique("rgs")
    hold = tmp_path / "release"
    spec = two_groups(local_cluster, faults=({"kind": "slow", "factor": 2.0, "group": 1, "rank": 0, "step": SLOW_FROM, "attempt": 0},),
                      hold=hold, health={"straggler": {"windowSteps": 10, "action": "Restart"}})
    api.create_job(SYSTEM_NS, name, spec)
    keep = f"{name}-a0-0"
    try:
        s = wait_status(api, name, "the groups training", lambda s: s if s.get("phase") == "Running" and s.get("step", 0) >= 5
                        else (pytest.fail(f"ended early: {s}") if s.get("phase") in ("Succeeded", "Failed") else None), 400, operator)
        uid = next(p.metadata.uid for p in api.pods(SYSTEM_NS, name) if p.metadata.name == keep)
        slow_node = s["placement"]["nodes"][1]
        wait_status(api, name, "the straggler's group repair", lambda s: s if (s.get("lastRestart") or {}).get("attempt") == 1
                    else (pytest.fail(f"ended early: {s}") if s.get("phase") in ("Succeeded", "Failed") else None), 400, operator)
        release_when_joined(local_cluster, f"{name}-a1-1", hold)
        s = wait_status(api, name, "the job to finish", lambda s: s if s.get("phase") in ("Succeeded", "Failed") else None, 500, operator)
        assert s["phase"] == "Succeeded", json.dumps(s)[:3000]
        assert s["restarts"]["total"] == 1 and s["restarts"]["lastReason"].startswith("StragglerVerdict"), s["restarts"]
        lr = s["lastRestart"]
        assert (lr["reason"], lr["carriedOn"], lr["replaced"]) == ("ReplicaGroupReplaced", [0], [1]), lr
        assert [q["node"] for q in s.get("quarantinedNodes") or []] == [slow_node], s.get("quarantinedNodes")
        after = {p.metadata.name: p for p in api.pods(SYSTEM_NS, name)}
        assert after[keep].metadata.uid == uid, "group 0's pod is the same object"
        kept = events_of(local_cluster, keep)
        assert len([e for e in kept if e.get("event") == "workers_started"]) == 1, "and the same worker process"
        new = next(n for n in after if n.startswith(f"{name}-a1-1"))
        assert after[new].spec.node_name != slow_node
        replaced = events_of(local_cluster, new)
        assert any(e.get("event") == "replica_healed" for e in replaced), replaced[-20:]
        done = [e for p in (kept, replaced) for e in p if e.get("event") == "done"]
        assert len(done) == 2 and {d["step"] for d in done} == {STEPS}, done
        assert len({d["params_crc32"] for d in done}) == 1, f"the groups' parameters differ: {done}"
    finally:
        hold.touch()
        api.delete_job(SYSTEM_NS, name)
