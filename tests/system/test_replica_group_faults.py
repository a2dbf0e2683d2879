"""faultTolerance ReplicaGroups end to end: each failure class restarts only the group concerned.

The REAL trainer under the operator on the local cluster: R = 3 replica groups of one pod x 2
ranks (FSDP inside each group), tiny preset, one hot spare. One job, three faults in turn, each in
another group:

1. **SDC** in group 1: a low mantissa bit of one parameter of its rank 1 flipped after the
   optimizer step (no local check can see it: the magnitude stays, the state guard records the
   flipped value as the baseline). Only the cross-group vote sees it: the operator compares the
   groups' fingerprints, names group 1 (its node quarantined), replaces its pod on the spare; the
   new group heals from a good one.
2. **A killed worker** in group 0 (its launcher lives): only group 0 restarts, in place (folded
   in from tests/system/test_replica_groups_under_the_operator.py).
3. **A hang** in group 2's rank 0: the other groups stall in the exchange waiting for it, say so
   in their heartbeats, and are excused; the hang verdict names group 2 alone, which restarts in
   place.

Each time the other groups carry on (same pod objects, same worker processes). The job Succeeds
with every group at the last step and the same parameters bit for bit (``params_crc32`` of each
rank's shard in its ``done`` event, equal across groups).

The groups are lined up with the trainer's test hold (``RAILYARD_TEST_HOLD``: before a step, wait
for a file; the wait pauses the watchdog and says ``saving`` in the heartbeats), released when the
restarted group has joined the quorum, so no group finishes before the restarted one is back.
Every wait is on an observable condition, bounded only to catch hangs; nothing is timed."""

from __future__ import annotations

import json
import os
import signal
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

from railyard_local import podlogs

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.torch, pytest.mark.timeout(600)]

GROUPS = 3
#: The holds line the faults up, so the steps between them are no margin: each fault is a few
#: steps after the last hold (at the same place in the 5-step fingerprint cycle as with the 60
#: steps this job had), and the job ends 5 steps after the last hold.
STEPS = 40
FLIP_AT = 12  #: group 1, rank 1: bit 16 of a parameter (a 0.4% change of one element)
#: every group waits here (after the fingerprints of step 15) until the SDC-replaced group 1
#: joined: the old group 1 goes while no collective is in flight
HOLD_SDC = 16
HOLD_KILL = 22  #: every group waits here; group 0's worker is killed; released when it rejoined
HANG_AT = 30  #: group 2, rank 0
HOLD_END = 35  #: every group waits here until the hung group 2 rejoined


def events(local_cluster: Any, pod: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in pod_events(local_cluster, SYSTEM_NS, pod) if e.get("event") == kind]


def log_tail(local_cluster: Any, pod: str, n: int = 12) -> str:
    lines = podlogs.pod_log_lines(Path(local_cluster.log_dir), SYSTEM_NS, pod)
    return "\n".join(ln[:300] for ln in lines[-n:])


