"""The local scheduler's filter and score rules, table-driven, without a server."""

from __future__ import annotations

from typing import Any, cast

import pytest

from railyard.api.corev1 import Toleration, compute_pod_requests
from railyard.api.quantity import QuantityError, parse_quantity, to_milli
from railyard_local.kube import KubeClient
from railyard_local.scheduler import GROUP, Scheduler
from railyard_local.scheduling import (
    GANG_NO_PREEMPTION,
    GANG_WAITING_MESSAGE,
    DecisionCache,
    GangDecision,
    GangPolicy,
    NodeInfo,
    build_gang_policy,
    build_node_info,
    candidate_names,
    check_node,
    decide_gang,
    decide_node,
    is_gated,
    topology_domains,
)

from .builders import make_node, make_pod


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)} if values else {"key": key, "operator": op}


NODE = make_node("node-0", labels={"railyard.dev/leaf": "leaf-0", "gen": "5"}, gpus=2)


@pytest.mark.parametrize(
    ("pod", "fits"),
    [
        (make_pod(), True),
        (make_pod().node_selector(**{"railyard.dev/leaf": "leaf-0"}), True),
        (make_pod().node_selector(**{"railyard.dev/leaf": "leaf-1"}), False),
        (make_pod().affinity({"matchExpressions": [expr("railyard.dev/leaf", "In", "leaf-0", "leaf-9")]}), True),
        (make_pod().affinity({"matchExpressions": [expr("railyard.dev/leaf", "In", "leaf-9")]}), False),
        (make_pod().affinity({"matchExpressions": [expr("railyard.dev/leaf", "NotIn", "leaf-0")]}), False),
        (make_pod().affinity({"matchExpressions": [expr("missing", "NotIn", "x")]}), True),
        (make_pod().affinity({"matchExpressions": [expr("gen", "Exists")]}), True),
        (make_pod().affinity({"matchExpressions": [expr("gen", "DoesNotExist")]}), False),
        (make_pod().affinity({"matchExpressions": [expr("gen", "Gt", "4")]}), True),
        (make_pod().affinity({"matchExpressions": [expr("gen", "Gt", "5")]}), False),
        (make_pod().affinity({"matchExpressions": [expr("gen", "Lt", "6")]}), True),
        (make_pod().affinity({"matchExpressions": [expr("missing", "Lt", "6")]}), False),
        (make_pod().affinity({"matchFields": [expr("metadata.name", "In", "node-0")]}), True),
        (make_pod().affinity({"matchFields": [expr("metadata.name", "NotIn", "node-0")]}), False),
        # terms are ORed, expressions in a term ANDed; an empty term matches nothing
        (make_pod().affinity({"matchExpressions": [expr("gen", "In", "4")]}, {"matchExpressions": [expr("gen", "In", "5")]}), True),
        (make_pod().affinity({"matchExpressions": [expr("gen", "In", "5"), expr("railyard.dev/leaf", "In", "x")]}), False),
        (make_pod().affinity({}), False),
        (make_pod().requests(cpu="16"), True),
        (make_pod().requests(cpu="16001m"), False),
        (make_pod().requests(memory="64Gi"), True),
        (make_pod().requests(memory="65Gi"), False),
        (make_pod().gpus(2), True),
        (make_pod().gpus(3), False),
        (make_pod().requests(**{"example.com/fpga": "1"}), False),
    ],
)
def test_filter_rules_on_a_free_node(pod: Any, fits: bool) -> None:
    node = build_node_info(NODE)
    obj = pod.obj()
    assert (check_node(obj, node, compute_pod_requests(obj)) is None) == fits


TAINT = {"key": "gpu", "value": "broken", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "taint", "ok"),
    [
        ({"key": "gpu", "operator": "Equal", "value": "broken", "effect": "NoSchedule"}, TAINT, True),
        ({"key": "gpu", "value": "broken"}, TAINT, True),
        ({"key": "gpu", "value": "fine"}, TAINT, False),
        ({"key": "gpu", "operator": "Exists"}, TAINT, True),
        ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, TAINT, False),
        ({"operator": "Exists"}, TAINT, True),
        ({"key": "other", "operator": "Exists"}, TAINT, False),
    ],
)
def test_toleration_matching(toleration: dict[str, str], taint: dict[str, str], ok: bool) -> None:
    assert Toleration.from_dict(toleration).tolerates(taint) == ok


