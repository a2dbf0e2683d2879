"""The pure pieces of in-place restart, table-driven: the control messages and their fence, rank
table deltas, gang membership across attempts, which pods move, what a launcher is told, the
launchers' reports as pod evidence, and which spares get a placeholder."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from tests.operator.builders import make_node, make_pod

from railyard.logic.failures import classify_pod
from railyard.logic.gang import assess_gang, gang_members
from railyard.logic.inplace import (
    GangControl,
    apply_launcher_reports,
    decide_capable,
    decide_control_answer,
    decide_nodes_to_leave,
    decide_restart_mode,
    decide_unacknowledged,
)
from railyard.logic.manifests import spare_pod_name
from railyard.logic.spares import decide_spares
from railyard.protocol.control import (
    Action,
    ControlError,
    ControlOrder,
    LauncherReport,
    LauncherState,
    RankTableDelta,
    apply_rank_table_delta,
    build_rank_table_delta,
    decide_launcher_step,
    parse_order,
    parse_report,
    rank_table_digest,
    rank_table_for,
)
from railyard.protocol.ranktable import PodEntry, RankEntry, RankTable


def table(attempt: int = 0, nodes: tuple[str, ...] = ("n0", "n1", "n2"), port: int = 20001, procs: int = 2) -> RankTable:
    ranks = tuple(RankEntry(rank=p * procs + lr, node=n, pod_index=p, local_rank=lr, rail=lr, pp=0, dp=p * procs + lr, tp=0)
                  for p, n in enumerate(nodes) for lr in range(procs))
    pods = tuple(PodEntry(p, n, f"j-{p}.j.ns.svc", (p + 1) % len(nodes)) for p, n in enumerate(nodes))
    return RankTable(job="j", attempt=attempt, pp=1, dp=len(nodes) * procs, tp=1, procs_per_node=procs, pods=pods, ranks=ranks,
                     master_addr="j-0.j.ns.svc", master_port=port)


# --------------------------------------------------------------------------- protocol


def test_messages_round_trip_and_bad_ones_name_their_field() -> None:
    r = LauncherReport("j", 3, 1, "j-a1-1", LauncherState.FAILED, 75, ((2, 75), (3, 70)), 12.5)
    assert parse_report(r.to_json()) == r
    said = replace(r, message="rank 2 exited with code 75 (SDC) first\nSDCError: checksum mismatch")
    assert parse_report(said.to_json()) == said
    with pytest.raises(ControlError, match="message"):
        parse_report(replace(r, message="x" * 5000).to_json())
    delta = build_rank_table_delta(table(0), table(1, ("n0", "n9", "n2"), port=20002))
    assert delta is not None
    o = ControlOrder("j", 1, Action.RESTART, "why", delta=delta, restore={"tier": "memory", "step": 10})
    assert parse_order(o.to_json()) == o
    full = ControlOrder("j", 1, Action.RESTART, rank_table=table(1))
    assert parse_order(full.to_json()) == full
    for body, field in (("[]", "report"), ('{"job":"j","attempt":-1,"pod_index":0,"pod":"p","state":"running"}', "attempt"),
                        ('{"job":"j","attempt":0,"pod_index":0,"pod":"p","state":"dancing"}', "state"),
                        ('{"job":"j","attempt":0,"pod_index":0,"pod":"","state":"running"}', "pod"),
                        ('{"job":"j","attempt":0,"pod_index":0,"pod":"p","state":"running","workers":[[1]]}', "workers[0]"),
                        ('{"version":9,"job":"j"}', "version")):
        with pytest.raises(ControlError, match=field.replace("[", r"\[")):
            parse_report(body)


@pytest.mark.parametrize(("local", "action", "attempt", "step"), [
    (0, Action.RESTART, 1, Action.RESTART),     # newer: act on it
    (1, Action.RESTART, 1, Action.CONTINUE),    # the attempt it runs: nothing to do
    (2, Action.RESTART, 1, Action.CONTINUE),    # older (a late or replayed answer): never
    (0, Action.STOP, 0, Action.STOP),
    (0, Action.CONTINUE, 5, Action.CONTINUE),
])
def test_a_launcher_acts_only_on_restarts_to_newer_attempts(local: int, action: Action, attempt: int, step: Action) -> None:
    assert decide_launcher_step(local, ControlOrder("j", attempt, action)) is step


def test_a_delta_rebuilds_exactly_the_operators_table_or_is_refused() -> None:
    old = table(0)
    new = table(1, ("n0", "n7", "n2"), port=20002)
    delta = build_rank_table_delta(old, new)
    assert delta is not None and [p.pod_index for p in delta.pods] == [1], "only the moved pod travels"
    assert apply_rank_table_delta(old, delta) == new
    assert rank_table_for(ControlOrder("j", 1, Action.RESTART, delta=delta), old) == new
    with pytest.raises(ControlError, match=r"delta\.base"):
        apply_rank_table_delta(table(2), delta)
    with pytest.raises(ControlError, match="digest"):
        apply_rank_table_delta(old, replace(delta, digest="0" * 64))
    with pytest.raises(ControlError, match="not newer"):
        rank_table_for(ControlOrder("j", 0, Action.RESTART, rank_table=table(0)), table(0))
    with pytest.raises(ControlError, match="attempt"):
        rank_table_for(ControlOrder("j", 2, Action.RESTART, rank_table=table(1)), old)
    # another layout is no delta: the whole table is sent
    assert build_rank_table_delta(old, table(1, ("n0", "n1"))) is None
    assert rank_table_digest(new) == delta.digest


def test_a_delta_for_a_big_gang_is_small() -> None:
    nodes = tuple(f"node-{i}" for i in range(2048))
    old = table(0, nodes, procs=8)
    new = table(1, (*nodes[:700], "spare-0", *nodes[701:]), port=20002, procs=8)
    delta = build_rank_table_delta(old, new)
    assert delta is not None
    body = ControlOrder("j", 1, Action.RESTART, delta=delta).to_json()
    assert len(body) < 1000 < len(new.to_json()) / 1000


# --------------------------------------------------------------------------- membership


@pytest.mark.parametrize(("labels", "attempt", "since", "members", "stale"), [
    # a full restart: only the attempt's own pods
    ([(0, 0), (1, 0), (0, 1), (1, 1)], 1, None, ["j-a1-0", "j-a1-1"], ["j-a0-0", "j-a0-1"]),
    # in place since 0: pod 0 kept, pod 1 replaced in attempt 1 (the old one is stale)
    ([(0, 0), (1, 0), (1, 1)], 1, 0, ["j-a0-0", "j-a1-1"], ["j-a0-1"]),
    # two in-place restarts in a row
    ([(0, 0), (1, 1), (1, 2), (2, 0)], 2, 0, ["j-a0-0", "j-a2-1", "j-a0-2"], ["j-a1-1"]),
    # pods older than the last full creation, and a pod of a future attempt, are not members
    ([(0, 0), (0, 3), (1, 3), (0, 5)], 4, 3, ["j-a3-0", "j-a3-1"], ["j-a0-0", "j-a5-0"]),
])
def test_the_gang_of_an_attempt_is_the_newest_pod_per_index_since_the_last_full_creation(
        labels: list[tuple[int, int]], attempt: int, since: int | None, members: list[str], stale: list[str]) -> None:
    pods = [make_pod(index=i, attempt=a).obj() for i, a in labels]
    got, old = gang_members(pods, attempt=attempt, since=since)
    assert [p["metadata"]["name"] for p in got] == members
    assert sorted(p["metadata"]["name"] for p in old) == sorted(stale)


def test_kept_pods_of_older_attempts_make_a_running_gang() -> None:
    nodes = {f"node-{i}": make_node(f"node-{i}") for i in range(3)}
    pods = [make_pod(index=0, attempt=0, node="node-0").obj(), make_pod(index=1, attempt=2, node="node-2").obj()]
    a = assess_gang(pods, nodes, attempt=2, expected=2, now=0.0, since=0)
    assert a.state == "Running" and not a.stale
    assert assess_gang(pods, nodes, attempt=2, expected=2, now=0.0).state != "Running", "without since: pod 0 is stale"


def _pending(node: str = "node-1", *, ready: bool = True, since: str = "2026-01-01T00:00:00Z",
             taints: tuple[str, ...] = (), gone: bool = False) -> dict[str, Any]:
    """Node ``node`` as it is now (absent when ``gone``), next to a Ready node-0."""
    nodes = {"node-0": make_node("node-0")}
    if not gone:
        nodes[node] = make_node(node, ready=ready, since=since,
                                taints=[{"key": k, "effect": "NoSchedule"} for k in taints])
    return nodes


# issue 46: kept pod 0 (attempt 0) waits on replacement 1 (attempt 1), created and released but not
# bound, pinned by the placement to node-1; now = 10 s after 2026-01-01T00:00:00Z, NotReady grace 2 s
_KEPT = make_pod(index=0, attempt=0, node="node-0").obj()
_REPLACEMENT = make_pod(index=1, attempt=1, node="node-1").unbound().obj()
_EPOCH = 1_767_225_600.0


@pytest.mark.parametrize(("name", "pods", "nodes", "since", "state", "kind", "blamed"), [
    ("its node is Ready: it waits for the scheduler", [_KEPT, _REPLACEMENT], _pending(), 0, "Starting", "", ()),
    ("its node went NotReady: lost, the node blamed", [_KEPT, _REPLACEMENT], _pending(ready=False), 0,
     "Failed", "NodeNotReady", ("node-1",)),
    ("its node went NotReady within the grace: not yet", [_KEPT, _REPLACEMENT],
     _pending(ready=False, since="2026-01-01T00:00:09Z"), 0, "Starting", "", ()),
    ("its node is gone", [_KEPT, _REPLACEMENT], _pending(gone=True), 0, "Failed", "NodeGone", ("node-1",)),
    ("its node is tainted unreachable before its Ready condition says so", [_KEPT, _REPLACEMENT],
     _pending(taints=("node.kubernetes.io/unreachable",)), 0, "Failed", "NodeNotReady", ("node-1",)),
    ("tainted not-ready", [_KEPT, _REPLACEMENT], _pending(taints=("node.kubernetes.io/not-ready",)), 0,
     "Failed", "NodeNotReady", ("node-1",)),
    ("another taint is the stale placement's business", [_KEPT, _REPLACEMENT], _pending(taints=("maintenance",)), 0,
     "Starting", "", ()),
    ("still gated: the placeholder goes first", [_KEPT, make_pod(index=1, attempt=1, node="node-1").gated().obj()],
     _pending(ready=False), 0, "Gated", "", ()),
    ("a gang created whole waits for its timeout (nothing runs yet)",
     [make_pod(index=0, attempt=1, node="node-0").obj(), _REPLACEMENT], _pending(ready=False), None,
     "Starting", "", ()),
])
def test_a_replacement_its_node_can_never_run_is_lost(
        name: str, pods: list[Any], nodes: dict[str, Any], since: int | None, state: str, kind: str,
        blamed: tuple[str, ...]) -> None:
    got = assess_gang(pods, nodes, attempt=1, expected=2, now=_EPOCH + 10, not_ready_grace_s=2.0, since=since)
    assert got.state == state, got
    assert (got.failure.kind if got.failure else "", got.failure.nodes if got.failure else ()) == (kind, blamed)
    if kind:
        assert got.failure is not None and got.failure.pod == "j-a1-1" and got.failure.cls.value == "Infrastructure"


# --------------------------------------------------------------------------- which pods move


def _nodes(*down: str) -> dict[str, Any]:
    return {f"node-{i}": make_node(f"node-{i}", ready=f"node-{i}" not in down) for i in range(4)}


def _gang(*extra: Any) -> list[dict[str, Any]]:
    return [make_pod(index=i, node=f"node-{i}").obj() for i in range(3)]


@pytest.mark.parametrize(("name", "members", "nodes", "move_off", "capable", "kw", "mode", "reason", "moved"), [
    ("healthy gang, no blame: everything stays", _gang(), _nodes(), {}, {0, 1, 2}, {}, "InPlace", "", ()),
    ("NotReady node", _gang(), _nodes("node-1"), {}, {0, 1, 2}, {}, "InPlace", "", (1,)),
    ("blamed node", _gang(), _nodes(), {"node-2": "blamed: SDCVerdict"}, {0, 1, 2}, {}, "InPlace", "", (2,)),
    ("a pod gone", _gang()[:2], _nodes(), {}, {0, 1}, {}, "InPlace", "", (2,)),
    ("a container exited", [*_gang()[:2], make_pod(index=2, node="node-2").exited(1).obj()], _nodes(), {}, {0, 1}, {}, "InPlace", "", (2,)),
    ("a pod being deleted", [*_gang()[:2], make_pod(index=2, node="node-2").deleting().obj()], _nodes(), {}, {0, 1}, {}, "InPlace", "", (2,)),
    ("a straggler node to leave", _gang(), _nodes(), {}, {0, 1, 2}, {"leave": {"node-0": "straggler"}}, "InPlace", "", (0,)),
    # issue 45: moving the straggler's pod would leave nothing to keep, so it stays
    ("the only pod that can stay is on a straggler node", _gang()[:2], _nodes(), {"node-1": "NotReady"}, {0, 1},
     {"leave": {"node-0": "straggler"}}, "InPlace", "", (1, 2)),
    # issue 46: the replacement of an in-place restart, not yet bound, on the node the new failure blames
    ("an unbound replacement on a blamed node",
     [*_gang()[:2], make_pod(index=2, attempt=1, node="node-2").unbound().obj()],
     _nodes("node-2"), {"node-2": "blamed: NodeNotReady"}, {0, 1}, {}, "InPlace", "", (2,)),
    ("a kept launcher never spoke", _gang(), _nodes("node-1"), {}, {0}, {}, "Full", "NoControlChannel", ()),
    ("nothing can stay", _gang(), _nodes("node-0", "node-1", "node-2"), {}, set(), {}, "Full", "NothingToKeep", ()),
    ("disabled", _gang(), _nodes(), {}, {0, 1, 2}, {"enabled": False}, "Full", "InPlaceDisabled", ()),
    ("spec changed", _gang(), _nodes(), {}, {0, 1, 2}, {"spec_changed": True}, "Full", "SpecChanged", ()),
])
def test_which_pods_move_and_when_it_is_a_full_restart(name: str, members: list[Any], nodes: dict[str, Any], move_off: dict[str, str],
                                                      capable: set[int], kw: dict[str, Any], mode: str, reason: str, moved: tuple[int, ...]) -> None:
    args: dict[str, Any] = {"enabled": True, "spec_changed": False, **kw}
    plan = decide_restart_mode(members=members, expected=3, nodes=nodes, move_off=move_off, capable=frozenset(capable), **args)
    assert (plan.mode, plan.reason) == (mode, reason), plan.message
    assert plan.replace == moved
    if mode == "InPlace":
        assert sorted(plan.keep + plan.replace) == [0, 1, 2]
        assert all(plan.why[i] for i in plan.replace)
    else:
        assert reason in plan.message


# kept pod 0 of attempt 0, now in attempt 2; its launcher's latest report: (attempt, pod name)
@pytest.mark.parametrize(("name", "said", "kw", "capable"), [
    ("it reported this attempt", (2, "j-a0-0"), {}, True),
    ("it never reported", None, {}, False),
    ("only an older attempt, no restart under way", (1, "j-a0-0"), {}, False),
    # issue 46: the replacement's node went down before this launcher reported the new attempt
    ("the attempt an in-place restart under way came from", (1, "j-a0-0"), {"restarting_from": 1}, True),
    ("older than that", (0, "j-a0-0"), {"restarting_from": 1}, False),
    ("a replaced pod's launcher of that index", (2, "j-a1-0"), {}, False),
    ("a carried-on group's pod, from the attempt it runs", (0, "j-a0-0"), {"carried": {0: 0}}, True),
])
def test_which_launchers_speak_the_restart_protocol(name: str, said: tuple[int, str] | None, kw: dict[str, Any],
                                                     capable: bool) -> None:
    reports = {} if said is None else {0: (LauncherReport("j", said[0], 0, said[1], LauncherState.FAILED), 0.0)}
    got = decide_capable([make_pod(index=0, attempt=0).obj()], reports, attempt=2, **kw)
    assert got == (frozenset({0}) if capable else frozenset())


def test_stragglers_are_left_only_where_the_gang_keeps_a_pod() -> None:
    got = decide_nodes_to_leave([("a", 3, 0.7), ("b", 5, 0.6), ("a", 4, 0.8)], ["a", "c"])
    assert list(got) == ["a"] and "rank 3" in got["a"] and "0.70" in got["a"]


# --------------------------------------------------------------------------- what a launcher is told


def _report(attempt: int, pod: str = "j-a0-1", index: int = 1, state: LauncherState = LauncherState.RUNNING) -> LauncherReport:
    return LauncherReport("j", attempt, index, pod, state)


@pytest.mark.parametrize(("gang", "report", "action", "why"), [
    (GangControl(1, {0: "j-a0-0", 1: "j-a0-1"}), _report(0), Action.RESTART, "restart in place"),
    (GangControl(1, {0: "j-a0-0", 1: "j-a0-1"}, open=False, waiting="backoff"), _report(0), Action.CONTINUE, "backoff"),
    (GangControl(1, {0: "j-a0-0", 1: "j-a1-1"}), _report(0), Action.STOP, "was replaced"),
    (GangControl(1, {0: "j-a0-0"}), _report(0), Action.STOP, "not part of attempt 1"),
    (GangControl(1, {1: "j-a0-1"}), _report(1), Action.CONTINUE, ""),
    (GangControl(1, {1: "j-a0-1"}), _report(2), Action.CONTINUE, "operator is at attempt 1"),
    (GangControl(1, {1: "j-a0-1"}, finished="the job is Succeeded"), _report(1), Action.STOP, "Succeeded"),
])
def test_what_each_launcher_is_told(gang: GangControl, report: LauncherReport, action: Action, why: str) -> None:
    got, reason = decide_control_answer(gang, report)
    assert got is action and why in reason


def test_kept_pods_have_restarted_once_they_report_the_new_attempt() -> None:
    reports = {0: (_report(2, "j-a0-0", 0), 1.0), 1: (_report(1, "j-a0-1"), 1.0), 3: (_report(2, "other", 3), 1.0)}
    names = {0: "j-a0-0", 1: "j-a0-1", 2: "j-a0-2", 3: "j-a0-3"}
    assert decide_unacknowledged([0, 1, 2, 3], reports, names, attempt=2) == [1, 2, 3]


# --------------------------------------------------------------------------- reports as evidence


@pytest.mark.parametrize(("report", "kind"), [
    (LauncherReport("j", 0, 0, "j-a0-0", LauncherState.FAILED, 1), "ApplicationExitCode"),
    (LauncherReport("j", 0, 0, "j-a0-0", LauncherState.FAILED, 75), "SDCExitCode"),
    (LauncherReport("j", 0, 0, "j-a0-0", LauncherState.FAILED, 70), "InfrastructureExitCode"),
    (LauncherReport("j", 0, 0, "j-a0-0", LauncherState.FAILED, 64), "PermanentExitCode"),
    (LauncherReport("j", 0, 0, "j-a0-0", LauncherState.RUNNING), None),      # running: nothing to see
    (LauncherReport("j", 1, 0, "j-a0-0", LauncherState.FAILED, 1), None),    # another attempt's report
    (LauncherReport("j", 0, 0, "j-a9-0", LauncherState.FAILED, 1), None),    # another pod's report
])
def test_a_launchers_report_reads_as_its_pods_exit(report: LauncherReport, kind: str | None) -> None:
    nodes = {"node-0": make_node("node-0")}
    pod = make_pod(index=0, attempt=0).obj()
    view = apply_launcher_reports([pod], {0: (report, 100.0)}, attempt=0)
    f = classify_pod(view[0], nodes)
    assert (f.kind if f else None) == kind
    assert pod["status"]["phase"] == "Running", "the pod itself is not touched"


def test_a_launchers_report_carries_the_workers_last_words() -> None:
    pod = make_pod(index=0, attempt=0).obj()
    words = "rank 1 exited with code 1 (Application) first\nInjectedCrash: injected crash on rank 1 at step 3"
    view = apply_launcher_reports([pod], {0: (LauncherReport("j", 0, 0, "j-a0-0", LauncherState.FAILED, 1, ((1, 1),), message=words), 1.0)}, attempt=0)
    assert view[0]["status"]["containerStatuses"][0]["state"]["terminated"]["message"] == words


def test_a_pod_that_really_exited_keeps_its_own_exit_code() -> None:
    pod = make_pod(index=0).exited(137, "OOMKilled").obj()
    view = apply_launcher_reports([pod], {0: (LauncherReport("j", 0, 0, "j-a0-0", LauncherState.FAILED, 1), 1.0)}, attempt=0)
    assert view[0]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137


# --------------------------------------------------------------------------- spares


def test_which_spares_get_a_placeholder() -> None:
    nodes = {n: make_node(n) for n in ("s0", "s1", "s2")}
    nodes["s2"] = make_node("s2", ready=False)
    # placeholders are known by name (the operator's pod index keeps no annotations)
    have = [
        {"metadata": {"name": spare_pod_name("j", "s0")}, "spec": {"nodeName": "s0"}, "status": {"phase": "Running"}},
        {"metadata": {"name": spare_pod_name("j", "old")}, "spec": {"nodeName": "old"}, "status": {"phase": "Running"}},
    ]
    create, delete, held = decide_spares(job="j", phase="Running", wanted=3, spares=["s0", "s1", "s2"], nodes=nodes, have=have)
    assert create == ["s1"], "a NotReady spare gets none"
    assert [p["metadata"]["name"] for p in delete] == [spare_pod_name("j", "old")]
    assert held == 1
    for phase in ("Succeeded", "Failed", "Suspended", "Placing"):
        create, delete, _ = decide_spares(job="j", phase=phase, wanted=3, spares=["s0", "s1"], nodes=nodes, have=have)
        assert not create and len(delete) == 2, phase


def test_a_restart_order_without_a_table_is_refused() -> None:
    with pytest.raises(ControlError, match="neither"):
        rank_table_for(ControlOrder("j", 1, Action.RESTART), table(0))
    with pytest.raises(ControlError, match="base"):
        apply_rank_table_delta(table(0), RankTableDelta(5, 6, "", 1, (), ""))


# --------------------------------------------------------------------------- where the moved pods go


def _placed(nodes: tuple[str, ...], moved: tuple[int, ...]) -> Any:
    from railyard.logic.placement import Placement

    return Placement(nodes=nodes, spares=(), replica_peers=(-1,) * len(nodes), domains={}, rails_per_dp_group=1,
                     dp_leaf_spans=1, dp_leaf_minimum=1, moved=moved)


def test_in_place_moves_leave_stragglers_behind_only_when_there_is_room() -> None:
    from railyard.logic.inplace import InPlaceMoves, RestartPlan, plan_in_place_moves
    from railyard.logic.placement import Unplaceable

    prev = table(nodes=("n0", "n1", "n2"))
    plan = RestartPlan("InPlace", replace=(1, 2), why={1: "blamed", 2: "straggler"}, keep=(0,), optional=(2,))
    asked: list[set[str]] = []

    def roomy(avoid: set[str]) -> Any:
        asked.append(avoid)
        return _placed(("n0", "s1", "s2"), (1, 2))

    got = plan_in_place_moves(plan, prev, {"n2": "slow"}, {"n1"}, roomy)
    assert isinstance(got, InPlaceMoves) and got.replace == {1, 2} and got.keep == (0,)
    assert asked == [{"n1", "n2"}] and "left stragglers behind: n2 (slow)" in got.message

    def tight(avoid: set[str]) -> Any:
        asked.append(avoid)
        return Unplaceable("capacity", "not enough nodes") if "n2" in avoid else _placed(("n0", "s1", "n2"), (1,))

    asked.clear()
    got = plan_in_place_moves(plan, prev, {"n2": "slow"}, {"n1"}, tight)
    assert isinstance(got, InPlaceMoves) and got.replace == {1} and got.keep == (0, 2)
    assert "left stragglers behind" not in got.message and "stragglers kept: n2 (no room to leave it)" in got.message
    assert asked == [{"n1", "n2"}, {"n1"}]
    nowhere = plan_in_place_moves(plan, prev, {}, {"n1"}, lambda avoid: Unplaceable("capacity", "not enough nodes"))
    assert isinstance(nowhere, RestartPlan) and nowhere.reason == "NotPlaceable"
    everything = plan_in_place_moves(plan, prev, {}, {"n1"}, lambda avoid: _placed(("s0", "s1", "s2"), (0, 1, 2)))
    assert isinstance(everything, RestartPlan) and everything.reason == "NothingToKeep"
