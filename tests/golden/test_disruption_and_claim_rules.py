"""The pure rules behind the replayed answers, as tables: the disruption controller's PDB status,
the eviction's verdict, kcm's claim release and its node corrections (cordon taint, TTL
annotation, beta labels), the taint manager's deadline, the scheduler's words and
preemption. Each row is a case the recorded corpora
show or one next to it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from railyard_local.apiserver import dra
from railyard_local.apiserver.cordon import UNSCHEDULABLE_TAINT, compute_node_patch
from railyard_local.apiserver.disruption import compute_pdb_status, decide_eviction
from railyard_local.apiserver.errors import APIError
from railyard_local.apiserver.taintmanager import compute_eviction_time
from railyard_local.scheduling import (
    Resident,
    build_node_info,
    build_postfilter_message,
    decide_node,
    plan_preemption,
)

NOW = 1_800_000_000.0
JSON = dict[str, Any]


def pod(name: str, *, ready: bool = True, owner: str | None = None, phase: str = "Running",
        deleting: bool = False, labels: JSON | None = None) -> JSON:
    meta: JSON = {"name": name, "labels": labels if labels is not None else {"app": "web"}}
    if owner:
        meta["ownerReferences"] = [{"uid": owner, "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2027-01-15T08:00:00Z"
    return {"metadata": meta, "status": {"phase": phase, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}}


def pdb(name: str = "b", *, status: JSON | None = None, generation: int = 1, **spec: Any) -> JSON:
    return {"metadata": {"name": name, "generation": generation},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec}, "status": status or {}}


SCALE = {"rs": 2}

STATUS_ROWS = [
    # (why, budget, pods, expected status fields, unmanaged)
    ("maxUnavailable over bare pods: cannot be computed (x05)", pdb(maxUnavailable=0), [pod("a"), pod("b")],
     {"expectedPods": 0, "desiredHealthy": 0, "currentHealthy": 2, "disruptionsAllowed": 0}, True),
    ("maxUnavailable 0 over a scaled controller (x12)", pdb(maxUnavailable=0),
     [pod("a", owner="rs"), pod("b", owner="rs")],
     {"expectedPods": 2, "desiredHealthy": 2, "currentHealthy": 2, "disruptionsAllowed": 0}, False),
    ("maxUnavailable 1 allows one (x18)", pdb(maxUnavailable=1), [pod("a", owner="rs"), pod("b", owner="rs")],
     {"expectedPods": 2, "desiredHealthy": 1, "currentHealthy": 2, "disruptionsAllowed": 1}, False),
    ("a percentage rounds up what must stay unavailable", pdb(maxUnavailable="50%"),
     [pod("a", owner="rs"), pod("b", owner="rs")],
     {"expectedPods": 2, "desiredHealthy": 1, "disruptionsAllowed": 1}, False),
    ("integer minAvailable counts the selected pods, managed or not", pdb(minAvailable=1), [pod("a"), pod("b")],
     {"expectedPods": 2, "desiredHealthy": 1, "currentHealthy": 2, "disruptionsAllowed": 1}, False),
    ("a terminating or unready pod is not healthy", pdb(minAvailable=1),
     [pod("a", deleting=True), pod("b", ready=False), pod("c")],
     {"currentHealthy": 1, "disruptionsAllowed": 0}, False),
    ("a pod the eviction counted is not healthy until it goes (x25)",
     pdb(maxUnavailable=1, status={"disruptedPods": {"a": "2027-01-15T08:00:00Z"}}),
     [pod("a", owner="rs"), pod("b", owner="rs")],
     {"currentHealthy": 1, "disruptionsAllowed": 0, "disruptedPods": {"a": "2027-01-15T08:00:00Z"}}, False),
    ("and leaves disruptedPods once it terminates (x29)",
     pdb(maxUnavailable=1, status={"disruptedPods": {"a": "2027-01-15T08:00:00Z"}}),
     [pod("a", owner="rs", deleting=True), pod("b", owner="rs")],
     {"currentHealthy": 1, "disruptionsAllowed": 0}, False),
]


@pytest.mark.parametrize(("why", "budget", "pods", "want", "unmanaged"), STATUS_ROWS, ids=[r[0] for r in STATUS_ROWS])
def test_the_disruption_controller_computes(why: str, budget: JSON, pods: list[JSON], want: JSON,
                                            unmanaged: bool) -> None:
    got = compute_pdb_status(budget, pods, lambda p: SCALE.get(p["metadata"].get("ownerReferences", [{}])[0]
                                                               .get("uid", "")), NOW)
    assert {k: got.status.get(k) for k in want} == want
    assert "disruptedPods" in got.status or "disruptedPods" not in want
    assert got.unmanaged is unmanaged
    condition = got.status["conditions"][0]
    allowed = got.status["disruptionsAllowed"] > 0
    assert (condition["status"], condition["reason"]) == (("True", "SufficientPods") if allowed
                                                          else ("False", "InsufficientPods"))


HEALTHY_ZERO = {"observedGeneration": 1, "disruptionsAllowed": 0, "desiredHealthy": 2, "currentHealthy": 2}
ONE_LEFT = {"observedGeneration": 1, "disruptionsAllowed": 1, "desiredHealthy": 1, "currentHealthy": 2,
            "conditions": [{"type": "DisruptionAllowed", "status": "True", "reason": "SufficientPods"}]}

EVICTION_ROWS = [
    # (why, pod, budgets, code or None, cause)
    ("a pod no budget selects (x32)", pod("a", labels={"app": "lone"}), [pdb(status=HEALTHY_ZERO)], None, None),
    ("a terminating pod (x28)", pod("a", deleting=True), [pdb(status=HEALTHY_ZERO)], None, None),
    ("a Pending pod, even when nothing is allowed (x35)", pod("a", phase="Pending"), [pdb(status=HEALTHY_ZERO)],
     None, None),
    ("two budgets (x19)", pod("a"), [pdb("b1", status=ONE_LEFT), pdb("b2", status=ONE_LEFT)], 500, None),
    ("nothing allowed, with the healthy counts (x13)", pod("a"), [pdb(status=HEALTHY_ZERO)], 429,
     "The disruption budget b needs 2 healthy pods and has 2 currently"),
    ("nothing allowed and nothing desired (x07)", pod("a"),
     [pdb(status={"observedGeneration": 1, "currentHealthy": 2})], 429,
     "The disruption budget b does not allow evicting pods currently"),
    ("a budget not yet processed", pod("a"), [pdb(status=ONE_LEFT, generation=2)], 429,
     "The disruption budget b is still being processed by the server."),
    ("one allowed (x24)", pod("a"), [pdb(status=ONE_LEFT)], 201, None),
]


@pytest.mark.parametrize(("why", "target", "budgets", "code", "cause"), EVICTION_ROWS,
                         ids=[r[0] for r in EVICTION_ROWS])
def test_the_eviction_decides(why: str, target: JSON, budgets: list[JSON], code: int | None, cause: str | None) -> None:
    if code in (429, 500):
        with pytest.raises(APIError) as err:
            decide_eviction(target, budgets, NOW, dry_run=False)
        assert err.value.code == code
        causes = (err.value.details or {}).get("causes") or [{}]
        assert causes[0].get("message") == cause
        return
    verdict = decide_eviction(target, budgets, NOW, dry_run=False)
    if code is None:
        assert verdict.budget is None
        return
    assert verdict.new_status is not None
    assert verdict.new_status["disruptionsAllowed"] == 0
    assert list(verdict.new_status["disruptedPods"]) == ["a"]
    assert verdict.new_status["conditions"][0]["reason"] == "InsufficientPods"


def test_a_dry_run_eviction_records_no_disrupted_pod() -> None:
    verdict = decide_eviction(pod("a"), [pdb(status=ONE_LEFT)], NOW, dry_run=True)
    assert verdict.new_status is not None and "disruptedPods" not in verdict.new_status


def claim(*uids: str, deleting: bool = False) -> JSON:
    meta: JSON = {"name": "c", "finalizers": [dra.DELETE_PROTECTION]}
    if deleting:
        meta["deletionTimestamp"] = "2027-01-15T08:00:00Z"
    return {"metadata": meta, "status": {"allocation": {"devices": {"results": []}},
                                         "reservedFor": [{"resource": "pods", "name": u, "uid": u} for u in uids]}}


CLAIM_ROWS = [
    # (why, claim, live pods, reservedFor left, allocated, drop finalizer)
    ("every consumer alive: unchanged", claim("a", "b"), {"a", "b"}, None, True, False),
    ("one consumer gone (d36)", claim("a", "b", deleting=True), {"b"}, ["b"], True, False),
    ("the last consumer of a deleted claim gone (d37)", claim("b", deleting=True), set(), [], False, True),
    ("unreserved but not deleted: deallocated, still protected", claim("a"), set(), [], False, False),
]


@pytest.mark.parametrize(("why", "the_claim", "live", "left", "allocated", "unprotect"), CLAIM_ROWS,
                         ids=[r[0] for r in CLAIM_ROWS])
def test_kcm_releases_claims(why: str, the_claim: JSON, live: set[str], left: list[str] | None, allocated: bool,
                             unprotect: bool) -> None:
    status, drop = dra.release_claim(the_claim, live)
    assert drop is unprotect
    if left is None:
        assert status is None
        return
    assert status is not None
    assert [r["uid"] for r in status.get("reservedFor") or []] == left
    assert ("allocation" in status) is allocated


NODE = {"metadata": {"name": "n", "labels": {"kubernetes.io/os": "linux"}}, "spec": {}}
SETTLED = {"metadata": {"name": "n", "labels": {"kubernetes.io/os": "linux", "beta.kubernetes.io/os": "linux"},
                        "annotations": {"node.alpha.kubernetes.io/ttl": "0"}}, "spec": {}}
TAINT = {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule", "timeAdded": "t0"}

NODE_ROWS = [
    ("a new node: TTL annotation and beta label", NODE,
     {"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                   "labels": {"beta.kubernetes.io/os": "linux"}}}),
    ("settled: nothing", SETTLED, None),
    ("cordoned: the unschedulable taint (x41)", {**SETTLED, "spec": {"unschedulable": True}},
     {"spec": {"taints": [{"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule", "timeAdded": "now"}]}}),
    ("cordoned and tainted: nothing", {**SETTLED, "spec": {"unschedulable": True, "taints": [TAINT]}}, None),
    ("uncordoned: the taint goes (x45)", {**SETTLED, "spec": {"taints": [TAINT]}}, {"spec": {"taints": None}}),
    ("uncordoned: other taints stay", {**SETTLED, "spec": {"taints": [TAINT, {"key": "x", "effect": "NoExecute"}]}},
     {"spec": {"taints": [{"key": "x", "effect": "NoExecute"}]}}),
]


@pytest.mark.parametrize(("why", "node", "want"), NODE_ROWS, ids=[r[0] for r in NODE_ROWS])
def test_kcm_corrects_nodes(why: str, node: JSON, want: JSON | None) -> None:
    assert compute_node_patch(node, "now") == want


UNREACHABLE = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2027-01-15T08:00:00Z"}


def tolerating(*tolerations: JSON) -> JSON:
    return {"metadata": {"name": "p"}, "spec": {"tolerations": list(tolerations)}}


def _at(seconds: float) -> float:
    """``seconds`` after UNREACHABLE's timeAdded."""
    return datetime(2027, 1, 15, 8, 0, 0, tzinfo=UTC).timestamp() + seconds