@pytest.mark.parametrize(
    ("taint", "toleration", "fits"),
    [
        ({"key": "k", "effect": "NoSchedule"}, None, False),
        ({"key": "k", "effect": "NoExecute"}, None, False),
        ({"key": "k", "effect": "PreferNoSchedule"}, None, True),
        ({"key": "k", "effect": "NoSchedule"}, {"key": "k", "operator": "Exists"}, True),
    ],
)
def test_taints_keep_pods_off_unless_tolerated(taint: dict[str, str], toleration: dict[str, str] | None, fits: bool) -> None:
    node = build_node_info(make_node("n", taints=[taint]))
    pod = make_pod()
    if toleration:
        pod.toleration(**toleration)
    assert (check_node(pod.obj(), node, {}) is None) == fits


def test_not_ready_and_cordoned_nodes_take_no_pods_without_toleration() -> None:
    not_ready = build_node_info(make_node("a", ready=False))
    cordoned = build_node_info(make_node("b", unschedulable=True))
    assert "not-ready" in (check_node(make_pod().obj(), not_ready, {}) or "")
    assert "unschedulable" in (check_node(make_pod().obj(), cordoned, {}) or "")
    tolerant = make_pod().toleration(key="node.kubernetes.io/not-ready", operator="Exists").obj()
    assert check_node(tolerant, not_ready, {}) is None


def test_capacity_counts_usage_and_pod_slots() -> None:
    node = build_node_info(make_node("n", gpus=2, pods=2))
    pod = make_pod().gpus(1).obj()
    req = compute_pod_requests(pod)
    assert check_node(pod, node, req) is None
    node.add(req)
    assert check_node(pod, node, req) is None
    node.add(req)
    reason = check_node(pod, node, req)
    assert reason == "Too many pods"
    node.add(req, sign=-1)
    node.allocatable["pods"] = 10_000
    node.add(req)
    assert check_node(pod, node, req) == "Insufficient nvidia.com/gpu"


