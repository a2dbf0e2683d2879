"""faultTolerance ReplicaGroups in the simulator: a fault of one node costs the survivors' stall,
the step in flight, and the missing group's share while it is detected, restarted and healed;
nothing is rolled back. So does a silent corruption the other groups outvote (three groups or
more); with two groups it restores the whole job from a checkpoint."""

from __future__ import annotations

import itertools

import pytest

from railyard.sim.engine import COMPONENTS, simulate
from railyard.sim.model import our_policy
from railyard.sim.report import compare, format_sweep, format_table, to_json

from .sim_builders import cause, one_fault, tiny

R = 4


def lost_to(res: object, name: str) -> float:
    return sum(res.lost.get(name, {}).values())  # type: ignore[attr-defined]


@pytest.mark.parametrize("fault", ["Faulty GPU", "Host maintenance", "Network switch/cable", "Software bug"])
def test_one_fault_costs_the_stall_the_step_in_flight_and_the_missing_groups_share(fault: str) -> None:
    s = tiny()
    at = 3600.0 + 0.4 * s.step_s  # mid-step (between saves: checkpoint stalls shift the phase)
    trace = one_fault(at, fault)
    groups = simulate(s, our_policy(hot_spares=1, replica_groups=R), trace)
    in_place = simulate(s, our_policy(hot_spares=1), trace)
    lost = groups.lost[fault]
    assert set(lost) <= set(COMPONENTS)
    assert groups.restore_tiers == {"live peer": 1}, "the group heals from a peer, reads no tier"
    assert 0.0 < lost.get("recompute", 0.0) < s.step_s, "only the step in flight is redone"
    share = 1.0 / R  # the missing group, at the ideal rate of R-1 groups
    # a group's nodes hold a whole replica: R x the job's share per node, over the heal network
    heal = s.group_heal_fixed_s + R * s.bytes_per_node / s.heal_bw_per_node
    assert lost["restore"] == pytest.approx(share * heal)
    assert lost["detection"] >= s.group_survivor_stall_s
    assert lost_to(groups, fault) < lost_to(in_place, fault)
    # every second of every GPU accounted for
    assert groups.useful_s + groups.lost_total_s() == pytest.approx(s.wall_s, rel=1e-9)


@pytest.mark.parametrize("heal_gbps", [25.0, 400.0, 3200.0])
def test_a_heal_costs_its_fixed_part_and_a_replicas_bytes_at_the_heal_networks_rate(heal_gbps: float) -> None:
    s = tiny(heal_bw_per_node=heal_gbps * 1e9 / 8, model_params=8e9)  # the pod network, one NDR rail, eight
    trace = one_fault(3600.0 + 0.4 * s.step_s, "Faulty GPU")
    lost = simulate(s, our_policy(hot_spares=1, replica_groups=R), trace).lost["Faulty GPU"]
    heal_bytes = 8e9 * s.bytes_per_param / (s.nodes / R)  # each node of the group: its share of a whole replica
    assert lost["restore"] == pytest.approx((s.group_heal_fixed_s + heal_bytes / (heal_gbps * 1e9 / 8)) / R)
    assert tiny(heal_bw_per_node=0.0).problems() == ["heal_bw_per_node: must be > 0 (bytes/s; --heal-gbps), got 0.0"]


def test_a_slower_rate_with_one_group_missing_costs_more() -> None:
    trace = one_fault(3600.0, "Faulty GPU")
    ideal = simulate(tiny(), our_policy(hot_spares=1, replica_groups=R), trace)
    slow = simulate(tiny(group_degraded_efficiency=0.5), our_policy(hot_spares=1, replica_groups=R), trace)
    assert lost_to(slow, "Faulty GPU") > lost_to(ideal, "Faulty GPU")


def test_with_no_spare_the_lost_group_waits_for_a_node_while_the_others_train() -> None:
    """The operator's shrink (logic/shrink.py): no hot spare, so the lost node's group waits for
    a repaired node (scn.repair_h) and the job trains on with R-1 groups meanwhile, which costs
    the missing group's share of the wait, not the whole job's as with the in-place restart."""
    from railyard.sim.trace import Event

    s = tiny(nodes_per_leaf=9, leaves_per_spine=1)  # one free node beside the job's 8: the first lost node takes it, the second waits
    trace = (Event(0, 3600.0, "fault", cause("Faulty GPU"), 3, u1=0.5, u2=0.5),
             Event(1, 7200.0, "fault", cause("GPU HBM3 memory"), 5, u1=0.5, u2=0.5))
    groups = simulate(s, our_policy(hot_spares=0, replica_groups=R), trace)
    in_place = simulate(s, our_policy(hot_spares=0), trace)
    assert groups.waits_for_repair == in_place.waits_for_repair == 1
    wait_share = groups.lost["GPU HBM3 memory"]["backoff"]
    assert wait_share > 0.0
    # the wait outlasts the run (48 h repair): both count it up to the end of the run, the
    # groups their share (the survivors' stall comes first: it shortens the room by its length)
    assert in_place.lost["GPU HBM3 memory"]["backoff"] == pytest.approx(R * wait_share, abs=R * s.group_survivor_stall_s)
    assert wait_share < s.wall_s - 7200.0
    assert groups.useful_s + groups.lost_total_s() == pytest.approx(s.wall_s, rel=1e-9)


