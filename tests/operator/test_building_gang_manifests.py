"""Pure manifest builders: deterministic names, the pod contract, pinning, gating, privilege."""

from __future__ import annotations

import json

from railyard.api.trainingjob import DEFAULT_IMAGE, TrainingJobSpec
from railyard.logic.gang import assess_gang
from railyard.logic.manifests import (
    GANG_GATE,
    NCCL_DEFAULTS,
    build_configmap,
    build_gang_pods,
    build_gate_removal,
    build_service,
    build_trainer_config,
    check_names,
    with_addresses,
)
from railyard.logic.placement import build_placement_input, plan_placement

OWNER = {"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "name": "llm", "uid": "u-1", "controller": True}


def _spec(**kw: object) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({"nodes": 2, "procsPerNode": 2, **kw})


def _pods(spec: TrainingJobSpec, attempt: int = 0) -> list[dict]:
    return build_gang_pods(spec, job="llm", namespace="ml", owner=OWNER, attempt=attempt, nodes=["n-a", "n-b"], heartbeat_url="http://op:8080/v1/heartbeats/ml/llm")


def _env(pod: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_names_are_deterministic_per_attempt_and_hostnames_stable() -> None:
    a0, a1 = _pods(_spec()), _pods(_spec(), attempt=1)
    assert [p["metadata"]["name"] for p in a0] == ["llm-a0-0", "llm-a0-1"]
    assert [p["metadata"]["name"] for p in a1] == ["llm-a1-0", "llm-a1-1"]
    assert [p["spec"]["hostname"] for p in a1] == ["llm-0", "llm-1"]
    assert all(p["spec"]["subdomain"] == "llm" for p in a0)
    assert _pods(_spec()) == a0, "a repeated run builds identical objects"


def test_pods_are_gated_pinned_owned_and_unprivileged() -> None:
    pod = _pods(_spec(image=DEFAULT_IMAGE))[1]
    spec = pod["spec"]
    assert spec["schedulingGates"] == [{"name": GANG_GATE}]
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["n-b"]}]
    assert pod["metadata"]["ownerReferences"] == [OWNER]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    c = spec["containers"][0]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False and c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"} and spec["securityContext"]["runAsNonRoot"] is True
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert pod["metadata"]["labels"] == {
        "railyard.dev/job": "llm", "app.kubernetes.io/managed-by": "railyard", "railyard.dev/attempt": "0", "railyard.dev/pod-index": "1",
    }


def test_every_image_runs_as_the_trainer_user_unless_the_spec_says_root() -> None:
    # our image pushed under another name, or an image built FROM it (a program of one's own):
    # the same user as the default image, and its hostPath checkpoint folders handed to it
    pod = _pods(_spec(image="registry.example.com/mine:1"))[0]
    sc = pod["spec"]["securityContext"]
    assert (sc["runAsUser"], sc["runAsGroup"], sc["fsGroup"], sc["runAsNonRoot"]) == (10001, 10001, 10001, True)
    init = {c["name"]: c for c in pod["spec"]["initContainers"]}["checkpoint-dirs"]
    assert init["command"][:2] == ["chown", "10001:10001"] and init["image"] == "registry.example.com/mine:1"
    # an image whose own user differs, and one that must run as root
    sc = _pods(_spec(image="x/y:1", securityContext={"runAsUser": 2000, "runAsGroup": 3000}))[0]["spec"]["securityContext"]
    assert (sc["runAsUser"], sc["runAsGroup"], sc["fsGroup"]) == (2000, 3000, 3000)
    root = _pods(_spec(image="x/y:1", securityContext={"runAsUser": 0}))[0]["spec"]
    assert root["securityContext"]["runAsUser"] == 0 and "runAsNonRoot" not in root["securityContext"]
    assert "checkpoint-dirs" not in {c["name"] for c in root.get("initContainers") or []}