def test_requests_sum_containers_take_max_of_init_and_default_to_limits() -> None:
    pod = make_pod().requests(cpu="500m", memory="1Gi").obj()
    pod["spec"]["containers"].append({"name": "side", "resources": {"limits": {"cpu": "1"}}})
    pod["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "2", "memory": "100Mi"}}}]
    req = compute_pod_requests(pod)
    assert req["cpu"] == 2000  # max(0.5 + 1, 2)
    assert req["memory"] == 1024**3 * 1000


def test_decide_spreads_to_least_allocated_and_is_deterministic() -> None:
    nodes = {n: build_node_info(make_node(n)) for n in ("node-1", "node-0", "node-2")}
    pod = make_pod().requests(cpu="4").obj()
    assert decide_node(pod, nodes).node == "node-0"
    nodes["node-0"].add({"cpu": 4000})
    assert decide_node(pod, nodes).node == "node-1"


def test_unschedulable_message_counts_reasons_like_kube_scheduler() -> None:
    nodes = {"a": build_node_info(make_node("a", cpu="1")), "b": build_node_info(make_node("b", ready=False))}
    decision = decide_node(make_pod().requests(cpu="2").obj(), nodes)
    assert decision.node is None
    assert decision.message.startswith("0/2 nodes are available: ")
    assert "1 Insufficient cpu" in decision.message
    assert "1 node(s) had untolerated taint {node.kubernetes.io/not-ready: NoSchedule}" in decision.message


def test_pinned_pods_only_consider_their_nodes() -> None:
    pinned = make_pod().affinity({"matchFields": [expr("metadata.name", "In", "node-7")]}).obj()
    assert candidate_names(pinned) == {"node-7"}
    assert candidate_names(make_pod().node_selector(**{"kubernetes.io/hostname": "node-3"}).obj()) == {"node-3"}
    assert candidate_names(make_pod().obj()) is None
    nodes = {f"node-{i}": build_node_info(make_node(f"node-{i}")) for i in range(10)}
    assert decide_node(pinned, nodes).node == "node-7"


def test_the_decision_cache_changes_no_decision() -> None:
    """Pods of a few shapes scheduled one after another, with nodes filling up, being replaced
    (a taint, a readiness change) and pods released: with and without the scheduler's cache,
    every decision (node or message) is the same."""
    import random

    rng = random.Random(7)
    shapes = [
        make_pod().gpus(1),
        make_pod().requests(cpu="3"),
        make_pod().node_selector(**{"railyard.dev/leaf": "leaf-1"}).gpus(1),
        make_pod().affinity({"matchExpressions": [expr("gen", "In", "5")]}).requests(cpu="1"),
        make_pod().toleration(key="maintenance", operator="Exists").gpus(2),
    ]

    def fresh() -> dict[str, Any]:
        return {f"node-{i}": build_node_info(make_node(
            f"node-{i}", gpus=4, labels={"railyard.dev/leaf": f"leaf-{i % 3}", "gen": str(4 + i % 2)}))
            for i in range(12)}

    plain, cached = fresh(), fresh()
    cache = DecisionCache(max_shapes=3)  # fewer than the shapes: the cache also starts afresh
    placed: list[tuple[str, dict[str, int]]] = []
    for step in range(400):
        pod = rng.choice(shapes).obj()
        req = compute_pod_requests(pod)
        a = decide_node(pod, plain, req, start=step)
        b = decide_node(pod, cached, req, start=step, cache=cache)
        assert (a.node, a.message) == (b.node, b.message), step
        if a.node is not None:
            plain[a.node].add(req)
            cached[a.node].add(req)
            placed.append((a.node, req))
        if placed and rng.random() < 0.3:  # a pod ends
            node, r = placed.pop(rng.randrange(len(placed)))
            plain[node].add(r, sign=-1)
            cached[node].add(r, sign=-1)
        if rng.random() < 0.05:  # a node changes: the informer builds a new NodeInfo
            name = f"node-{rng.randrange(12)}"
            taints = [{"key": "maintenance", "effect": "NoSchedule"}] if rng.random() < 0.5 else []
            node = make_node(name, gpus=4, taints=taints, ready=rng.random() < 0.8,
                             labels={"railyard.dev/leaf": f"leaf-{int(name[5:]) % 3}", "gen": "5"})
            for infos in (plain, cached):
                info = build_node_info(node)
                info.requested = dict(infos[name].requested)
                infos[name] = info


def test_gates() -> None:
    assert is_gated(make_pod().gate().obj())
    assert not is_gated(make_pod().obj())


@pytest.mark.parametrize(
    ("text", "milli"),
    [("1", 1000), ("500m", 500), ("1.5", 1500), ("1Ki", 1024_000), ("2Gi", 2 * 1024**3 * 1000), ("1e3", 1_000_000), ("1k", 1_000_000), ("100n", 1)],
)
def test_quantities(text: str, milli: int) -> None:
    assert to_milli(text) == milli


def test_bad_quantity_names_the_fix() -> None:
    with pytest.raises(QuantityError, match="64Gi"):
        parse_quantity("64 gigs")


async def test_a_node_deleted_and_added_again_still_counts_the_pods_bound_to_it() -> None:
    sched = Scheduler(cast(KubeClient, None), {})
    node = make_node("node-0", gpus=2)
    pod = make_pod("a", "default").gpus(2).on_node("node-0").obj()
    pod["metadata"]["uid"] = "uid-a"
    sched.on_node("ADDED", node, None)
    sched.on_pod("ADDED", pod, None)
    sched.on_node("DELETED", node, node)
    sched.on_node("ADDED", node, None)
    assert sched.nodes["node-0"].requested["nvidia.com/gpu"] == 2000
    sched.on_pod("DELETED", pod, pod)
    assert sched.nodes["node-0"].requested["nvidia.com/gpu"] == 0


# ---- gangs: a PodGroup's pods all at once, inside one topology domain -----------------------------

LEAVES = {f"fake-{i:04d}": build_node_info(make_node(f"fake-{i:04d}", gpus=8,
                                                     labels={"railyard.dev/leaf": f"leaf-{i // 3}"}))
          for i in range(6)}


def _gang(n: int, gpus: int = 8, prefix: str = "job") -> dict[str, dict[str, Any]]:
    return {f"ns/{prefix}-{i}": make_pod(f"{prefix}-{i}", "ns").gpus(gpus).obj() for i in range(n)}


def _pinned(name: str, node: str) -> dict[str, Any]:
    return make_pod(name, "ns").gpus(8).affinity(
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}).obj()


def _nodes(used: dict[str, int] | None = None) -> dict[str, NodeInfo]:
    out = {n: build_node_info(make_node(n, gpus=8, labels=dict(i.labels))) for n, i in LEAVES.items()}
    for n, gpus in (used or {}).items():
        out[n].add({"nvidia.com/gpu": gpus * 1000})
    return out


def _leaves(decision: GangDecision) -> set[str]:
    return {LEAVES[n].labels["railyard.dev/leaf"] for n in decision.nodes.values()}


LEAF = GangPolicy(3, ("railyard.dev/leaf",))


def test_a_gang_is_placed_whole_inside_one_leaf() -> None:
    decision = decide_gang(_gang(3), _nodes(), LEAF)
    assert len(decision.nodes) == 3 and len(set(decision.nodes.values())) == 3
    assert len(_leaves(decision)) == 1


