"""The operator, `railyard plan` and `railyard simulate` place the same gang on the same nodes.

Seeded generated clusters (spines, leaves, GPUs per node, NotReady, cordoned, tainted, labelled
and busy nodes) and jobs (shape, hot spares, nodeSelector, tolerations, Required topology) go
to all three: the operator's reconcile cycle (in-process, on the fake cluster), the plan
command's core and the simulator's cluster. The answers must be identical: the same nodes by
pod index and the same spares, or the same reason it cannot be placed; then, after the node of
one pod fails, the same sticky re-placement. Jobs with replica groups (faultTolerance
ReplicaGroups) also get the same groups from `railyard plan` as from the operator's pods (which
pods, on which nodes) and the same Lighthouse pod (name, address, command, not pinned)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from tests.operator.builders import make_node
from tests.operator.fake_cluster import Harness

from railyard.api.trainingjob import TrainingJob
from railyard.commands.plan import plan, plan_lighthouse
from railyard.logic.conditions import find_condition
from railyard.logic.placement import Placement, Unplaceable
from railyard.sim.decisions import Cluster

CASES = 60


def _cluster(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    gpus = rng.choice([2, 4, 8])
    nodes: list[dict[str, Any]] = []
    for s in range(rng.randint(1, 2)):
        for lf in range(rng.randint(1, 3)):
            for i in range(rng.randint(2, 5)):
                name = f"n-s{s}-l{lf}-{i}"
                roll = rng.random()
                node = make_node(name, gpus=gpus, spine=f"spine-{s}", leaf=f"leaf-{s}-{lf}", ready=roll > 0.08,
                                 labels={"pool": rng.choice(["a", "b"])},
                                 taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}] if 0.08 < roll < 0.16 else [])
                if 0.16 < roll < 0.2:
                    node["spec"]["unschedulable"] = True
                nodes.append(node)
    rng.shuffle(nodes)
    pods = []
    for k, node in enumerate(rng.sample(nodes, k=min(len(nodes), rng.randint(0, 3)))):
        pods.append({"metadata": {"name": f"other-{k}", "namespace": "other", "labels": {"railyard.dev/job": "other"}},
                     "spec": {"nodeName": node["metadata"]["name"],
                              "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(rng.randint(1, gpus))}}}]},
                     "status": {"phase": "Running"}})
    return nodes, pods


def _job(rng: random.Random, gpus: int, size: int) -> dict[str, Any]:
    procs = rng.choice([d for d in (1, 2, 4, 8) if gpus % d == 0])
    nodes = rng.randint(1, max(1, min(6, size - 1)))
    tensor = rng.choice([d for d in (1, 2, 4) if procs % d == 0])
    world = nodes * procs
    pipeline = rng.choice([p for p in (1, 2) if (world // tensor) % p == 0])
    spec: dict[str, Any] = {"nodes": nodes, "procsPerNode": procs, "parallelism": {"tensor": tensor, "pipeline": pipeline},
                            "gang": {"hotSpares": rng.randint(0, 2)}, "trainer": {"batchSize": world}}
    if rng.random() < 0.3:
        spec["nodeSelector"] = {"pool": "a"}
    if rng.random() < 0.4:
        spec["tolerations"] = [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
    if rng.random() < 0.3:
        # replica groups: every group nodes / R whole pods, each placed as a block
        groups = rng.choice([2, 3])
        spec["nodes"] = nodes = groups * rng.randint(1, max(1, min(3, (size - 1) // groups)))
        spec["parallelism"] = {"tensor": tensor, "dataReplicas": groups}
        spec["faultTolerance"] = {"mode": "ReplicaGroups", "minReplicas": rng.randint(1, groups)}
        spec["trainer"] = {"batchSize": nodes * procs}
    elif rng.random() < 0.3:
        # often larger than one spine holds: NoDomainFits
        spec["topology"] = {"mode": "Required", "requiredLevel": "railyard.dev/spine"}
        spec["nodes"] = nodes = rng.randint(1, size)
        spec["parallelism"] = {"tensor": tensor}
        spec["trainer"] = {"batchSize": nodes * procs}
    return {"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "uid-j", "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": spec}


def _answer(result: Placement | Unplaceable) -> tuple[Any, ...]:
    if isinstance(result, Unplaceable):
        return ("unplaceable", result.condition_reason)
    return ("placed", result.nodes, result.spares)


def _plan_groups(result: Placement | Unplaceable) -> list[tuple[int, tuple[int, ...], tuple[str, ...]]]:
    if not isinstance(result, Placement):
        return []
    return [(g.group, g.pods, g.nodes) for g in result.replica_groups]


def _operator_groups(h: Harness, attempt: int) -> list[tuple[int, tuple[int, ...], tuple[str, ...]]]:
    """The groups as the operator's pods say: RAILYARD_REPLICA_GROUP of each pod, its node."""
    from tests.operator.fake_cluster import _pinned_node

    groups: dict[int, list[tuple[int, str]]] = {}
    for pod in h.cluster.pods_of(attempt):
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        if "RAILYARD_REPLICA_GROUP" in env:
            groups.setdefault(int(env["RAILYARD_REPLICA_GROUP"]), []).append((int(env["RAILYARD_POD_INDEX"]), _pinned_node(pod)))
    return [(g, tuple(i for i, _ in sorted(m)), tuple(n for _, n in sorted(m))) for g, m in sorted(groups.items())]


