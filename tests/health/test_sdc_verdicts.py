"""SDC verdicts from the health results ranks report."""

from __future__ import annotations

import dataclasses

from railyard.logic.health import Action, FaultKind, HealthPolicy
from railyard.protocol.heartbeat import HealthResult

from .sim import SimJob


def test_a_confirmed_replay_mismatch_names_rank_and_node_and_asks_for_quarantine() -> None:
    sim = SimJob(world=16)
    sim.run_steps(10)
    sim.health[11] = [HealthResult("replay", ok=False, step=10, detail="grad mismatch", confirmed=True)]
    sim.run_steps(1)
    [v] = sim.verdicts()
    assert (v.kind, v.rank, v.node, v.pod_index) == (FaultKind.SDC, 11, "node-1", 1)
    assert v.action is Action.RESTART and v.quarantine_node
    d = sim.decisions[-1]
    assert d.restart and d.quarantine_nodes == ("node-1",)
    sim.run_steps(5)
    assert len(sim.verdicts()) == 1, "each failed check is judged once"


def test_a_known_answer_vote_names_the_outvoted_rank_once_whoever_reports_it() -> None:
    sim = SimJob(world=16)
    sim.run_steps(3)
    for reporter in (0, 1, 9):
        sim.health[reporter] = [HealthResult("kat", ok=False, step=3, suspect_rank=12, confirmed=True)]
    sim.run_steps(1)
    [v] = sim.verdicts()
    assert (v.rank, v.node) == (12, "node-1")


def test_a_spike_alone_is_a_suspicion_that_is_reported_but_not_acted_on() -> None:
    sim = SimJob(world=8)
    sim.run_steps(3)
    sim.health[2] = [
        HealthResult("spike", ok=False, step=3, detail="loss z=12"),
        HealthResult("kat", ok=True, step=3),
    ]
    sim.run_steps(1)
    [v] = sim.verdicts()
    assert (v.kind, v.action, v.quarantine_node) == (FaultKind.SUSPECTED_SDC, Action.REPORT, False)
    assert not sim.decisions[-1].restart


def test_with_action_report_a_confirmed_sdc_is_reported_only() -> None:
    policy = dataclasses.replace(HealthPolicy(), sdc_action=Action.REPORT)
    sim = SimJob(world=8, policy=policy)
    sim.run_steps(2)
    sim.health[0] = [HealthResult("replay", ok=False, step=2)]
    sim.run_steps(1)
    [v] = sim.verdicts()
    assert v.kind is FaultKind.SDC and v.action is Action.REPORT and not v.quarantine_node
    assert not sim.decisions[-1].restart