TAINT_ROWS = [
    # (why, pod, taints, when it must go: seconds after the taint, "now", or None)
    ("no toleration: at once", tolerating(), [UNREACHABLE], "now"),
    ("5 s toleration (x53)", tolerating({"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                         "effect": "NoExecute", "tolerationSeconds": 5}), [UNREACHABLE], 5.0),
    ("admission's 300 s (x54)", tolerating({"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                            "effect": "NoExecute", "tolerationSeconds": 300}), [UNREACHABLE], 300.0),
    ("tolerated without a limit", tolerating({"operator": "Exists"}), [UNREACHABLE], None),
    ("NoSchedule taints never evict", tolerating(), [{**UNREACHABLE, "effect": "NoSchedule"}], None),
    ("the shortest limit of two taints", tolerating(
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "tolerationSeconds": 30},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "tolerationSeconds": 10}),
     [UNREACHABLE, {**UNREACHABLE, "key": "node.kubernetes.io/not-ready"}], 10.0),
]


@pytest.mark.parametrize(("why", "target", "taints", "after"), TAINT_ROWS, ids=[r[0] for r in TAINT_ROWS])
def test_the_taint_manager_decides_when_a_pod_goes(why: str, target: JSON, taints: list[JSON],
                                                   after: float | str | None) -> None:
    now = _at(1.0)
    got = compute_eviction_time(target, taints, now)
    want = now if after == "now" else None if after is None else _at(float(after))
    assert got == want


def _node(name: str, *, cordoned: bool = False, cpu: str = "16") -> JSON:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"unschedulable": cordoned},
            "status": {"allocatable": {"cpu": cpu, "pods": "110"}, "conditions": [{"type": "Ready", "status": "True"}]}}


def _pinned(node: str, *, claims: bool = False, tolerations: list[JSON] | None = None, cpu: str = "0") -> JSON:
    spec: JSON = {"nodeSelector": {"kubernetes.io/hostname": node}, "tolerations": tolerations or [],
                  "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
    if claims:
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "x"}]
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}


