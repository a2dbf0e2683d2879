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


def _history() -> list[dict[str, object]]:
    """What a demo run's polls see: at each restart status.attempt moves on while
    status.placement still describes the previous attempt's gang."""
    def st(attempt: int, placed: int, nodes: list[str], spares: list[str], moved: list[int]) -> dict[str, object]:
        return {"attempt": attempt, "placement": {"attempt": placed, "nodes": nodes, "spares": spares, "moved": moved}}

    return [
        st(0, 0, ["node-0", "node-1"], ["node-2"], []),
        st(1, 0, ["node-0", "node-1"], ["node-2"], []),  # node-1 failed: Restarting
        st(1, 1, ["node-0", "node-2"], ["node-3"], [1]),
        st(2, 1, ["node-0", "node-2"], ["node-3"], []),  # SDC on node-0: Restarting
        st(2, 2, ["node-3", "node-2"], ["node-4"], [0]),
    ]


def test_each_placement_is_recorded_under_the_attempt_it_was_made_for() -> None:
    from railyard.demo.record import note_placement

    r = Record(started_at=0.0)
    new = [note_placement(r, s) for s in _history()]
    assert new == [0, None, 1, None, 2]
    assert r.placements == {0: ["node-0", "node-1"], 1: ["node-0", "node-2"], 2: ["node-3", "node-2"]}
    assert r.moved[2] == [0] and r.spares[2] == ["node-4"]


def test_the_placement_picture_shows_the_pods_that_ran_in_the_final_attempt() -> None:
    from railyard.demo.record import note_placement, note_pods, placement_picture

    r = Record(started_at=0.0)
    r.topology = {f"node-{i}": ("spine-0", f"leaf-{i // 3}") for i in range(6)}
    for s in _history():
        note_placement(r, s)
    # the pods the runner saw bound (attempt, pod index, node)
    note_pods(r, [(0, 0, "node-0"), (0, 1, "node-1"), (1, 0, "node-0"), (1, 1, "node-2"), (2, 0, "node-3"), (2, 1, "node-2")])
    r.final_status = {"quarantinedNodes": [{"node": "node-1"}, {"node": "node-0"}]}
    pic = placement_picture(r)
    assert pic.attempt == 2
    assert pic.pods() == r.pods[2] == {0: "node-3", 1: "node-2"}
    cells = {c.node: c for cells in pic.leaves.values() for c in cells}
    assert cells["node-3"].moved and not cells["node-2"].moved
    assert cells["node-0"].role == cells["node-1"].role == "quarantined" and cells["node-4"].role == "spare"