def test_pod_contract_env_and_nccl_overrides() -> None:
    env = _env(_pods(_spec(nccl={"NCCL_CROSS_NIC": "1", "NCCL_DEBUG": "INFO"}, env=[{"name": "MASTER_PORT", "value": "1234"}]))[1])
    for key in ("RAILYARD_CONFIG", "RAILYARD_RANK_TABLE", "RAILYARD_POD_INDEX", "RAILYARD_NODE_NAME", "RAILYARD_JOB",
                "RAILYARD_NAMESPACE", "RAILYARD_ATTEMPT", "MASTER_ADDR", "RAILYARD_HEARTBEAT_URL", "RAILYARD_HEARTBEAT_TOKEN",
                "RAILYARD_CHECKPOINT_MEMORY_DIR", "RAILYARD_CHECKPOINT_LOCAL_DIR", "RAILYARD_CHECKPOINT_SHARED_DIR"):
        assert key in env, key
    assert env["RAILYARD_POD_INDEX"] == "1" and env["MASTER_ADDR"] == "llm-0.llm.ml.svc"
    assert env["RAILYARD_HEARTBEAT_TOKEN"] == {"secretKeyRef": {"name": "llm-heartbeat", "key": "token"}}
    assert env["NCCL_CROSS_NIC"] == "1" and env["NCCL_DEBUG"] == "INFO", "spec.nccl overrides the defaults"
    assert env["MASTER_PORT"] == "1234", "spec.env wins"
    assert NCCL_DEFAULTS["NCCL_CROSS_NIC"] == "0"


def test_shared_tier_uses_the_claim_when_given() -> None:
    vols = {v["name"]: v for v in _pods(_spec(checkpoint={"shared": {"claimName": "ckpt"}}))[0]["spec"]["volumes"]}
    assert vols["ckpt-shared"] == {"name": "ckpt-shared", "persistentVolumeClaim": {"claimName": "ckpt"}}
    assert vols["ckpt-memory"]["hostPath"]["path"] == "/dev/shm/railyard/ml/llm"


def test_configmap_holds_rank_table_and_trainer_config() -> None:
    spec = _spec(parallelism={"tensor": 2})
    from tests.operator.builders import make_node

    job = __import__("railyard.api.trainingjob", fromlist=["TrainingJob"]).TrainingJob.model_validate(
        {"metadata": {"name": "llm", "namespace": "ml"}, "spec": spec.model_dump(by_alias=True)}
    )
    placed = plan_placement(build_placement_input(job, attempt=3, nodes=[make_node("n-a"), make_node("n-b")]))
    table = with_addresses(placed.rank_table, "ml")  # type: ignore[union-attr]
    cfg = build_trainer_config(spec, job="llm", namespace="ml", attempt=3, restore={"tier": "memory", "step": 40})
    cm = build_configmap("llm", "ml", OWNER, attempt=3, rank_table=table, config=cfg)
    assert cm["metadata"]["name"] == "llm-a3"
    rt = json.loads(cm["data"]["ranktable.json"])
    assert rt["master_addr"] == "llm-0.llm.ml.svc" and rt["attempt"] == 3 and len(rt["ranks"]) == 4
    conf = json.loads(cm["data"]["config.json"])
    assert conf["attempt"] == 3 and conf["parallelism"]["tensor"] == 2 and conf["restore"] == {"tier": "memory", "step": 40}
    assert conf["trainer"]["batchSize"] == 8 and "memory" in conf["checkpoint"]
    from railyard_trainer.config import TrainerConfig

    assert TrainerConfig.from_dict(conf).parallelism.tensor == 2, "the trainer reads what we write"


def test_service_is_headless_and_publishes_not_ready() -> None:
    svc = build_service("llm", "ml", OWNER)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True


def test_gate_removal_keeps_foreign_gates() -> None:
    pod = {"spec": {"schedulingGates": [{"name": GANG_GATE}, {"name": "kueue.x-k8s.io/admission"}]}}
    ours_only = {"spec": {"schedulingGates": [{"$patch": "delete", "name": GANG_GATE}]}}
    assert build_gate_removal(pod) == ours_only, "a delete by name: the server's list decides what else stays"
    assert build_gate_removal({"spec": {"schedulingGates": [{"name": GANG_GATE}]}}) == ours_only
    assert build_gate_removal({"spec": {}}) is None


