"""faultTolerance ReplicaGroups in the gang's objects: each group's pods get their own world
(rank table, rendezvous on the group's first pod), their group index and the Lighthouse; the
Lighthouse pod itself; and when the operator creates, keeps, repairs or deletes it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.operator.builders import make_node, make_pod

from railyard.api.trainingjob import TrainingJob, TrainingJobSpec
from railyard.api.validation import check_spec_rules
from railyard.logic.lighthouse import decide_lighthouse
from railyard.logic.manifests import (
    LIGHTHOUSE_LABEL,
    build_configmap,
    build_gang_pods,
    build_lighthouse_pod,
    build_network_policy,
    build_service,
    build_trainer_config,
    check_names,
    group_rank_table_file,
    lighthouse_address,
    lighthouse_port,
    rendezvous_port,
    with_addresses,
)
from railyard.logic.manifests.pod import MULTUS_NETWORKS_ANNOTATION, build_pod
from railyard.logic.placement import Placement, build_placement_input, plan_placement
from railyard.protocol.podenv import LIGHTHOUSE, POD_IP, REPLICA_GROUP
from railyard.protocol.ranktable import RankTable
from railyard.protocol.trainerconfig import (
    JOIN_TIMEOUT_FLOOR_SECONDS,
    cross_group_timeout_seconds,
    lighthouse_heartbeat_timeout_ms,
    lighthouse_join_timeout_ms,
)

OWNER = {"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "name": "llm", "uid": "u-1", "controller": True}
NODES = ["n-0", "n-1", "n-2", "n-3", "n-4", "n-5"]
RG = {"parallelism": {"dataReplicas": 3}, "faultTolerance": {"mode": "ReplicaGroups", "minReplicas": 2}}


def _spec(**kw: Any) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({"nodes": 6, "procsPerNode": 2, "gpusPerPod": 0, **kw})


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def _objects(spec: TrainingJobSpec) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    job = {"metadata": {"name": "llm", "namespace": "ml"}, "spec": spec.model_dump(by_alias=True, exclude_none=True, mode="json")}
    tj = TrainingJob.model_validate(job)
    nodes = [make_node(n, leaf=f"leaf-{i // 3}") for i, n in enumerate(NODES)]
    pl = plan_placement(build_placement_input(tj, nodes=nodes, attempt=0))
    assert isinstance(pl, Placement), pl
    pods = build_gang_pods(spec, job="llm", namespace="ml", owner=OWNER, attempt=0, nodes=pl.nodes, heartbeat_url="http://op/v1/heartbeats/ml/llm")
    config = build_trainer_config(spec, job="llm", namespace="ml", attempt=0)
    cm = build_configmap("llm", "ml", OWNER, attempt=0, rank_table=with_addresses(pl.rank_table, "ml"), config=config,
                         replica_groups=spec.replica_groups)
    return pods, cm


def test_each_group_gets_its_own_world_its_index_and_the_lighthouse() -> None:
    pods, cm = _objects(_spec(**RG))
    envs = [_env(p) for p in pods]
    assert [e[REPLICA_GROUP.name] for e in envs] == ["0", "0", "1", "1", "2", "2"]
    assert {e[LIGHTHOUSE.name] for e in envs} == {lighthouse_address("llm", "ml")}
    assert all(e[POD_IP.name] == {"fieldRef": {"fieldPath": "status.podIP"}} for e in envs), "torchft advertises the pod's IP"
    assert lighthouse_address("llm", "ml") == f"http://llm-lighthouse.llm.ml.svc:{lighthouse_port('llm', 'ml')}"
    for i, e in enumerate(envs):
        g = i // 2
        assert e["MASTER_ADDR"] == f"llm-{2 * g}.llm.ml.svc", "the rendezvous is the group's first pod"
        assert e["MASTER_PORT"] == str(rendezvous_port("llm", "ml", 0, g))
        assert e["RAILYARD_RANK_TABLE"] == f"/etc/railyard/{group_rank_table_file(g)}"
        assert pods[i]["spec"]["containers"][0]["ports"][0]["containerPort"] == rendezvous_port("llm", "ml", 0, g)
        assert e["RAILYARD_CHECKPOINT_SHARED_DIR"] == f"/railyard/checkpoints/shared/group-{g}", "the groups' files never collide"
        assert e["RAILYARD_CHECKPOINT_MEMORY_DIR"] == f"/railyard/checkpoints/memory/group-{g}"
    assert len({rendezvous_port("llm", "ml", 0, g) for g in range(3)}) == 3, "groups sharing a host never share a port"
    for g in range(3):
        t = RankTable.from_json(cm["data"][group_rank_table_file(g)])
        assert [p.pod_index for p in t.pods] == [2 * g, 2 * g + 1]
        assert t.world_size == 4 and t.dp == 4 and t.master_addr == f"llm-{2 * g}.llm.ml.svc"
        assert t.master_port == rendezvous_port("llm", "ml", 0, g)
    full = RankTable.from_json(cm["data"]["ranktable.json"])
    assert full.world_size == 12, "the job's own table stays"
    assert json.loads(cm["data"]["config.json"])["faultTolerance"] == {"mode": "ReplicaGroups", "minReplicas": 2, "healNetwork": {}}


def test_without_replica_groups_nothing_changes() -> None:
    pods, cm = _objects(_spec(parallelism={"dataReplicas": 3}))
    envs = [_env(p) for p in pods]
    assert not any(REPLICA_GROUP.name in e or LIGHTHOUSE.name in e or POD_IP.name in e for e in envs)
    assert {e["MASTER_ADDR"] for e in envs} == {"llm-0.llm.ml.svc"}
    assert {e["RAILYARD_RANK_TABLE"] for e in envs} == {"/etc/railyard/ranktable.json"}
    assert {e["RAILYARD_CHECKPOINT_SHARED_DIR"] for e in envs} == {"/railyard/checkpoints/shared"}
    assert set(cm["data"]) == {"ranktable.json", "config.json"}


def test_the_lighthouse_pod_runs_the_trainer_image_under_the_headless_service() -> None:
    spec = _spec(**RG, tolerations=[{"key": "gpu", "operator": "Exists"}])
    pod = build_lighthouse_pod(spec, job="llm", namespace="ml", owner=OWNER)
    s = pod["spec"]
    c = s["containers"][0]
    assert c["image"] == spec.image
    assert c["command"] == ["railyard-train", "lighthouse", "--min-replicas", "2", "--bind", f"[::]:{lighthouse_port('llm', 'ml')}",
                            "--join-timeout-ms", "15000", "--heartbeat-timeout-ms", "1000"], "a quarter of the default 60 s watchdog; ten missed 100 ms beats"
    assert (s["hostname"], s["subdomain"]) == ("llm-lighthouse", "llm")
    assert pod["metadata"]["ownerReferences"] == [OWNER], "deleted with the job"
    assert pod["metadata"]["labels"][LIGHTHOUSE_LABEL] == "true"
    service = build_service("llm", "ml", OWNER)
    assert all(pod["metadata"]["labels"][k] == v for k, v in service["spec"]["selector"].items()), "its DNS name resolves"
    assert s["restartPolicy"] == "Always" and "schedulingGates" not in s
    assert s["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False and s["securityContext"]["runAsNonRoot"] is True


def _lighthouse(phase: str = "Running", node: str = "n-0", deleting: bool = False) -> dict[str, Any]:
    pod = make_pod(index=0, node=node).phase(phase)
    if deleting:
        pod = pod.deleting()
    obj = pod.obj()
    obj["metadata"]["name"] = "j-lighthouse"
    obj["metadata"]["labels"] = {"railyard.dev/job": "j", LIGHTHOUSE_LABEL: "true"}
    return obj


NODE_MAP = {"n-0": make_node("n-0"), "n-1": make_node("n-1", ready=False)}


@pytest.mark.parametrize(
    ("groups", "phase", "deleting", "have", "create", "delete", "lost"),
    [
        pytest.param(3, "Starting", False, [], True, 0, False, id="created-with-the-gang"),
        pytest.param(3, "Running", False, [_lighthouse()], False, 0, False, id="kept-while-running"),
        pytest.param(3, "Restarting", False, [_lighthouse()], False, 0, False, id="kept-between-attempts"),
        pytest.param(3, "Running", False, [_lighthouse("Failed")], False, 1, True, id="ended-is-recreated"),
        pytest.param(3, "Running", False, [_lighthouse(node="n-1")], False, 1, True, id="node-not-ready-is-recreated"),
        pytest.param(3, "Running", False, [_lighthouse(node="gone")], False, 1, True, id="node-gone-is-recreated"),
        pytest.param(3, "Running", False, [_lighthouse(deleting=True)], False, 0, False, id="waits-for-the-old-one"),
        pytest.param(3, "Succeeded", False, [_lighthouse()], False, 1, False, id="deleted-when-finished"),
        pytest.param(3, "Running", True, [_lighthouse()], False, 1, False, id="deleted-with-the-job"),
        pytest.param(3, "Placing", False, [], False, 0, False, id="not-before-the-gang"),
        pytest.param(1, "Running", False, [], False, 0, False, id="one-world-needs-none"),
    ],
)
def test_when_the_operator_creates_keeps_repairs_or_deletes_the_lighthouse(
    groups: int, phase: str, deleting: bool, have: list[dict[str, Any]], create: bool, delete: int, lost: bool,
) -> None:
    d = decide_lighthouse(replica_groups=groups, phase=phase, deleting=deleting, have=have, nodes=NODE_MAP)
    assert (d.create, len(d.delete), bool(d.lost)) == (create, delete, lost)


@pytest.mark.parametrize(
    ("nodes", "replicas", "min_replicas", "field"),
    [
        (4, 3, 1, "spec.nodes"),
        (4, 2, 2, None),
        (3, 3, 4, "spec.faultTolerance.minReplicas"),
    ],
)
def test_groups_must_be_whole_pods(nodes: int, replicas: int, min_replicas: int, field: str | None) -> None:
    spec = {"nodes": nodes, "procsPerNode": 3, "trainer": {"batchSize": 144}, "parallelism": {"dataReplicas": replicas},
            "faultTolerance": {"mode": "ReplicaGroups", "minReplicas": min_replicas}}
    fields = [p.path for p in check_spec_rules(spec)]
    assert fields == ([field] if field else []), fields


def test_the_jobs_pods_admit_only_the_jobs_pods() -> None:
    policy = build_network_policy("llm", "ml", OWNER)
    spec = policy["spec"]
    lighthouse = build_lighthouse_pod(_spec(**RG), job="llm", namespace="ml", owner=OWNER)
    assert all(lighthouse["metadata"]["labels"][k] == v for k, v in spec["podSelector"]["matchLabels"].items()), "the Lighthouse is covered"
    assert spec["policyTypes"] == ["Ingress"], "egress (DNS, the operator) stays open"
    assert spec["ingress"] == [{"from": [{"podSelector": {"matchLabels": {"railyard.dev/job": "llm"}}}]}]
    assert policy["metadata"]["ownerReferences"] == [OWNER]


def test_a_job_name_leaves_room_for_the_lighthouse_hostname() -> None:
    name = "x" * 55  # <name>-5 fits a DNS label, <name>-lighthouse does not
    assert check_names(name, 6) == []
    problems = check_names(name, 6, lighthouse=True)
    assert problems and problems[0].startswith("metadata.name:") and "at most 52 characters" in problems[0], problems


@pytest.mark.parametrize(
    ("watchdog_s", "join_ms"),
    [
        pytest.param(60.0, 15_000, id="default-watchdog-a-quarter"),
        pytest.param(40.0, 10_000, id="system-tests-watchdog"),
        pytest.param(600.0, 150_000, id="long-watchdog"),
        pytest.param(16.0, 5_000, id="floor-5s"),
        pytest.param(8.0, 4_000, id="short-watchdog-half-wins-over-the-floor"),
        pytest.param(0.001, 1, id="never-zero"),
    ],
)
def test_the_lighthouse_join_timeout_stays_below_the_watchdog(watchdog_s: float, join_ms: int) -> None:
    assert lighthouse_join_timeout_ms(watchdog_s) == join_ms
    assert join_ms <= watchdog_s * 1000 / 2 or join_ms == 1
    spec = _spec(**RG, trainer={"watchdogSeconds": watchdog_s, "collectiveTimeoutSeconds": 3600})
    command = build_lighthouse_pod(spec, job="llm", namespace="ml", owner=OWNER)["spec"]["containers"][0]["command"]
    assert command[command.index("--join-timeout-ms") + 1] == str(join_ms), "the manifest uses the rule"


def test_a_lost_group_is_dropped_well_before_a_slow_one() -> None:
    """The survivors of a lost group stand until the Lighthouse's heartbeat timeout; a live group
    that is slow to ask for the quorum is waited for up to the join timeout, whose floor stays
    well above it."""
    assert lighthouse_heartbeat_timeout_ms() < 5_000, "below torchft's default 5 s"
    assert lighthouse_heartbeat_timeout_ms() * 4 <= JOIN_TIMEOUT_FLOOR_SECONDS * 1000


@pytest.mark.parametrize(
    ("collective_s", "watchdog_s", "cross_s"),
    [
        pytest.param(120.0, 60.0, 15.0, id="defaults-the-join-timeout"),
        pytest.param(300.0, 240.0, 60.0, id="long-watchdog"),
        pytest.param(10.0, 8.0, 4.0, id="short-watchdog"),
        pytest.param(3.0, 2.0, 1.0, id="below-the-floor-half-the-watchdog"),
    ],
)
def test_cross_group_collectives_give_up_before_the_lighthouse_drops_a_waiting_group(collective_s: float, watchdog_s: float, cross_s: float) -> None:
    got = cross_group_timeout_seconds(collective_timeout_seconds=collective_s, watchdog_seconds=watchdog_s)
    assert got == cross_s
    # no longer than the Lighthouse waits for a live group to join, nor than the group's own
    # collectives (the API keeps watchdogSeconds below collectiveTimeoutSeconds)
    assert got <= lighthouse_join_timeout_ms(watchdog_s) / 1000 and got <= collective_s


@pytest.mark.parametrize(
    ("heal_network", "existing", "networks"),
    [
        ({}, None, None),  # the pod network, as before: nothing attached
        ({"interface": "ib0"}, None, None),  # an interface the pods already have: nothing attached
        ({"attachment": "ib-heal"}, None, '[{"name":"ib-heal","interface":"heal0"}]'),
        ({"attachment": "net/ib-heal", "interface": "ib1"}, None, '[{"name":"ib-heal","interface":"ib1","namespace":"net"}]'),
        ({"attachment": "ib-heal"}, '[{"name":"rdma"}]', '[{"name":"rdma"},{"name":"ib-heal","interface":"heal0"}]'),
        ({"attachment": "net/ib-heal"}, "rdma@net1", "rdma@net1,net/ib-heal@heal0"),
    ],
)
def test_a_heal_network_attachment_is_asked_of_multus_as_the_interface_the_trainer_reads(
    heal_network: dict[str, Any], existing: str | None, networks: str | None
) -> None:
    spec = _spec(**{**RG, "faultTolerance": {**RG["faultTolerance"], "healNetwork": heal_network}})
    settings = {} if existing is None else {MULTUS_NETWORKS_ANNOTATION: existing}
    pod = build_pod(spec, job="llm", namespace="ml", owner=OWNER, attempt=0, pod_index=0, node="n-0",
                    heartbeat_url="http://op/v1/heartbeats/ml/llm", annotations=settings)
    assert pod["metadata"]["annotations"].get(MULTUS_NETWORKS_ANNOTATION) == networks
    # the trainer finds the same interface name in its config.json
    config = build_trainer_config(spec, job="llm", namespace="ml", attempt=0)
    assert config["faultTolerance"]["healNetwork"] == heal_network
