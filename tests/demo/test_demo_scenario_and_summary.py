"""The demo's pure parts: scenario parsing and validation, the summary computed from a record."""

from __future__ import annotations

import pytest

from railyard.api.validation import validate_manifest
from railyard.demo.record import Record, Restore, Sample, restores_from_status, summarise
from railyard.demo.scenario import Scenario, ScenarioError, scenario_from_dict


def test_default_scenario_is_a_valid_trainingjob_with_the_bitflip_after_the_restart() -> None:
    scn = Scenario()
    scn.validate()
    job = scn.training_job()
    assert validate_manifest(job) == []
    (fault,) = job["spec"]["trainer"]["faults"]
    assert fault["kind"] == "bitflip" and fault["attempt"] == 1
    assert job["spec"]["gang"]["hotSpares"] == 1
    assert scn.cluster_nodes % 2 == 0 and scn.cluster_nodes >= scn.nodes + scn.spares + 1


def test_scenario_file_can_turn_faults_off_and_move_them() -> None:
    scn = scenario_from_dict({"steps": 40, "nodeFailure": None, "straggler": {"step": 3, "factor": 2}, "bitflip": {"step": 30}})
    assert scn.node_failure is None and scn.straggler is not None and scn.straggler.factor == 2
    assert scn.bitflip is not None and scn.bitflip_attempt() == 0  # no restart before it


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"steps": 40, "bitflip": {"step": 45}}, "bitflip.step"),
        ({"straggler": {"step": 3, "factor": 0.5}}, "straggler.factor"),
        ({"nodeFailure": {"step": 5, "pod": 1}}, "nodeFailure"),
        ({"oops": 1}, "scenario"),
    ],
)
def test_bad_scenarios_name_the_field(raw: dict[str, object], field: str) -> None:
    with pytest.raises(ScenarioError, match=field.replace(".", r"\.")):
        scenario_from_dict(raw)


def _record() -> Record:
    r = Record(started_at=100.0)
    # attempt 0: steps 0..20 at 1 s/step, then a failure; attempt 1 restores at 15 and runs to 40
    for i in range(0, 21, 5):
        r.add_sample(Sample(110.0 + i, "Running", 0, i, 3.0, 100.0))
    r.add_sample(Sample(135.0, "Restarting", 1, 20, 3.0, 0.0))
    for i in range(15, 41, 5):
        r.add_sample(Sample(140.0 + (i - 15), "Running", 1, i, 2.0, 100.0))
    r.add_sample(Sample(166.0, "Succeeded", 1, 40, 2.0, 0.0))
    r.finished_at = 166.0
    r.final_status = {"phase": "Succeeded", "step": 40, "restarts": {"total": 1, "infrastructure": 1}, "quarantinedNodes": [{"node": "node-1"}]}
    return r


def test_summary_goodput_is_kept_steps_times_clean_step_time_over_wall_time() -> None:
    restores = [Restore(1, "memory", 15, 5)]
    s = summarise(_record(), restores)
    assert s.wall_s == pytest.approx(66.0)
    assert s.goodput == pytest.approx(40 * 1.0 / 66.0)
    assert s.steps_lost == 5 and s.quarantined == ["node-1"] and s.restarts["infrastructure"] == 1
    assert s.time_to_first_step_s == pytest.approx(15.0)


def test_restores_are_taken_once_per_attempt_from_the_status_history() -> None:
    history = [
        {"attempt": 0, "restore": None},
        {"attempt": 1, "restore": {"tier": "memory", "step": 20, "stepsLost": 5}},
        {"attempt": 1, "restore": {"tier": "memory", "step": 20, "stepsLost": 5}},
        {"attempt": 2, "restore": {"tier": "local", "step": 40, "stepsLost": 9}},
    ]
    assert restores_from_status(history) == [Restore(1, "memory", 20, 5), Restore(2, "local", 40, 9)]
