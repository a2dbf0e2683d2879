"""faultTolerance ReplicaGroups end to end: the Lighthouse is no single point of failure.

Two replica groups of one pod x one rank (the REAL trainer, tiny preset) under the operator;
the Lighthouse is pinned by ``faultTolerance.lighthouse`` to two spare nodes of its own (a label
and a taint only it tolerates, so no group trains there). Its node fails mid-run
(``local.railyard.dev/fail``): the operator recreates it under the same address on the other
spare, the groups' Managers retry the quorum meanwhile (protocol/trainerconfig.py,
``lighthouse_quorum_retries``), and nobody restarts: the job's attempt stays 0, the groups' pods
are the same objects with the same worker processes, and both reach the last step with equal
parameters. The survivors' longest pause between two steps is printed (pytest -s).

Every wait is on an observable condition, bounded only to catch hangs; nothing is timed."""

from __future__ import annotations

import json
from itertools import pairwise
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

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.torch, pytest.mark.timeout(600)]

FAIL = "local.railyard.dev/fail"
SPARE = "test.railyard.dev/lighthouse"  #: label and taint of the Lighthouse's own nodes
#: The Lighthouse's node fails once the status says step 10; without a Lighthouse no group gets a
#: quorum for its next step, so no group can finish before the new one is up: the steps after the
#: loss are only the margin for the status's lag behind the groups (120 before, for the same verdict)
STEPS = 60


def _mark(api: Api, node: str, job: str | None) -> None:
    """Label and taint ``node`` for ``job``'s Lighthouse (None: remove both)."""
    taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in (api.node(node).spec.taints or []) if t.key != SPARE]
    if job is not None:
        taints.append({"key": SPARE, "value": job, "effect": "NoSchedule"})
    api.core.patch_node(node, {"metadata": {"labels": {SPARE: job}}, "spec": {"taints": taints}})


def _steps(local_cluster: Any, pod: str) -> list[dict[str, Any]]:
    return [e for e in pod_events(local_cluster, SYSTEM_NS, pod) if e.get("event") == "step"]


def test_losing_the_lighthouses_node_restarts_no_group(api: Api, operator: OperatorProcess, local_cluster: Any) -> None:
    name = unique("lh")
    spares = cluster_nodes(local_cluster)[-2:]
    for node in spares:
        _mark(api, node, name)
    spec = base_spec(
        parallelism={"dataReplicas": 2},
        faultTolerance={"mode": "ReplicaGroups", "minReplicas": 1,
                        "lighthouse": {"nodeSelector": {SPARE: name}, "tolerations": [{"key": SPARE, "operator": "Exists"}]}},
        trainer={"steps": STEPS, "batchSize": 8},
        nodeSelector=local_cluster.node_selector,
    )
    api.create_job(SYSTEM_NS, name, spec)
    lost = ""
    try:
        s = wait_status(api, name, "both groups training", lambda s: s if s.get("phase") == "Running" and s.get("step", 0) >= 10
                        else (pytest.fail(f"ended early: {s}") if s.get("phase") in ("Succeeded", "Failed") else None), 400, operator)
        assert not set(s["placement"]["nodes"]) & set(spares), "no group trains on the Lighthouse's nodes"
        pods = {p.metadata.name: p for p in api.pods(SYSTEM_NS, name)}
        lighthouse = pods.pop(f"{name}-lighthouse")
        lost = lighthouse.spec.node_name
        assert lost in spares, lost
        groups = sorted(pods)
        uids = {n: p.metadata.uid for n, p in pods.items()}
        pids = {n: [e["pids"] for e in pod_events(local_cluster, SYSTEM_NS, n) if e.get("event") == "workers_started"] for n in groups}
        before = {n: len(_steps(local_cluster, n)) for n in groups}
        s_at_loss = api.status(SYSTEM_NS, name).get("step")
        api.annotate_node(lost, {FAIL: "true"})

        def recreated() -> Any:
            p = next((p for p in api.pods(SYSTEM_NS, name) if p.metadata.name == f"{name}-lighthouse"), None)
            return p if p is not None and p.metadata.uid != lighthouse.metadata.uid and p.status.phase == "Running" else None

        again = wait_until(recreated, timeout=120, message="the Lighthouse recreated", interval=0.2, retry_on=(Exception,))
        assert again.spec.node_name in spares and again.spec.node_name != lost, again.spec.node_name
        s = wait_status(api, name, "the job to finish", lambda s: s if s.get("phase") in ("Succeeded", "Failed") else None, 500, operator)
        assert s["phase"] == "Succeeded", json.dumps(s)[:3000]
        assert s.get("attempt", 0) == 0 and (s.get("restarts") or {}).get("total", 0) == 0, f"a restart: {s.get('lastRestart')}"
        after = {p.metadata.name: p for p in api.pods(SYSTEM_NS, name)}
        assert {n: after[n].metadata.uid for n in groups} == uids, "the groups' pods are the same objects"
        assert {n: [e["pids"] for e in pod_events(local_cluster, SYSTEM_NS, n) if e.get("event") == "workers_started"]
                for n in groups} == pids, "with the same worker processes"
        done = [e for n in groups for e in pod_events(local_cluster, SYSTEM_NS, n) if e.get("event") == "done"]
        assert len(done) == 2 and {d["step"] for d in done} == {STEPS}, done
        assert len({d["params_crc32"] for d in done}) == 1, f"the groups' parameters differ: {done}"
        # at the start the first group to reach the Lighthouse may train alone and the other heals
        # from it (a state transfer, no restart); after the loss a group refuses the new
        # Lighthouse's quorum without the other (protocol/quorum.py) until they meet; report both
        told = ("replica_healed", "quorum_refused", "quorum_rejoined")
        events = {n: [e for e in pod_events(local_cluster, SYSTEM_NS, n) if e.get("event") in told] for n in groups}
        print(f"\nheals and rejoins during the run (the Lighthouse's node failed at step {s_at_loss}): "
              f"{json.dumps(events)}")
        pauses = {}
        for n in groups:
            steps = _steps(local_cluster, n)
            assert len(steps) > before[n], f"{n} trained on after the loss"
            pauses[n] = max(b["time"] - a["time"] for a, b in pairwise(steps))
        print(f"\nthe survivors' longest pause between two steps (the Lighthouse's node failed): "
              f"{', '.join(f'{n} {p:.2f} s' for n, p in sorted(pauses.items()))}")
    finally:
        if lost:
            api.annotate_node(lost, {FAIL: None})
        for node in spares:
            _mark(api, node, None)
        api.delete_job(SYSTEM_NS, name)
