"""The simulator against cases whose answer is known in closed form."""

from __future__ import annotations

import math

import pytest

from railyard.sim.engine import STALL, simulate
from railyard.sim.model import Scenario, baseline_policy, our_policy
from railyard.sim.trace import Event, generate_trace

from .sim_builders import cause, one_fault, ours_every, tiny


def snapshot_s(s: Scenario) -> float:
    return s.bytes_per_node / (s.gpus_per_node * s.host_copy_bw_per_gpu) + s.save_fixed_stall_s


def shared_write_s(s: Scenario) -> float:
    return max(s.checkpoint_bytes / s.shared_write_bw, s.bytes_per_node / s.peer_bw_per_node)


def steps_in(x: float, interval: int, stall: float, step_s: float) -> float:
    """Steps trained in ``x`` seconds starting right after a save: run ``interval`` steps, stall."""
    cycle = interval * step_s + stall
    n = math.floor(x / cycle)
    return n * interval + min(x - n * cycle, interval * step_s) / step_s


def test_no_failures_ours_goodput_is_the_checkpoint_overhead_bound() -> None:
    s = tiny()
    res = simulate(s, ours_every(hot_spares=1), ())
    # async tiers: every save (memory every 10 steps; local and shared on multiples of it) blocks
    # only for one GPU-to-host snapshot
    expected = steps_in(s.wall_s, 10, snapshot_s(s), s.step_s) * s.step_s / s.wall_s
    assert res.goodput == pytest.approx(expected, rel=1e-9)
    assert res.goodput < 1.0
    assert set(res.lost) == {STALL}
    assert res.interruptions == 0


def test_no_failures_baseline_goodput_is_the_synchronous_save_bound() -> None:
    s = tiny()
    res = simulate(s, baseline_policy(), ())
    stall = snapshot_s(s) + shared_write_s(s)
    expected = steps_in(s.wall_s, 200, stall, s.step_s) * s.step_s / s.wall_s
    assert res.goodput == pytest.approx(expected, rel=1e-9)
    # the long-run bound the docs quote: interval / (interval + stall)
    assert res.goodput == pytest.approx(200 / (200 + stall), abs=200 / s.wall_s)


def test_one_software_failure_costs_detection_backoff_restart_restore_and_recomputation() -> None:
    s = tiny()
    stall = snapshot_s(s)
    cycle = 10 * s.step_s + stall
    at = 100 * cycle + 5.0  # 5 steps after the memory save at step 1000 committed
    res = simulate(s, ours_every(hot_spares=1), one_fault(at, "Software bug"))
    restart = s.placement_s + s.control_signal_s + s.process_restart_s + s.init_s  # pods kept, processes restart in place
    restore = s.bytes_per_node / (s.gpus_per_node * s.host_copy_bw_per_gpu)  # node RAM, same node
    expected = {
        "detection": s.pod_exit_detect_s,
        "backoff": 10.0,  # spec.restartPolicy.application.backoffSeconds, first restart
        "restart": restart,
        "restore": restore,
        "recompute": 5 * s.step_s,
    }
    assert res.lost["Software bug"] == pytest.approx(expected, rel=1e-9)
    assert res.restarts == {"Application": 1}
    assert res.restore_tiers == {"memory": 1}
    assert res.quarantined == 0
    resumed = at + sum(v for k, v in expected.items() if k != "recompute")
    steps = 1000 + steps_in(s.wall_s - resumed, 10, stall, s.step_s)
    assert res.goodput == pytest.approx(steps * s.step_s / s.wall_s, rel=1e-9)


