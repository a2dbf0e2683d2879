"""The recovery decision, table-driven and pure (logic/recovery.py): what was observed after a
failure of the gang (or while replica groups wait for a node) and the ONE plan that follows.
Every plan kind has a row, the placement runs for real on the row's cluster, and the handlers
that execute the plans are run by test_restarting_in_place.py, test_replica_groups_restart_alone.py
and test_replica_groups_shrink_and_grow_back.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from tests.operator.builders import make_node, make_pod

from railyard.api.trainingjob import (
    QuarantinedNode,
    StragglerStatus,
    TrainingJob,
    TrainingJobStatus,
)
from railyard.logic.failures import Failure, build_failure
from railyard.logic.placement import Placement, build_placement_input, plan_placement
from railyard.logic.recovery import (
    Fail,
    FallBackToFull,
    FullRestart,
    GrowBack,
    KeepWaiting,
    MoveAhead,
    Observed,
    PlannedMoves,
    RecoveryPlan,
    RepairGroups,
    RestartInPlace,
    ShrinkAndWait,
    WaitingGroups,
    decide_recovery,
)
from railyard.protocol.ranktable import RankTable

CRASH = build_failure("ApplicationExitCode", "1", pod="j-a0-0")
PERMANENT = build_failure("PermanentExitCode", "2", pod="j-a0-0")


def lost(node: str, pod: int) -> Failure:
    return build_failure("NodeNotReady", node, node=node, pod=f"j-a0-{pod}")


@dataclass(frozen=True)
class Seen:
    """A compact :class:`Observed`: ``gang`` pods placed on the first ``gang`` of ``cluster``
    nodes (attempt 0), the gang's first placement as the running rank table."""

    cause: Failure | WaitingGroups | PlannedMoves = CRASH
    gang: int = 2
    cluster: int = 3
    #: Nodes NotReady now.
    down: tuple[str, ...] = ()
    spec: dict[str, Any] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    #: Pod indices whose launcher spoke the control protocol (None: all).
    capable: tuple[int, ...] | None = None
    #: Pod indices without a pod (a waiting group's deleted pods).
    absent: tuple[int, ...] = ()
    #: Pod indices created and released but not bound yet (pinned to their node by the placement).
    unbound: tuple[int, ...] = ()
    table_gone: bool = False
    #: Nodes of the cluster announced to go (no pod is placed there).
    going: tuple[str, ...] = ()

    def pod(self, index: int, node: str) -> dict[str, Any]:
        placed = make_pod(index=index, node=node)
        return (placed.unbound() if index in self.unbound else placed).obj()

    def observed(self) -> Observed:
        job = TrainingJob.model_validate({"metadata": {"name": "j", "namespace": "ns", "generation": 1},
                                          "spec": {"nodes": self.gang, "procsPerNode": 8, **self.spec}})
        cluster = [make_node(f"node-{i}") for i in range(self.cluster)]
        first = plan_placement(build_placement_input(job, nodes=cluster[: self.gang]))
        assert isinstance(first, Placement), first
        nodes = {n["metadata"]["name"]: n for n in cluster}
        for name in self.down:
            nodes[name] = make_node(name, ready=False)
        members = [self.pod(i, first.nodes[i]) for i in range(self.gang) if i not in self.absent]
        table: RankTable | None = None if self.table_gone else first.rank_table
        status = TrainingJobStatus(**{"phase": "Running", "observed_generation": 1, **self.status})
        capable = frozenset(range(self.gang) if self.capable is None else self.capable)
        return Observed(cause=self.cause, job=job, status=status, generation=1, members=members, nodes=nodes,
                        cluster_pods=members, table=table, capable=capable, reported=members, said="it failed",
                        going=dict.fromkeys(self.going, "maintenance announced"))


def flagged(node: str) -> dict[str, Any]:
    return {"stragglers": [StragglerStatus(rank=0, node=node, score=0.5)]}


GROUPS = {"parallelism": {"dataReplicas": 3}, "faultTolerance": {"mode": "ReplicaGroups", "minReplicas": 1}}
NO_BUDGET = {"restartPolicy": {"application": {"limit": 0}}}