def test_a_silent_corruption_outvoted_by_the_other_groups_repairs_its_group_alone() -> None:
    """Three groups or more: the cross-group vote names the corrupt group (logic/health/groups.py),
    its node is quarantined and the group heals from a good group while the others train on."""
    from railyard.sim.trace import Event

    s = tiny()
    trace = (Event(0, 3600.0, "sdc", cause("Silent data corruption"), 2, u1=0.5, u2=0.5),)
    groups = simulate(s, our_policy(hot_spares=1, replica_groups=R), trace)
    in_place = simulate(s, our_policy(hot_spares=1), trace)
    assert groups.restore_tiers == {"live peer": 1}, "no checkpoint is read"
    assert (groups.restarts, groups.quarantined) == ({"SDC": 1}, 1)
    lost = groups.lost["Silent data corruption"]
    assert lost.get("recompute", 0.0) < s.step_s, "nothing is rolled back: only the step in flight is redone"
    assert lost["restore"] == pytest.approx((s.group_heal_fixed_s + R * s.bytes_per_node / s.heal_bw_per_node) / R)
    assert lost_to(groups, "Silent data corruption") < lost_to(in_place, "Silent data corruption")
    assert groups.useful_s + groups.lost_total_s() == pytest.approx(s.wall_s, rel=1e-9)


def test_a_silent_corruption_with_two_groups_restores_the_whole_job_behind_the_fence() -> None:
    """Two groups that differ: no majority names the corrupt one, so every group goes back to a
    checkpoint no newer than the last check that passed (the operator's ReplicaGroupsDisagree)."""
    from railyard.sim.trace import Event

    s = tiny()
    trace = (Event(0, 3600.0, "sdc", cause("Silent data corruption"), 2, u1=0.5, u2=0.5),)
    res = simulate(s, our_policy(hot_spares=1, replica_groups=2), trace)
    assert "live peer" not in res.restore_tiers and sum(res.restore_tiers.values()) == 1
    assert res.lost["Silent data corruption"]["recompute"] > s.step_s, "the steps since the check are trained again"


def test_groups_that_do_not_divide_the_data_degree_are_refused_naming_the_flag() -> None:
    s = tiny()  # dp = 8
    with pytest.raises(ValueError, match="--replica-groups"):
        simulate(s, our_policy(hot_spares=1, replica_groups=3), ())


def test_the_comparison_reports_the_mode_beside_the_others() -> None:
    # the faults alone: no cross-group traffic (a tiny job's step makes it look dear)
    s = tiny(failure_scale=1.0, days=2.0, cross_group_exposed=0.0)
    c = compare(s, our_policy(hot_spares=2), replica_groups=R)
    assert c.groups is not None
    assert c.groups.goodput >= c.ours.goodput, "same trace: no fault costs more by group than in place"
    assert "replica groups" in format_table(c)
    metrics = {r["metric"]: r for r in to_json(c)["results"]}
    assert metrics["goodput_railyard_replica_groups"]["target"] == 0.998, "at most 16,384 GPUs: issue 49's goal"
    assert metrics["goodput_railyard_replica_groups"]["value"] == c.groups.goodput


def test_the_default_group_costs_are_the_ones_the_benchmark_measured() -> None:
    import json
    from pathlib import Path

    from railyard.sim.model import GROUP_HEAL_FIXED_S, GROUP_SURVIVOR_STALL_S

    doc = json.loads((Path(__file__).resolve().parents[2] / "bench" / "results" / "replica_groups.json").read_text())
    rows = {r["metric"]: r["value"] for r in doc["results"]}
    assert round(rows["sim: survivors' stall beyond the step redone"], 1) == GROUP_SURVIVOR_STALL_S, "update sim.model"
    assert round(rows["replica_groups: healing group, quorum join -> healed from a peer"], 1) == GROUP_HEAL_FIXED_S


@pytest.mark.parametrize("sweep", [(2, 4, 8), (1, 2, 4, 8), (8, 4)])
def test_the_sweep_reports_goodput_against_the_number_of_groups(sweep: tuple[int, ...]) -> None:
    """``--replica-groups 2,4,8``: ours with each R on the same trace; a lost node restarts 1/R of
    the job, so with the same costs per failure more groups lose less (1: no groups, in place)."""
    s = tiny(gpus=512, pp=1, days=4.0, failure_scale=8.0)  # dp 64
    c = compare(s, our_policy(hot_spares=2), replica_groups=sweep[0], group_sweep=sweep)
    got = dict(c.sweep)
    assert [r for r, _ in c.sweep] == list(sweep)
    for r, res in c.sweep:
        expect = c.ours if r == 1 else simulate(s, our_policy(hot_spares=2, replica_groups=r), c.trace)
        assert res.goodput == expect.goodput and res.restore_tiers == expect.restore_tiers
        assert res.interruptions > 0
    ordered = sorted(got)
    assert all(got[a].goodput < got[b].goodput for a, b in itertools.pairwise(ordered))
    if sweep[0] > 1:
        assert c.groups is got[sweep[0]]  # the table's run is not simulated twice
    table = format_sweep(c)
    for r in sweep:
        assert f"{got[r].goodput:.2%}" in table
    doc = to_json(c)["replica_group_sweep"]
    assert [(d["replica_groups"], d["goodput"]) for d in doc] == [(r, got[r].goodput) for r in sweep]