def test_a_gang_that_fits_no_leaf_gets_no_node_at_all_and_says_why() -> None:
    # 4 x 8 GPUs with three free nodes per leaf: no pod is placed although 6 nodes are free
    decision = decide_gang(_gang(4), _nodes(), GangPolicy(4, ("railyard.dev/leaf",)))
    assert decision.nodes == {}
    assert decision.group_message == "0/2 placements are available, first placement status: pod group is unschedulable"
    assert decision.pod_message == ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu. " + GANG_NO_PREEMPTION)


def test_without_a_topology_constraint_the_gang_may_span_leaves() -> None:
    decision = decide_gang(_gang(4), _nodes(), GangPolicy(4))
    assert len(decision.nodes) == 4 and _leaves(decision) == {"leaf-0", "leaf-1"}


def test_the_tightest_leaf_that_fits_is_chosen() -> None:
    decision = decide_gang(_gang(2), _nodes({"fake-0004": 8}), GangPolicy(2, ("railyard.dev/leaf",)))
    assert _leaves(decision) == {"leaf-1"}


def test_nodes_without_the_topology_label_are_in_no_placement() -> None:
    nodes = _nodes()
    nodes["lonely"] = build_node_info(make_node("lonely", gpus=64))
    assert [d for d, _ in topology_domains(nodes, ("railyard.dev/leaf",))] == [("leaf-0",), ("leaf-1",)]
    assert decide_gang(_gang(4), nodes, GangPolicy(4, ("railyard.dev/leaf",))).nodes == {}


def test_each_pods_required_node_affinity_holds_inside_the_gang() -> None:
    # the operator pins every pod to the node it chose; a gang goes exactly there or waits
    same_leaf = {f"ns/p{i}": _pinned(f"p{i}", n) for i, n in enumerate(("fake-0005", "fake-0003", "fake-0004"))}
    decision = decide_gang(same_leaf, _nodes(), LEAF)
    assert decision.nodes == {"ns/p0": "fake-0005", "ns/p1": "fake-0003", "ns/p2": "fake-0004"}
    across = {f"ns/p{i}": _pinned(f"p{i}", n) for i, n in enumerate(("fake-0000", "fake-0001", "fake-0003"))}
    assert decide_gang(across, _nodes(), LEAF).nodes == {}
    taken = decide_gang(same_leaf, _nodes({"fake-0005": 1}), LEAF)
    assert taken.nodes == {} and taken.group_message.startswith("0/2 placements are available")


@pytest.mark.parametrize(
    ("spec", "policy"),
    [
        ({"schedulingPolicy": {"gang": {"minCount": 3}}}, GangPolicy(3)),
        ({"schedulingPolicy": {"gang": {"minCount": 2}},
          "schedulingConstraints": {"topology": [{"key": "railyard.dev/leaf"}]}}, GangPolicy(2, ("railyard.dev/leaf",))),
        ({"schedulingPolicy": {"basic": {}}}, GangPolicy(None)),
    ],
)
def test_gang_policy_is_read_from_the_podgroup(spec: dict[str, Any], policy: GangPolicy) -> None:
    assert build_gang_policy({"spec": spec}) == policy


class RecordingScheduler(Scheduler):
    """The scheduler's decisions without a server: what it would bind, mark and write."""

    def __init__(self, podgroups: dict[str, Any]) -> None:
        self.pod_cache: dict[str, Any] = {}
        super().__init__(cast(KubeClient, None), self.pod_cache, podgroups=podgroups)
        self.bound: dict[str, str] = {}
        self.marked: dict[str, tuple[str, str]] = {}
        self.group_writes: list[tuple[str, tuple[str, str, str]]] = []

    def _spawn(self, coro: Any) -> None:
        coro.close()

    async def _bind(self, pod: Any, node: str, allocations: Any = None) -> None:
        raise AssertionError("not awaited")

    def add(self, pod: dict[str, Any]) -> None:
        pod["metadata"].setdefault("uid", pod["metadata"]["name"])
        self.pod_cache[f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"] = pod
        self.on_pod("ADDED", pod, None)

    def run_queue(self) -> None:
        while not self.queue.empty():
            key = self.queue.get_nowait()
            self.queued.discard(key)
            before = set(self.usage)
            self._schedule_one(key)
            for uid in set(self.usage) - before:
                self.bound[uid] = self.usage[uid][0]


def _group(name: str, min_count: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}},
                     "schedulingConstraints": {"topology": [{"key": "railyard.dev/leaf"}]}}}