def summary(plan: RecoveryPlan) -> tuple[Any, ...]:
    """The row's expectation: the plan kind and what it moves."""
    match plan:
        case Fail(reason):
            return ("Fail", reason)
        case FullRestart():
            return ("FullRestart", plan.reason)
        case MoveAhead():
            return ("MoveAhead", tuple(sorted(plan.replace)), plan.keep, plan.carry_on)
        case RepairGroups():
            return ("RepairGroups", tuple(sorted(plan.replace)), plan.groups, plan.carry_on)
        case RestartInPlace():
            return ("RestartInPlace", tuple(sorted(plan.replace)), plan.keep)
        case ShrinkAndWait():
            return ("ShrinkAndWait", plan.groups.waiting, plan.groups.delete, plan.groups.carry_on)
        case GrowBack():
            return ("GrowBack", tuple(sorted(plan.replace)), plan.carry_on)
        case KeepWaiting():
            return ("KeepWaiting",)
        case FallBackToFull(reason):
            return ("FallBackToFull", reason)
    raise AssertionError(plan)


def node_lost(**kw: Any) -> Seen:
    """node-1 (pod 1's) fails NotReady."""
    return Seen(lost("node-1", 1), **{"down": ("node-1",), **kw})


def waiting(**kw: Any) -> Seen:
    """Replica group 1 of three (one pod each) waits for a node; groups 0 and 2 train."""
    return Seen(WaitingGroups((1,), (0, 2)), **{"gang": 3, "absent": (1,), "spec": GROUPS, **kw})


def going(*nodes: str, **kw: Any) -> Seen:
    """Nodes announced to go (cordoned) under a running gang: a planned move, not a failure."""
    return Seen(PlannedMoves(dict.fromkeys(nodes, "cordoned")), **kw)


QUARANTINED = {"quarantined_nodes": [QuarantinedNode(node="node-0", reason="x", time="t")]}
MIN_3 = {**GROUPS, "faultTolerance": {"mode": "ReplicaGroups", "minReplicas": 3}}

ROWS: list[tuple[str, Seen, tuple[Any, ...]]] = [
    # Fail: what no restart fixes, and a spent budget
    ("a permanent exit fails the job", Seen(PERMANENT), ("Fail", "PermanentExitCode")),
    ("the class's budget is spent", Seen(spec=NO_BUDGET), ("Fail", "RestartBudgetSpent")),
    # RestartInPlace: the pods on healthy nodes stay, the others move sticky
    ("a crash restarts in place, nothing moves", Seen(), ("RestartInPlace", (), (0, 1))),
    ("a lost node's pod moves to the spare", node_lost(), ("RestartInPlace", (1,), (0,))),
    # issue 45: the only pod that can stay sits on a flagged straggler node; it stays
    ("the straggler row", node_lost(status=flagged("node-0")), ("RestartInPlace", (1,), (0,))),
    ("a straggler's pod moves when there is room", node_lost(gang=3, cluster=5, status=flagged("node-0")),
     ("RestartInPlace", (0, 1), (2,))),
    ("without room the straggler stays", node_lost(gang=3, cluster=4, status=flagged("node-0")),
     ("RestartInPlace", (1,), (0, 2))),
    # issue 46: a replacement the restart kept on its node, its node NotReady before it was bound
    ("a replacement stranded unbound on a node gone NotReady moves", node_lost(unbound=(1,)),
     ("RestartInPlace", (1,), (0,))),
    ("a quarantined node is left too", Seen(status=QUARANTINED), ("RestartInPlace", (0,), (1,))),
    # FullRestart: each fallback
    ("in place is off", Seen(spec={"restartPolicy": {"inPlace": False}}), ("FullRestart", "InPlaceDisabled")),
    ("the spec changed since the gang was built", Seen(status={"observed_generation": 2}), ("FullRestart", "SpecChanged")),
    ("a kept launcher never spoke", Seen(capable=(1,)), ("FullRestart", "NoControlChannel")),
    ("every node is down", node_lost(down=("node-0", "node-1")), ("FullRestart", "NothingToKeep")),
    ("no spare for the lost node", node_lost(cluster=2), ("FullRestart", "NotPlaceable")),
    ("the running rank table is gone", node_lost(table_gone=True), ("FullRestart", "NotPlaceable")),
    # RepairGroups: only the touched replica group restarts
    ("a lost node's group is repaired", node_lost(gang=3, cluster=4, spec=GROUPS), ("RepairGroups", (1,), (1,), (0, 2))),
    # ShrinkAndWait: no place for the touched group, enough groups train on
    ("no spare: the group waits", node_lost(gang=3, cluster=3, spec=GROUPS), ("ShrinkAndWait", (1,), (1,), (0, 2))),
    ("no spare and too few groups left: full", node_lost(gang=3, cluster=3, spec=MIN_3), ("FullRestart", "NotPlaceable")),
    # MoveAhead: nodes announced to go; no budget spent (NO_BUDGET: the application's is empty)
    ("a cordoned node's pod moves ahead to the spare", going("node-1", spec=NO_BUDGET), ("MoveAhead", (1,), (0,), ())),
    ("nodes announced together move in one move", going("node-0", "node-1", gang=3, cluster=5),
     ("MoveAhead", (0, 1), (2,), ())),
    ("with replica groups the group on the node moves alone", going("node-1", gang=3, cluster=4, spec=GROUPS),
     ("MoveAhead", (1,), (0, 2), (0, 2))),
    ("a spare announced to go is no spare", node_lost(going=("node-2",)), ("FullRestart", "NotPlaceable")),
    ("a waiting group does not come back onto a node announced to go", waiting(cluster=4, down=("node-1",), going=("node-3",)),
     ("KeepWaiting",)),
    ("a planned move without a spare: the group waits", going("node-1", gang=3, cluster=3, spec=GROUPS),
     ("ShrinkAndWait", (1,), (1,), (0, 2))),
    ("a planned move without a spare or groups: the whole gang moves", going("node-1", cluster=2),
     ("FullRestart", "NotPlaceable")),
    # GrowBack / KeepWaiting / FallBackToFull: while a group waits
    ("a node is usable: the waiting group comes back", waiting(cluster=4, down=("node-1",)), ("GrowBack", (1,), (0, 2))),
    ("no node yet", waiting(cluster=3, down=("node-1",)), ("KeepWaiting",)),
    ("nothing to grow back onto", waiting(cluster=4, table_gone=True), ("FallBackToFull", "NotPlaceable")),
]