def test_long_names_are_reported_with_the_fix() -> None:
    assert check_names("x" * 62, 10) and "metadata.name" in check_names("x" * 62, 10)[0]
    assert check_names("x" * 61, 10) == []
    assert check_names("llm", 1000) == []


def test_assessing_a_gang() -> None:
    from tests.operator.builders import make_node, make_pod

    nodes = {f"node-{i}": make_node(f"node-{i}") for i in range(3)}
    running = [make_pod(index=i, node=f"node-{i}").obj() for i in range(2)]
    assert assess_gang(running, nodes, attempt=0, expected=2, now=0).state == "Running"
    assert assess_gang([], nodes, attempt=0, expected=2, now=0).state == "Absent"
    partial = [make_pod(index=0).gated().obj()]
    a = assess_gang(partial, nodes, attempt=0, expected=2, now=0)
    assert a.state == "Partial" and a.missing == (1,)
    gated = [make_pod(index=i).gated().obj() for i in range(2)]
    assert assess_gang(gated, nodes, attempt=0, expected=2, now=0).state == "Gated"
    lost = [make_pod(index=0).obj()]
    a = assess_gang(lost, nodes, attempt=0, expected=2, now=0)
    assert a.state == "Failed" and a.failure is not None and a.failure.kind == "PodLost"
    done = [make_pod(index=i).exited(0).obj() for i in range(2)]
    assert assess_gang(done, nodes, attempt=0, expected=2, now=0).state == "Succeeded"
    old = [*running, make_pod(attempt=1, index=0).obj()]
    a = assess_gang(old, nodes, attempt=1, expected=2, now=0)
    assert a.stale == ("j-a0-0", "j-a0-1")


def test_not_ready_grace_defers_the_verdict() -> None:
    from tests.operator.builders import make_node, make_pod

    from railyard.logic.conditions import parse_time

    since = "2026-01-01T00:00:00Z"
    t = parse_time(since) or 0.0
    nodes = {"node-0": make_node("node-0", ready=False, since=since)}
    pods = [make_pod().obj()]
    early = assess_gang(pods, nodes, attempt=0, expected=1, now=t + 1, not_ready_grace_s=3)
    assert early.state == "Running" and 1.9 < early.recheck_after < 2.1
    late = assess_gang(pods, nodes, attempt=0, expected=1, now=t + 4, not_ready_grace_s=3)
    assert late.state == "Failed" and late.failure is not None and late.failure.nodes == ("node-0",)


def test_pods_on_dead_nodes_and_stuck_ones_are_force_deleted() -> None:
    from tests.operator.builders import make_node, make_pod

    from railyard.logic.conditions import parse_time
    from railyard.logic.gang import plan_pod_deletions

    nodes = {"ok": make_node("ok"), "dead": make_node("dead", ready=False)}
    t = parse_time("2026-01-01T00:01:00Z") or 0.0
    pods = [
        make_pod(index=0, node="ok").obj(),                                   # graceful
        make_pod(index=1, node="dead").obj(),                                 # force: kubelet gone
        make_pod(index=2, node="ok").exited(1).obj(),                         # force: already ended
        make_pod(index=3, node="ok").deleting("2026-01-01T00:00:50Z").obj(),  # terminating 10 s: wait
        make_pod(index=4, node="ok").deleting("2026-01-01T00:00:00Z").obj(),  # stuck 60 s: force
        make_pod(index=5, node="dead").deleting("2026-01-01T00:00:59Z").obj(),  # terminating on a dead node: force
    ]
    normal, force = plan_pod_deletions(pods, nodes, now=t, asked={}, stuck_terminating_s=30)
    assert normal == ["j-a0-0"]
    assert force == ["j-a0-1", "j-a0-2", "j-a0-4", "j-a0-5"]
    normal, force = plan_pod_deletions(pods, nodes, now=t, asked={n: t - 1 for n in normal + force})
    assert (normal, force) == ([], []), "no DELETE storm while pods terminate"


