"""What a failure domain and a planned drain cost in the simulator (issue 49 item 3, issue 47
item 4): a leaf switch takes every node under it (with groups of whole leaves: one group); a
planned drain is moved ahead of as the operator does (MoveAhead): nothing trained twice, no
restart budget spent; the cross-group all-reduce is paid every step and accounted once."""

from __future__ import annotations

import pytest

from railyard.sim.engine import CROSS, STALL, simulate
from railyard.sim.model import PLANNED_CAUSE, our_policy
from railyard.sim.trace import Event

from .sim_builders import cause, tiny

R = 2
#: 8 job nodes in leaves of 4: two replica groups of one whole leaf each, spares on other leaves
LEAVES = {"nodes_per_leaf": 4, "cross_group_exposed": 0.0}


def leaf_fault(at: float, pod: int = 3) -> tuple[Event, ...]:
    return (Event(0, at, "fault", cause("Network switch/cable"), pod, u1=0.5, u2=0.5, scope="leaf"),)


def drain(at: float, u1: float = 0.1) -> tuple[Event, ...]:
    return (Event(0, at, "planned", PLANNED_CAUSE, 0, u1=u1, u2=0.5),)


@pytest.mark.parametrize("groups", [0, R], ids=["in place", "replica groups"])
def test_a_leaf_switch_takes_every_node_under_it(groups: int) -> None:
    s = tiny(**LEAVES)
    res = simulate(s, our_policy(hot_spares=4, replica_groups=groups), leaf_fault(3600.0))
    assert res.replacements == 4, "the leaf's four gang pods move, not only the one the event named"
    assert res.quarantined >= 4
    if groups:
        assert res.restore_tiers == {"live peer": 1}, "groups of whole leaves: one group restarts"
    else:
        assert "live peer" not in res.restore_tiers
    assert res.useful_s + res.lost_total_s() == pytest.approx(s.wall_s, rel=1e-9)


def test_a_node_fault_on_the_same_pod_moves_one_pod() -> None:
    s = tiny(**LEAVES)
    one = (Event(0, 3600.0, "fault", cause("Network switch/cable"), 3, u1=0.5, u2=0.5),)
    assert simulate(s, our_policy(hot_spares=4, replica_groups=R), one).replacements == 1


@pytest.mark.parametrize("groups", [0, R], ids=["in place", "replica groups"])
def test_a_planned_drain_trains_nothing_twice_and_spends_no_budget(groups: int) -> None:
    s = tiny(**LEAVES)
    at = 3600.0 + 0.4 * s.step_s  # mid-step: the step in flight finishes first
    res = simulate(s, our_policy(hot_spares=4, replica_groups=groups), drain(at))
    lost = res.lost[PLANNED_CAUSE.name]
    assert lost.get("recompute", 0.0) == 0.0, "no step is trained twice"
    assert dict(res.restarts) == {PLANNED_CAUSE.name: 1}, "no failure class's budget is spent"
    assert res.replacements == 4, "the drained leaf's pods move"
    fault = simulate(s, our_policy(hot_spares=4, replica_groups=groups), leaf_fault(at, pod=0))
    assert sum(lost.values()) < sum(fault.lost["Network switch/cable"].values()), "planned costs less than a fault"
    if groups:
        assert res.restore_tiers == {"live peer": 1}
        # the survivors pause for the quorum change only: the group left cleanly, no heartbeat timeout
        assert lost["detection"] < s.group_survivor_stall_s
    else:
        assert res.restore_tiers == {"memory": 1}, "a just-in-time save to the memory tier, restored in place"
        assert lost["restart"] == pytest.approx(s.in_place_restart_s(node_lost=True))
    assert res.useful_s + res.lost_total_s() == pytest.approx(s.wall_s, rel=1e-9)


def test_without_in_place_restart_a_drain_is_still_a_save_and_a_gang_restart() -> None:
    from dataclasses import replace

    s = tiny(**LEAVES)
    pol = replace(our_policy(hot_spares=4), in_place=False)
    res = simulate(s, pol, drain(3600.0))
    assert res.restore_tiers == {"local": 1} and res.replacements == 0


@pytest.mark.parametrize("exposed", [0.0, 0.05, 0.5])
def test_the_cross_group_all_reduce_is_paid_every_step_and_accounted_once(exposed: float) -> None:
    from railyard.logic.groups import compute_cross_group_fraction

    s = tiny(cross_group_exposed=exposed, step_time_s=6.0)
    res = simulate(s, our_policy(hot_spares=1, replica_groups=R), ())
    x = compute_cross_group_fraction(R, s.group_costs())
    stalled = sum(res.lost.get(STALL, {}).values())
    assert sum(res.lost.get(CROSS, {}).values()) == pytest.approx((s.wall_s - stalled) * x / (1 + x), rel=1e-6)
    assert (CROSS in res.lost) is (exposed > 0)
    assert res.useful_s + res.lost_total_s() == pytest.approx(s.wall_s, rel=1e-9)
    alone = simulate(s, our_policy(hot_spares=1), ())
    assert CROSS not in alone.lost, "one world: no cross-group traffic"