async def test_the_scheduler_binds_a_gang_only_once_min_count_pods_are_there() -> None:
    groups = {"ns/g": _group("g", 3)}
    sched = RecordingScheduler(groups)
    for name in LEAVES:
        sched.on_node("ADDED", make_node(name, gpus=8, labels=dict(LEAVES[name].labels)), None)
    for pod in list(_gang(2, prefix="m").values()):
        pod["spec"]["schedulingGroup"] = {"podGroupName": "g"}
        sched.add(pod)
    sched.run_queue()
    assert sched.bound == {}
    assert sched.waiting == {GROUP + "ns/g": GANG_WAITING_MESSAGE}
    assert sched.gang_marks == {"ns/m-0": GANG_WAITING_MESSAGE, "ns/m-1": GANG_WAITING_MESSAGE}
    last = make_pod("m-2", "ns").gpus(8).obj()
    last["spec"]["schedulingGroup"] = {"podGroupName": "g"}
    sched.add(last)
    sched.run_queue()
    assert set(sched.bound) == {"m-0", "m-1", "m-2"}
    assert len({LEAVES[n].labels["railyard.dev/leaf"] for n in sched.bound.values()}) == 1
    assert sched.group_conditions["ns/g"] == ("True", "Scheduled", "")
    # the informer has not seen the bindings yet: a second look must count them as placed
    sched.on_podgroup("MODIFIED", groups["ns/g"], None)
    sched.run_queue()
    assert sched.group_conditions["ns/g"] == ("True", "Scheduled", "")


async def test_a_pod_naming_a_missing_podgroup_stays_pending() -> None:
    sched = RecordingScheduler({})
    sched.on_node("ADDED", make_node("fake-0000", gpus=8), None)
    pod = make_pod("orphan", "ns").gpus(1).obj()
    pod["spec"]["schedulingGroup"] = {"podGroupName": "no-such-group"}
    sched.add(pod)
    sched.run_queue()
    assert sched.bound == {}
    assert "no-such-group" in sched.waiting[GROUP + "ns/no-such-group"]
    # the group appears: the pod is scheduled (a gang of one)
    sched.podgroups = {"ns/no-such-group": {"metadata": {"name": "no-such-group", "namespace": "ns"},
                                            "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}}}}
    sched.on_podgroup("ADDED", sched.podgroups["ns/no-such-group"], None)
    sched.run_queue()
    assert sched.bound == {"orphan": "fake-0000"}


async def test_a_gang_claiming_devices_is_bound_where_they_are_free_and_holds_them() -> None:
    """Claimed devices (resource.k8s.io/v1) in the gang decision: two nodes of 2 GPUs published as
    ResourceSlices, a gang of two pods each claiming 2 takes both nodes, each claim gets the devices
    of its pod's node; a third pod claiming 1 waits, and a pod whose claim is not made yet waits
    for it."""
    from railyard_local.devices import build_device_classes, build_slices

    groups = {"ns/g": {**_group("g", 2), "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}}}
    sched = RecordingScheduler(groups)
    claims: dict[str, Any] = {}
    sched.claims = claims
    sched.device_classes = {c["metadata"]["name"]: c for c in build_device_classes()}
    for name in ("n-0", "n-1"):
        sched.on_node("ADDED", make_node(name), None)
        for piece in build_slices(name, f"uid-{name}", 2):
            sched.on_slice("ADDED", piece, None)

    def claiming(pod_name: str, count: int, *, made: bool = True) -> dict[str, Any]:
        pod = make_pod(pod_name, "ns").claim("t").obj()
        if made:
            claims[f"ns/{pod_name}-gpus"] = {"metadata": {"name": f"{pod_name}-gpus", "namespace": "ns"}, "spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": count}}]}}}
            pod["status"] = {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": f"{pod_name}-gpus"}]}
        return pod

    for i in range(2):
        pod = claiming(f"m-{i}", 2)
        pod["spec"]["schedulingGroup"] = {"podGroupName": "g"}
        sched.add(pod)
    sched.run_queue()
    assert sorted(sched.bound.values()) == ["n-0", "n-1"]
    assert {k: sorted(d for _, _, d in v) for k, v in sched.allocating.items()} == {"ns/m-0-gpus": ["gpu-0", "gpu-1"], "ns/m-1-gpus": ["gpu-0", "gpu-1"]}
    assert {next(iter(v))[1] for k, v in sched.allocating.items() if k == "ns/m-0-gpus"} == {sched.bound["m-0"]}
    sched.add(claiming("late", 1))
    sched.add(claiming("unmade", 1, made=False))
    sched.run_queue()
    assert "late" not in sched.bound
    assert sched.waiting["ns/late"] == (
        "0/2 nodes are available: 2 cannot allocate all claims. still not schedulable, "
        "preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.")
    assert sched.waiting["ns/unmade"] == 'waiting for the pod\'s ResourceClaim "gpus" to be created'