SCHEDULER_ROWS = [
    # (why, nodes, pod, the message kube-scheduler wrote)
    ("a pod pinned to a cordoned node (x43)", [_node("c", cordoned=True), *(_node(f"n{i}") for i in range(5))],
     _pinned("c"), "0/6 nodes are available: 1 node(s) were unschedulable, 5 node(s) didn't match Pod's node "
     "affinity/selector. no new claims to deallocate, preemption: 0/6 nodes are available: 6 Preemption is not "
     "helpful for scheduling."),
    ("a full node: preemption could help, the local scheduler has no victim", [_node("s", cpu="1"), _node("t")],
     _pinned("s", cpu="2"), "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match Pod's node "
     "affinity/selector. no new claims to deallocate, preemption: 0/2 nodes are available: 1 No preemption victims "
     "found for incoming pod, 1 Preemption is not helpful for scheduling."),
]


@pytest.mark.parametrize(("why", "nodes", "target", "message"), SCHEDULER_ROWS, ids=[r[0] for r in SCHEDULER_ROWS])
def test_the_local_scheduler_words_it_as_kube_scheduler(why: str, nodes: list[JSON], target: JSON,
                                                         message: str) -> None:
    decision = decide_node(target, {n["metadata"]["name"]: build_node_info(n) for n in nodes})
    assert decision.node is None
    assert f"{decision.message} {decision.postfilter}" == message


