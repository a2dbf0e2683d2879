"""Straggler scoring with hysteresis, on synthetic streams through the real store."""

from __future__ import annotations

import dataclasses

import pytest

from railyard.logic.health import Action, FaultKind, HealthPolicy

from .sim import SimJob


def _flag_steps(sim: SimJob, steps: int) -> dict[int, int]:
    """Run ``steps`` one at a time; the step at which each rank was first flagged."""
    flagged: dict[int, int] = {}
    for _ in range(steps):
        sim.run_steps(1)
        for v in sim.decisions[-1].verdicts if sim.decisions else ():
            if v.kind is FaultKind.STRAGGLER:
                flagged.setdefault(v.rank, sim.step)
    return flagged


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_rank_slowed_1_3x_is_flagged_within_20_steps(seed: int) -> None:
    sim = SimJob(world=32, seed=seed, slow={13: (41, 1.3)})
    assert _flag_steps(sim, 40) == {}
    flagged = _flag_steps(sim, 20)
    assert list(flagged) == [13]
    assert flagged[13] - 41 < 20
    d = sim.decisions[-1]
    assert [s.rank for s in d.stragglers] == [13]
    assert d.stragglers[0].node == "node-1"
    assert d.stragglers[0].score == pytest.approx(1 / 1.3, abs=0.05)
    assert d.slowest[0].rank == 13
    assert not d.restart, "a straggler that is only reported restarts nothing"


def test_flagging_counts_steps_not_evaluations_so_sparse_beats_are_as_fast() -> None:
    sim = SimJob(world=16, seed=4, steps_per_beat=5, slow={3: (41, 1.3)})
    sim.run_steps(40)
    assert not sim.verdicts()
    sim.run_steps(20)
    [v] = sim.verdicts()
    assert (v.rank, v.kind) == (3, FaultKind.STRAGGLER)


@pytest.mark.parametrize("seed", range(5))
def test_a_clean_noisy_run_of_200_steps_flags_nothing(seed: int) -> None:
    sim = SimJob(world=64, seed=seed, noise=0.06)
    sim.run_steps(200)
    assert sim.verdicts() == []
    assert all(s.score > 0.9 for s in sim.decisions[-1].slowest)


def test_a_few_slow_steps_do_not_flag_a_rank() -> None:
    sim = SimJob(world=16, seed=5)
    sim.run_steps(40)
    sim.slow = {7: (41, 2.0)}
    sim.run_steps(4)  # a GC pause or page faults: 4 slow steps, then normal again
    sim.slow = {}
    sim.run_steps(60)
    assert sim.verdicts() == []


def test_a_flag_clears_only_after_the_rank_is_clearly_fast_again_and_does_not_flap() -> None:
    sim = SimJob(world=16, seed=6, slow={2: (21, 1.3)})
    sim.run_steps(60)
    assert [v.rank for v in sim.verdicts()] == [2]
    # Hover right at the line: still flagged, never re-reported.
    sim.slow = {2: (0, 1 / 0.91)}
    sim.run_steps(60)
    assert [s.rank for s in sim.decisions[-1].stragglers] == [2]
    assert len(sim.verdicts()) == 1
    sim.slow = {}
    sim.run_steps(40)
    assert sim.decisions[-1].stragglers == ()
    assert len(sim.verdicts()) == 1


def test_restart_action_asks_for_a_restart_and_quarantines_the_node() -> None:
    policy = dataclasses.replace(HealthPolicy(), straggler_action=Action.RESTART)
    sim = SimJob(world=16, seed=7, policy=policy, slow={9: (21, 1.5)})
    sim.run_steps(50)
    restarting = [d for d in sim.decisions if d.restart]
    assert len(restarting) == 1
    assert restarting[0].quarantine_nodes == ("node-1",)


def test_nvrx_style_score_counts_the_rank_itself() -> None:
    sim = SimJob(world=2, ranks_per_pod=1, noise=0.0, slow={1: (1, 2.0)})
    sim.run_steps(25)
    by_rank = {s.rank: s for s in sim.decisions[-1].slowest}
    assert by_rank[1].score == pytest.approx(0.5)
    assert by_rank[1].nvrx_score == pytest.approx(0.75)  # median(1, 2) / 2


def test_policy_from_spec_reads_camel_case_and_names_bad_fields() -> None:
    p = HealthPolicy.from_spec(
        {"heartbeatTimeoutSeconds": 30, "straggler": {"threshold": 0.8, "windowSteps": 10, "action": "Restart"}}
    )
    assert (p.heartbeat_timeout_s, p.straggler_threshold, p.straggler_window_steps) == (30.0, 0.8, 10)
    assert p.straggler_action is Action.RESTART and p.sdc_action is Action.RESTART
    with pytest.raises(ValueError, match=r"spec.health.sdc.action"):
        HealthPolicy.from_spec({"sdc": {"action": "Reboot"}})