def test_one_gpu_failure_quarantines_and_restores_the_lost_node_from_its_peer_replica() -> None:
    s = tiny()
    cycle = 10 * s.step_s + snapshot_s(s)
    at = 100 * cycle + 5.0
    res = simulate(s, ours_every(hot_spares=1), one_fault(at, "Faulty GPU"))
    h2d = s.bytes_per_node / (s.gpus_per_node * s.host_copy_bw_per_gpu)
    expected = {
        "detection": s.pod_exit_detect_s,
        "backoff": 0.0,
        # the lost node's pod on a held spare (image there), the rest restart in place
        "restart": s.placement_s + s.control_signal_s + max(s.replacement_s + s.spare_container_start_s, s.process_restart_s) + s.init_s,
        "restore": h2d + s.bytes_per_node / s.peer_bw_per_node,
        "recompute": 5 * s.step_s,
    }
    got = res.lost["Faulty GPU"]
    assert {k: got.get(k, 0.0) for k in expected} == pytest.approx(expected, rel=1e-9)
    assert res.restarts == {"Infrastructure": 1}
    assert res.restore_tiers == {"memory": 1}
    assert (res.quarantined, res.replacements) == (1, 1)


def test_one_gpu_failure_under_the_baseline_loses_everything_since_the_last_shared_save() -> None:
    s = tiny()
    pol = baseline_policy()
    stall = snapshot_s(s) + shared_write_s(s)
    at = 10 * (200 * s.step_s + stall) + 50.0  # 50 steps after the save at step 2000
    res = simulate(s, pol, one_fault(at, "Faulty GPU"))
    h2d = s.bytes_per_node / (s.gpus_per_node * s.host_copy_bw_per_gpu)
    expected = {
        "detection": pol.exit_detect_s,
        "restart": s.teardown_s + s.nodes / s.schedule_pods_per_s + s.pod_start_s + s.init_s,
        "restore": h2d
        + max(s.checkpoint_bytes / s.shared_read_bw, s.bytes_per_node / s.peer_bw_per_node),
        "recompute": 50 * s.step_s,
    }
    got = res.lost["Faulty GPU"]
    assert {k: got.get(k, 0.0) for k in expected} == pytest.approx(expected, rel=1e-9)
    assert got.get("backoff", 0.0) == 0.0
    assert res.restore_tiers == {"shared": 1}
    assert res.quarantined == 0


@pytest.mark.parametrize(
    "policy", [our_policy(hot_spares=4), baseline_policy()], ids=["ours", "baseline"]
)
def test_every_gpu_second_is_accounted_for_once(policy: object) -> None:
    s = tiny(
        gpus=512,
        days=20.0,
        step_time_s=None,
        failure_scale=4.0,
        planned=47,
        stragglers_per_day=0.5,
        sdc_per_day=0.3,
    )
    res = simulate(s, policy, generate_trace(s))  # type: ignore[arg-type]
    assert res.interruptions > 10
    assert res.useful_s + res.lost_total_s() == pytest.approx(s.wall_s, rel=1e-9)


@pytest.mark.parametrize(
    "policy", [our_policy(hot_spares=1), baseline_policy()], ids=["ours", "baseline"]
)
def test_a_corruption_that_starts_right_at_a_checkpoint_is_rolled_back_once(policy: object) -> None:
    s = tiny()
    stall = snapshot_s(s) + shared_write_s(s)
    at = 10 * (200 * s.step_s + stall)  # the step-2000 save has just finished (a memory save too)
    trace = (Event(0, at, "sdc", cause("Silent data corruption"), 2, u1=0.5, u2=0.5),)
    res = simulate(s, policy, trace)  # type: ignore[arg-type]
    # ours: one check + one restore; baseline: a restore of a corrupt checkpoint, then a rollback
    assert 1 <= res.restarts["SDC"] <= 2
    assert res.goodput > 0.9


def test_without_in_place_restart_every_restart_recreates_the_gang() -> None:
    s = tiny()
    cycle = 10 * s.step_s + snapshot_s(s)
    at = 100 * cycle + 5.0
    full = simulate(s, ours_every(hot_spares=1, in_place=False), one_fault(at, "Faulty GPU"))
    ours = simulate(s, ours_every(hot_spares=1), one_fault(at, "Faulty GPU"))
    whole = s.teardown_s + s.nodes / s.schedule_pods_per_s + s.pod_start_s + s.init_s
    assert full.lost["Faulty GPU"]["restart"] == pytest.approx(whole, rel=1e-9)
    assert ours.lost["Faulty GPU"]["restart"] < whole
    assert ours.goodput > full.goodput
    assert full.restore_tiers == ours.restore_tiers == {"memory": 1}, "sticky either way: the memory tier still serves"
