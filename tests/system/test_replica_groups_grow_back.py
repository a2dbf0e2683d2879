"""Replica groups that shrink and grow back, end to end: the REAL trainer under the operator on the local cluster.
Two replica groups of one pod x two ranks (tiny preset) on exactly two nodes (a label of the
test's own), no spare.

The node of one group fails mid-run: there is no node to place that group on, so the job goes on
Running with the other group alone (Degraded "1/2 replica groups training; group g waits for a
node", the groups gauge at 1), the survivor's pod the same object with the same worker processes.
Then a third node gets the label (a node becomes usable): the waiting group is placed on it,
joins the quorum, heals from the survivor, and the job Succeeds with both groups at the last step
and the same parameters, rank by rank (each rank's ``params_sha256`` in its ``done`` event).

The survivors hold before step HOLD until the replacement has joined (``RAILYARD_TEST_HOLD``, a
file the test creates once the replacement says ``replica_joining``), so they cannot finish before
it heals however slow its start is; the watchdog and the hang timeout are raised above that hold.
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
    cluster_nodes,
    pod_events,
    unique,
    wait_status,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.torch, pytest.mark.timeout(900)]

FAIL = "local.railyard.dev/fail"
LABEL = "test.railyard.dev/grow-back"
STEPS = 24
HOLD = 20


def label_node(api: Api, node: str, value: str | None) -> None:
    api.core.patch_node(node, {"metadata": {"labels": {LABEL: value}}})


def events_of(local_cluster: Any, pod: str, event: str) -> list[dict[str, Any]]:
    return [e for e in pod_events(local_cluster, SYSTEM_NS, pod) if e.get("event") == event]


def groups_training(operator: OperatorProcess, job: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    return next((x.value for f in text_string_to_metric_families(operator.metrics_text()) for x in f.samples
                 if x.name == "railyard_replica_groups" and x.labels == {"namespace": SYSTEM_NS, "job": job, "state": "training"}), None)


def waiting_or_fail(s: dict[str, Any]) -> Any:
    lr = s.get("lastRestart") or {}
    if lr.get("state") == "Waiting":
        return s
    if lr.get("mode") == "Full" or s.get("phase") in ("Succeeded", "Failed"):
        pytest.fail(f"not a shrink: {json.dumps(s)[:2000]}")
    return None


def test_a_lost_group_without_a_node_waits_and_grows_back_on_a_new_one(api: Api, operator: OperatorProcess, local_cluster: Any,
                                                                        tmp_path: Path) -> None:
    name = unique("rgg")
    hold = tmp_path / "replacement-joined"
    first, second, spare = cluster_nodes(local_cluster)[:3]
    spec = base_spec(
        procsPerNode=2,
        parallelism={"dataReplicas": 2},
        faultTolerance={"mode": "ReplicaGroups", "minReplicas": 1},
        gang={"hotSpares": 0, "scheduleTimeoutSeconds": 240},
        # the survivor may stand in its hold while the replacement starts: watchdog, collective
        # timeout and hang timeout above any start (the Lighthouse's join timeout follows: 60 s)
        trainer={"steps": STEPS, "batchSize": 8, "watchdogSeconds": 240, "collectiveTimeoutSeconds": 300},
        health={"hangTimeoutSeconds": 900},
        env=[{"name": "RAILYARD_TEST_HOLD", "value": f"{HOLD}:{hold}"}],
        nodeSelector={**local_cluster.node_selector, LABEL: name},
    )
    victim = ""
    try:
        for node in (first, second):
            label_node(api, node, name)
        api.create_job(SYSTEM_NS, name, spec)
        s = wait_status(api, name, "both groups training", lambda s: s if s.get("phase") == "Running" and s.get("step", 0) >= 3
                        else (pytest.fail(f"ended early: {s}") if s.get("phase") in ("Succeeded", "Failed") else None), 400, operator)
        pods = {p.metadata.name: p for p in api.pods(SYSTEM_NS, name)}
        lighthouse = pods[f"{name}-lighthouse"].spec.node_name
        # fail the node of the group the Lighthouse is not on (a lost Lighthouse is another story)
        lost = next(g for g in (1, 0) if pods[f"{name}-a0-{g}"].spec.node_name != lighthouse)
        kept = 1 - lost
        keep = f"{name}-a0-{kept}"
        uid = pods[keep].metadata.uid
        pids = [e["pids"] for e in events_of(local_cluster, keep, "workers_started")]
        victim = pods[f"{name}-a0-{lost}"].spec.node_name
        api.annotate_node(victim, {FAIL: "true"})

        s = wait_status(api, name, "the job to go on with one group", waiting_or_fail, 300, operator)
        lr = s["lastRestart"]
        assert (lr["waitingGroups"], lr["carriedOn"], lr["reason"]) == ([lost], [kept], "ReplicaGroupReplaced"), lr
        assert s["phase"] == "Running", s["phase"]
        degraded = api.condition(SYSTEM_NS, name, "Degraded") or {}
        assert (degraded.get("status"), degraded.get("message")) == ("True", f"1/2 replica groups training; group {lost} waits for a node"), degraded
        wait_until(lambda: groups_training(operator, name) == 1, timeout=60, message="the groups gauge at 1", retry_on=(Exception,))
        at = s.get("step", 0)
        wait_status(api, name, "the survivor training on alone",
                    lambda s: s if s.get("step", 0) >= min(at + 2, HOLD - 1) and (s.get("lastRestart") or {}).get("state") == "Waiting" else None,
                    300, operator)

        # a node becomes usable: the waiting group is placed on it and started
        label_node(api, spare, name)
        s = wait_status(api, name, "the group placed again", lambda s: s if (s.get("lastRestart") or {}).get("state") not in (None, "Waiting")
                        and s.get("attempt", 0) >= 2 else None, 240, operator)
        assert s["lastRestart"]["carriedOn"] == [kept] and s["lastRestart"]["replaced"] == [lost], s["lastRestart"]
        new = f"{name}-a{s['attempt']}-{lost}"
        wait_until(lambda: events_of(local_cluster, new, "replica_joining"), timeout=300, message="the replacement to join the quorum", interval=0.2, retry_on=(Exception,))
        hold.touch()

        s = wait_status(api, name, "the job to finish", lambda s: s if s.get("phase") in ("Succeeded", "Failed") else None, 500, operator)
        assert s["phase"] == "Succeeded", json.dumps(s)[:3000]
        after = {p.metadata.name: p for p in api.pods(SYSTEM_NS, name)}
        assert after[keep].metadata.uid == uid, "the survivor's pod is the same object"
        assert [e["pids"] for e in events_of(local_cluster, keep, "workers_started")] == pids, "with the same worker processes"
        assert after[new].spec.node_name == spare, "the group went to the node that became usable"
        assert events_of(local_cluster, new, "replica_healed"), "healed from the survivor"
        assert not events_of(local_cluster, new, "restored"), "no checkpoint read"
        done = {(d["group"], d["rank"]): d for pod in (keep, new) for d in events_of(local_cluster, pod, "done")}
        assert sorted(done) == [(g, r) for g in (0, 1) for r in (0, 1)], sorted(done)
        assert {d["step"] for d in done.values()} == {STEPS}, done
        for r in (0, 1):
            assert done[(0, r)]["params_sha256"] == done[(1, r)]["params_sha256"], f"rank {r}: the groups' parameters differ"
        reasons = {e.reason for e in api.events(SYSTEM_NS, name)}
        assert {"ReplicaGroupsWaiting", "ReplicaGroupsPlaced"} <= reasons, reasons
    finally:
        hold.touch()
        if victim:
            api.annotate_node(victim, {FAIL: None})
        for node in (first, second, spare):
            label_node(api, node, None)
        api.delete_job(SYSTEM_NS, name)