def _operator_lighthouse(h: Harness, job: TrainingJob) -> tuple[Any, ...] | None:
    pod = h.cluster.pods.get(f"{job.metadata.name}-lighthouse")
    if pod is None:
        return None
    gang = h.cluster.pods_of(0)
    address = {e["name"]: e.get("value") for e in gang[0]["spec"]["containers"][0]["env"]}.get("TORCHFT_LIGHTHOUSE") if gang else None
    required = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    pinned = bool(pod["spec"].get("nodeName") or required)  # a preferred affinity pins nothing
    return (pod["metadata"]["name"], address, tuple(pod["spec"]["containers"][0]["command"]), pinned)


async def _operator_first(h: Harness) -> tuple[Any, ...]:
    await h.cycle()
    st = h.status
    if st.phase == "Starting":
        return ("placed", tuple(h.pod_nodes(0)), tuple(st.placement.spares))  # type: ignore[union-attr]
    head = find_condition(st.conditions, "Failed" if st.phase == "Failed" else "Placed")
    return ("unplaceable", head.reason if head else st.phase)


async def _operator_after_failure(h: Harness, victim: str) -> tuple[Any, ...]:
    h.run_pods()
    await h.cycle(1.0)
    assert h.status.phase == "Running"
    h.node_down(victim)
    await h.cycle(5.0)  # past --not-ready-grace: Infrastructure restart, quarantined
    assert h.status.phase == "Restarting", h.cluster.events
    h.cluster.finish_deletions()
    await h.cycle(1.0)
    st = h.status
    if st.phase != "Starting":
        head = find_condition(st.conditions, "Placed")
        return ("unplaceable", head.reason if head else st.phase)
    return ("placed", tuple(h.pod_nodes(1)), tuple(st.placement.spares), tuple(st.placement.moved))  # type: ignore[union-attr]


@pytest.mark.parametrize("seed", range(CASES))
async def test_operator_plan_and_simulator_give_the_same_answer(seed: int) -> None:
    rng = random.Random(seed)
    nodes, pods = _cluster(rng)
    gpus = int(nodes[0]["status"]["allocatable"]["nvidia.com/gpu"])
    doc = _job(rng, gpus, len(nodes))
    job = TrainingJob.model_validate(doc)

    _, first, _ = plan(doc, nodes, pods)
    h = Harness(nodes, doc)
    for p in pods:
        h.cluster.pods[p["metadata"]["name"]] = dict(p)
    by_operator = await _operator_first(h)
    try:
        sim: Cluster | None = Cluster.from_job(job, nodes, pods)
        by_sim: tuple[Any, ...] = ("placed", sim.nodes, sim.spares)
    except ValueError:
        sim, by_sim = None, ("unplaceable", first.condition_reason if isinstance(first, Unplaceable) else "?")
    assert _answer(first) == by_operator == by_sim, (seed, doc["spec"])
    assert _plan_groups(first) == _operator_groups(h, 0), (seed, doc["spec"])
    if isinstance(first, Placement) and job.spec.replica_groups > 1:
        lighthouse = plan_lighthouse(job)
        assert lighthouse is not None and first.replica_groups
        by_plan_lh = (lighthouse.pod, lighthouse.address, lighthouse.command, lighthouse.node.startswith("pinned"))
        assert by_plan_lh == _operator_lighthouse(h, job), (seed, doc["spec"])

    if not isinstance(first, Placement) or sim is None:
        return
    victim = first.nodes[rng.randrange(len(first.nodes))]
    _, _, second = plan(doc, nodes, pods, fail=[victim])
    assert second is not None
    by_plan = _answer(second) + ((second.moved,) if isinstance(second, Placement) else ())
    by_operator = await _operator_after_failure(h, victim)
    before = sim.nodes
    ok = sim.quarantine_and_replace([victim], now=0.0, repair_s=3600.0)
    moved = tuple(p for p, (old, new) in enumerate(zip(before, sim.nodes, strict=True)) if old != new)
    by_sim = ("placed", sim.nodes, sim.spares, moved) if ok else ("unplaceable", "NotEnoughNodes")
    assert by_plan == by_operator == by_sim, (seed, victim, doc["spec"])
    if isinstance(second, Placement) and h.status.phase == "Starting":
        assert _plan_groups(second) == _operator_groups(h, 1), (seed, victim, doc["spec"])


def test_the_generator_covers_placed_unplaceable_and_replaced_cases() -> None:
    outcomes = set()
    for seed in range(CASES):
        rng = random.Random(seed)
        nodes, pods = _cluster(rng)
        doc = _job(rng, int(nodes[0]["status"]["allocatable"]["nvidia.com/gpu"]), len(nodes))
        _, first, _ = plan(doc, nodes, pods)
        placed = _answer(first)[0] if isinstance(first, Placement) else first.condition_reason
        groups = isinstance(first, Placement) and bool(first.replica_groups)
        outcomes.add(placed + (" in replica groups" if groups else ""))
    assert "placed" in outcomes and "placed in replica groups" in outcomes and len(outcomes) >= 4, outcomes