def test_cleanup_pod_mounts_the_tiers_and_runs_the_trainers_cleanup() -> None:
    from railyard.logic.manifests import build_cleanup_pod

    pod = build_cleanup_pod(_spec(checkpoint={"shared": {"claimName": "ckpt"}}), job="llm", namespace="ml", index=1, node="n-b", shared=False)
    c = pod["spec"]["containers"][0]
    assert c["command"] == ["python", "-m", "railyard_trainer.checkpoint.cleanup", "--job", "llm"]
    assert pod["spec"]["nodeName"] == "n-b" and pod["metadata"]["name"] == "llm-cleanup-1"
    assert {v["name"] for v in pod["spec"]["volumes"]} == {"ckpt-memory", "ckpt-local"}
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["RAILYARD_CHECKPOINT_SHARED_DIR"] == "" and env["RAILYARD_CHECKPOINT_MEMORY_DIR"]
    shared = build_cleanup_pod(_spec(checkpoint={"shared": {"claimName": "ckpt"}}), job="llm", namespace="ml", index=0, node="n-a", shared=True)
    assert {"name": "ckpt-shared", "persistentVolumeClaim": {"claimName": "ckpt"}} in shared["spec"]["volumes"]
    assert "ownerReferences" not in shared["metadata"]


def test_rendezvous_ports_stay_out_of_the_ephemeral_and_nodeport_ranges() -> None:
    """A rendezvous port inside Linux's ephemeral range can already be the local end of one of
    the pod's outgoing connections (the new attempt's TCPStore then fails with EADDRINUSE); the
    NodePort range may be held by kube-proxy on hostNetwork nodes. Every job and attempt gets a
    port below both, and different attempts of a job get different ports."""
    from railyard.logic.manifests import rendezvous_port

    ports = [rendezvous_port(f"job-{j}", "ns", a) for j in range(200) for a in range(20)]
    assert all(1024 < p < 30000 for p in ports), (min(ports), max(ports))
    assert len({rendezvous_port("job-1", "ns", a) for a in range(20)}) >= 19


def test_a_planned_node_that_can_no_longer_take_its_pod_is_found_with_the_reason() -> None:
    from tests.operator.builders import make_node

    from railyard.api.trainingjob import TrainingJob
    from railyard.logic.gang import find_stale_placement

    job = TrainingJob.model_validate({
        "metadata": {"name": "llm", "namespace": "ml"},
        "spec": {"nodes": 2, "procsPerNode": 2, "nodeSelector": {"pool": "a"},
                 "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    })
    pods = _pods(job.spec)  # planned on n-a and n-b, not bound yet
    pool = {"pool": "a"}

    def why(n_b: dict | None, *, bound: bool = False) -> list[tuple[str, str, str]]:
        nodes = {"n-a": make_node("n-a", labels=pool)} | ({"n-b": n_b} if n_b is not None else {})
        ps = [dict(p, spec={**p["spec"], "nodeName": "n-b"}) if bound and i == 1 else p for i, p in enumerate(pods)]
        return [(s.pod, s.node, s.why) for s in find_stale_placement(job, ps, nodes)]

    assert why(make_node("n-b", labels=pool)) == []
    assert why(None) == [("llm-a0-1", "n-b", "NodeGone")]
    assert why(make_node("n-b", labels={"pool": "b"})) == [("llm-a0-1", "n-b", "NotSelected")]
    cordoned = make_node("n-b", labels=pool)
    cordoned["spec"]["unschedulable"] = True
    assert why(cordoned) == [("llm-a0-1", "n-b", "Unschedulable")]
    assert why(make_node("n-b", labels=pool, taints=[{"key": "other", "effect": "NoSchedule"}])) == [("llm-a0-1", "n-b", "Tainted")]
    # what the pods tolerate, a node that may come back, and a pod already bound: nothing to do
    assert why(make_node("n-b", labels=pool, taints=[{"key": "gpu", "effect": "NoSchedule"}])) == []
    assert why(make_node("n-b", labels=pool, ready=False)) == []
    assert why(None, bound=True) == []