@pytest.mark.parametrize(("name", "seen", "want"), ROWS, ids=[r[0] for r in ROWS])
def test_recovery_decisions(name: str, seen: Seen, want: tuple[Any, ...]) -> None:
    plan = decide_recovery(seen.observed())
    assert summary(plan) == want, getattr(plan, "message", plan)
    assert getattr(plan, "message", ""), "every plan says what it does"


def test_every_plan_kind_has_a_row() -> None:
    kinds = {summary(decide_recovery(seen.observed()))[0] for _, seen, _ in ROWS}
    assert kinds == {"Fail", "FullRestart", "RestartInPlace", "RepairGroups", "MoveAhead", "ShrinkAndWait", "GrowBack",
                     "KeepWaiting", "FallBackToFull"}


def test_a_planned_move_spends_no_budget_and_blames_no_node() -> None:
    plan = decide_recovery(going("node-1", spec=NO_BUDGET).observed())
    assert isinstance(plan, MoveAhead) and plan.reason == "PlannedMove"
    assert plan.failure.cls.value == "Planned" and plan.failure.nodes == (), "nothing is quarantined"
    assert plan.budget.allowed and plan.budget.backoff_seconds == 0
    assert plan.message.startswith("moving ahead of node-1 (cordoned): ") and "node-1" in plan.moves.message


def test_reason_codes_and_messages_are_built_from_the_plan() -> None:
    full = decide_recovery(node_lost(cluster=2).observed())
    assert isinstance(full, FullRestart) and full.message.startswith("full restart (NotPlaceable): ")
    assert full.detail and full.detail in full.message
    moved = decide_recovery(node_lost(gang=3, cluster=5, status=flagged("node-0")).observed())
    assert isinstance(moved, RestartInPlace) and not isinstance(moved, RepairGroups) and moved.reason == ""
    assert "left stragglers behind: node-0" in moved.message
    alone = decide_recovery(node_lost(status=flagged("node-0")).observed())
    assert "stragglers kept: node-0 (no other pod could stay)" in getattr(alone, "message", "")
    tight = decide_recovery(node_lost(gang=3, cluster=4, status=flagged("node-0")).observed())
    assert "stragglers kept: node-0 (no room to leave it)" in getattr(tight, "message", "")
    shrink = decide_recovery(node_lost(gang=3, cluster=3, spec=GROUPS).observed())
    assert isinstance(shrink, ShrinkAndWait) and shrink.reason == "ReplicaGroupReplaced"
    assert shrink.message.startswith("2/3 replica groups training; group 1 waits for a node (")