def test_each_fault_restarts_only_its_replica_group(api: Api, operator: OperatorProcess, local_cluster: Any, tmp_path: Path) -> None:
    name = unique("rgf")
    holds = {step: tmp_path / f"release-{step}" for step in (HOLD_SDC, HOLD_KILL, HOLD_END)}
    spec = base_spec(
        procsPerNode=2, nodes=GROUPS,
        parallelism={"dataReplicas": GROUPS},
        faultTolerance={"mode": "ReplicaGroups", "minReplicas": 1},
        gang={"hotSpares": 1, "scheduleTimeoutSeconds": 240},
        # the groups that wait for a hung one must outlast the hang verdict (watchdog above it)
        trainer={"steps": STEPS, "batchSize": 12, "watchdogSeconds": 90, "collectiveTimeoutSeconds": 120, "faults": [
            {"kind": "bitflip", "target": "param", "bit": 16, "group": 1, "rank": 1, "step": FLIP_AT, "attempt": 0},
            {"kind": "hang", "group": 2, "rank": 0, "step": HANG_AT, "attempt": 0},
        ]},
        health={"sdc": {"intervalSteps": 5}},
        env=[{"name": "RAILYARD_TEST_HOLD", "value": ",".join(f"{s}:{p}" for s, p in holds.items())}],
        nodeSelector=local_cluster.node_selector,
    )
    api.create_job(SYSTEM_NS, name, spec)
    pod0, pod1, pod2 = (f"{name}-a0-{g}" for g in range(GROUPS))

    def ended(s: dict[str, Any]) -> Any:
        return pytest.fail(f"ended early: {json.dumps(s)[:3000]}") if s.get("phase") in ("Succeeded", "Failed") else None

    def repair(attempt: int) -> dict[str, Any]:
        s = wait_status(api, name, f"the group repair of attempt {attempt}",
                        lambda s: s if s.get("attempt", 0) >= attempt and (s.get("lastRestart") or {}).get("attempt") == attempt else ended(s), 300, operator)
        assert s["lastRestart"]["reason"] == "ReplicaGroupReplaced", explain()
        return s

    def explain() -> str:
        pods = [(p.metadata.name, p.status.phase, p.spec.node_name) for p in api.pods(SYSTEM_NS, name)]
        tails = {p: log_tail(local_cluster, p) for p, _, _ in pods}
        said = [f"{e.reason}: {(e.message or '')[:300]}" for e in api.events(SYSTEM_NS, name) if e.type == "Warning"]
        return (f"status: {json.dumps(api.status(SYSTEM_NS, name))[:2500]}\npods: {pods}\nwarnings:\n" + "\n".join(said) + "\n"
                + "".join(f"--- {p}\n{t}\n" for p, t in tails.items()) + f"--- operator\n{operator.log_tail(40)}")

    def joined(pod: str, times: int) -> None:
        wait_until(lambda: len(events(local_cluster, pod, "replica_joining")) >= 2 * times, timeout=300,
                   message=f"{pod} to join the quorum ({times})", retry_on=(Exception,), explain=explain)

    def held(pods: list[str], step: int) -> None:
        wait_until(lambda: all(any(e["step"] == step for e in events(local_cluster, p, "test_hold")) for p in pods), timeout=300,
                   message=f"{pods} held before step {step}", retry_on=(Exception,), explain=explain)

    try:
        s = wait_status(api, name, "the groups training", lambda s: s if s.get("phase") == "Running" and s.get("step", 0) >= 5 else ended(s), 400, operator)
        uids = {p.metadata.name: p.metadata.uid for p in api.pods(SYSTEM_NS, name)}
        pids0 = events(local_cluster, pod0, "workers_started")
        pids2 = events(local_cluster, pod2, "workers_started")
        victim = s["placement"]["nodes"][1]

        # 1. the SDC in group 1: the cross-group vote names it, its pod moves, its node is quarantined
        s = repair(1)
        assert (s["lastRestart"]["carriedOn"], s["lastRestart"]["replaced"]) == ([0, 2], [1]), explain()
        assert s["lastFailure"]["reason"] == "SDCVerdict", s["lastFailure"]
        assert [q["node"] for q in s.get("quarantinedNodes") or []] == [victim], s.get("quarantinedNodes")
        assert (api.node(victim).metadata.labels or {}).get("railyard.dev/quarantined") == "true"
        new1 = f"{name}-a1-1"
        joined(new1, 1)
        holds[HOLD_SDC].touch()

        # 2. a killed worker of group 0: only group 0 restarts, in place
        held([pod0, new1, pod2], HOLD_KILL)
        os.kill(int(events(local_cluster, pod0, "workers_started")[-1]["pids"]["0"]), signal.SIGKILL)
        s = repair(2)
        assert (s["lastRestart"]["carriedOn"], s["lastRestart"]["replaced"]) == ([1, 2], []), explain()
        joined(pod0, 2)
        holds[HOLD_KILL].touch()

        # 3. a hang in group 2: the others wait for it and are excused; group 2 restarts in place
        s = repair(3)
        assert (s["lastRestart"]["carriedOn"], s["lastRestart"]["replaced"]) == ([0, 1], []), explain()
        assert s["lastFailure"]["reason"] == "HangVerdict", s["lastFailure"]
        joined(pod2, 2)
        holds[HOLD_END].touch()

        s = wait_status(api, name, "the job to finish", lambda s: s if s.get("phase") in ("Succeeded", "Failed") else None, 400, operator)
        assert s["phase"] == "Succeeded", explain()
        assert s["restarts"]["total"] == 3 and s["attempt"] == 3, explain()
        after = {p.metadata.name: p.metadata.uid for p in api.pods(SYSTEM_NS, name)}
        assert after[pod0] == uids[pod0] and after[pod2] == uids[pod2], "groups 0 and 2 kept their pods throughout"
        assert [e["pids"] for e in events(local_cluster, pod2, "workers_started")][:1] == [e["pids"] for e in pids2], "group 2's workers carried on until its hang"
        assert [e["attempt"] for e in events(local_cluster, pod0, "workers_started")] == [0, 2], "group 0 restarted in place once"
        assert events(local_cluster, pod0, "workers_started")[0]["pids"] == pids0[0]["pids"], "group 0's workers carried on through the SDC repair"
        assert [e["attempt"] for e in events(local_cluster, pod2, "workers_started")] == [0, 3], "group 2 restarted in place once"
        for pod in (new1, pod0, pod2):
            healed = events(local_cluster, pod, "replica_healed")
            assert healed and healed[-1]["from_step"] == 0, f"{pod} healed from a live peer: {healed}"
            assert not events(local_cluster, pod, "restored"), f"{pod} read no checkpoint tier"
        assert any(e.get("kind") == "bitflip" for e in events(local_cluster, pod1, "fault")), "the flip happened in group 1"
        done = {pod: {e["rank"]: e for e in events(local_cluster, pod, "done")} for pod in (pod0, new1, pod2)}
        for pod, by_rank in done.items():
            assert sorted(by_rank) == [0, 1] and {e["step"] for e in by_rank.values()} == {STEPS}, (pod, by_rank)
        for rank in (0, 1):
            crcs = {pod: by_rank[rank]["params_crc32"] for pod, by_rank in done.items()}
            assert len(set(crcs.values())) == 1, f"rank {rank}'s parameters differ between the groups: {crcs}"
        assert refused_heartbeats(local_cluster, new1) == [], "group 1 carried on through two repairs: its beats were accepted"
    finally:
        for p in holds.values():
            p.touch()
        api.delete_job(SYSTEM_NS, name)