def test_a_pod_tolerating_the_cordon_may_go_there() -> None:
    tolerates = [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]
    decision = decide_node(_pinned("c", tolerations=tolerates), {"c": build_node_info(_node("c", cordoned=True))})
    assert decision.node == "c"


def test_dra_postfilter_says_still_not_schedulable_for_a_pod_with_claims() -> None:
    """d21: every node cannot allocate the claim."""
    assert build_postfilter_message(_pinned("n", claims=True), {"cannot allocate all claims": 6}, 6) == (
        "still not schedulable, preemption: 0/6 nodes are available: 6 Preemption is not helpful for scheduling.")


def _resident(key: str, priority: int, cpu: int = 800, terminating: bool = False) -> Resident:
    return Resident(key, priority, {"cpu": cpu}, terminating)


PREEMPTION_ROWS = [
    # (why, pod priority, residents of the 1-CPU node "s", the plan)
    ("a lower-priority pod makes room (x65)", 1000, [_resident("ns/victim", 100)], ("s", ["ns/victim"])),
    ("the lowest priority goes first, and only as many as needed", 1000,
     [_resident("ns/mid", 500, 150), _resident("ns/low", 10, 400), _resident("ns/lower", 5, 400)],
     ("s", ["ns/lower", "ns/low"])),
    ("equal priority is never preempted", 100, [_resident("ns/peer", 100)], None),
    ("a terminating pod is not preempted again", 1000, [_resident("ns/victim", 100, terminating=True)], None),
]


@pytest.mark.parametrize(("why", "priority", "residents", "plan"), PREEMPTION_ROWS, ids=[r[0] for r in PREEMPTION_ROWS])
def test_preemption_chooses_victims(why: str, priority: int, residents: list[Resident],
                                    plan: tuple[str, list[str]] | None) -> None:
    info = build_node_info(_node("s", cpu="1"))
    for r in residents:
        info.add(r.requests)
    preemptor = _pinned("s", cpu="800m")
    preemptor["spec"]["priority"] = priority
    assert plan_preemption(preemptor, {"cpu": 800}, {"s": info}, {"s": residents}) == plan


def test_a_pod_that_may_not_preempt_does_not() -> None:
    info = build_node_info(_node("s", cpu="1"))
    info.add({"cpu": 800})
    preemptor = _pinned("s", cpu="800m")
    preemptor["spec"].update(priority=1000, preemptionPolicy="Never")
    assert plan_preemption(preemptor, {"cpu": 800}, {"s": info}, {"s": [_resident("ns/victim", 100)]}) is None
