"""`railyard demo --replica-groups` without a cluster: the flag selects the replica-groups
scenario of the one demo, and the report and the picture's marks are computed from what real
runs recorded (tests/demo/data/replica_groups_run*.json: pods and UIDs, the trainer's events, the
final status), then from the same record with a survivor that went wrong."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from railyard.api.validation import validate_manifest
from railyard.commands.demo import add_parser, build_scenario
from railyard.demo.groups import (
    GroupReport,
    build_group_report,
    format_group_report,
    group_marks,
    group_record_from_json,
)
from railyard.demo.scenario import Scenario, ScenarioError, scenario_from_dict

DATA = Path(__file__).parent / "data"
RUN = DATA / "replica_groups_run.json"
RUN_R3 = DATA / "replica_groups_run_r3.json"


def _args(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    add_parser(ap.add_subparsers())
    return ap.parse_args(["demo", *argv])


def test_the_flag_selects_the_replica_groups_scenario_of_the_same_demo() -> None:
    scn = build_scenario(_args("--replica-groups"))
    assert isinstance(scn, Scenario) and scn.replica_groups is not None
    job = scn.training_job()
    assert validate_manifest(job) == []
    spec = job["spec"]
    assert spec["faultTolerance"] == {"mode": "ReplicaGroups", "minReplicas": 1}
    assert spec["parallelism"]["dataReplicas"] == 2 == spec["nodes"] and spec["procsPerNode"] == 2
    assert spec["gang"]["hotSpares"] == 1, "the lost group's pod needs a spare to go to"
    # the node of the last group's pod fails; the default demo's other faults are off
    assert scn.node_failure is not None and scn.node_failure.pod_index == 1
    assert scn.straggler is None and scn.bitflip is None
    three = build_scenario(_args("--replica-groups", "3", "--node-failure-step", "12", "--steps", "60"))
    assert three.replica_groups is not None and three.replica_groups.groups == 3 == three.nodes
    assert three.node_failure is not None and (three.node_failure.step, three.node_failure.pod_index) == (12, 2)
    assert three.steps == 60 and validate_manifest(three.training_job()) == []
    # without the flag: the default demo, one world
    assert build_scenario(_args()).replica_groups is None and "faultTolerance" not in build_scenario(_args()).training_job()["spec"]


def test_a_scenario_file_selects_it_too() -> None:
    scn = scenario_from_dict({"steps": 50, "replicaGroups": {"groups": 3, "minReplicas": 2}, "nodeFailure": {"step": 8}})
    assert scn.replica_groups is not None and (scn.replica_groups.groups, scn.replica_groups.min_replicas) == (3, 2)
    assert scn.node_failure is not None and (scn.node_failure.step, scn.node_failure.pod_index) == (8, 2)
    assert validate_manifest(scn.training_job()) == []


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"replicaGroups": {"groups": 3, "minReplicas": 3}}, "replicaGroups.minReplicas"),
        ({"replicaGroups": {"groups": 5}}, "replicaGroups.groups"),
        ({"replicaGroups": {"groups": 2}, "bitflip": {"step": 20}}, "bitflip"),
        ({"replicaGroups": {"groups": 2}, "nodeFailure": {"step": 20, "podIndex": 2}}, "nodeFailure.podIndex"),
        ({"replicaGroups": {"group": 2}}, "replicaGroups"),
    ],
)
def test_bad_replica_group_scenarios_name_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ScenarioError, match=field.replace(".", r"\.")):
        scenario_from_dict(raw)


def test_the_flag_and_a_scenario_file_do_not_mix(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("steps: 40\n")
    with pytest.raises(ScenarioError, match="--replica-groups"):
        build_scenario(_args("--replica-groups", "--scenario", str(f)))
    with pytest.raises(ScenarioError, match="--replica-groups"):
        build_scenario(_args("--replica-groups", "7"))


def _run(path: Path = RUN) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _report(run: dict[str, Any]) -> GroupReport:
    return build_group_report(run["job"], group_record_from_json(run["record"]), run["status"],
                              {int(a): n for a, n in run["restarts"].items()})


def test_the_recorded_run_reports_a_survivor_that_carried_on_and_a_group_that_healed() -> None:
    run = _run()
    r = _report(run)
    assert (r.groups, r.min_replicas, r.lost_node, r.phase) == (2, 1, "node-1", "Succeeded")
    survivor, lost = r.stories
    # group 0: the same pod object and worker processes, its steps never went back
    assert not survivor.lost_node and survivor.carried_on and survivor.pids_same is True
    assert survivor.pods_before == survivor.pods_after == ("demo-a0-0",)
    assert survivor.steps_back == 0 and survivor.last_step == 80 and survivor.checkpoint_reads == 0
    steps = [s for _, s in survivor.steps]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert survivor.longest_pause_s is not None and survivor.longest_pause_s > 1.0, "torchft dropped the lost group"
    # group 1: its node lost after step 13, its pod replaced, healed from group 0 without a checkpoint
    assert lost.lost_node and not lost.carried_on and lost.pids_same is False
    assert (lost.pods_before, lost.pods_after) == (("demo-a0-1",), ("demo-a1-1",))
    assert lost.step_at_loss == 13
    assert [(h.from_step, h.to_step) for h in lost.heals] == [(0, 52)], "one heal, though both ranks log it"
    assert lost.checkpoint_reads == 0 and lost.last_step == 80
    assert r.survivors_never_went_back
    assert r.operator_restarts == ({"attempt": 1, "mode": "InPlace", "reason": "ReplicaGroupReplaced", "carriedOn": [0], "replaced": [1]},)
    text = format_group_report(r, run["startedAt"])
    assert "group 0         carried on: demo-a0-0 same UID, same worker pids; steps up to 80, none went back" in text
    assert "group 1         restarted (its node lost): demo-a0-1 -> demo-a1-1; healed from a live peer: step 0 -> 52, no checkpoint read" in text
    assert "ReplicaGroupReplaced), pods carried on [0], replaced [1]" in text
    assert text.endswith("never a step back: yes; carried on untouched (same pods and worker pids): group 0")


def test_the_picture_marks_the_node_loss_and_the_heal_on_their_group() -> None:
    run = _run()
    r = _report(run)
    marks = group_marks(r, run["startedAt"])
    assert [(m.kind, m.group, m.step) for m in marks] == [("node lost", 1, 13), ("healed", 1, 52)]
    lost, healed = marks
    assert lost.t == pytest.approx(r.injected_at - run["startedAt"]) and "node-1" in lost.label
    assert healed.t > lost.t and healed.label == "group 1 healed from a peer: step 0 -> 52"


def test_a_survivor_that_restarted_or_went_back_is_reported() -> None:
    run = _run()
    events = run["record"]["events"]["demo-a0-0"]
    # its launcher started new workers after the loss, and a step number came again
    t_end = max(e["time"] for e in events)
    events.append({"event": "workers_started", "time": t_end + 1, "attempt": 1, "pids": {"0": 1, "1": 2}})
    events.append({"event": "step", "time": t_end + 2, "step": 40, "group": 0, "rank": 0})
    r = _report(run)
    survivor = r.stories[0]
    assert survivor.pids_same is False and survivor.steps_back == 1
    assert not r.survivors_never_went_back
    text = format_group_report(r, run["startedAt"])
    assert "restarted in place: demo-a0-0 same UID, new worker pids" in text and "1 WENT BACK" in text
    assert "never a step back: NO; carried on untouched (same pods and worker pids): none" in text
    # a survivor whose pod was replaced did not carry on
    other = copy.deepcopy(_run())
    other["record"]["pods"]["demo-a0-0"]["uid"] = "another"
    other["record"]["pods"]["demo-a1-0"] = {**other["record"]["pods"]["demo-a0-0"], "name": "demo-a1-0", "uid": "new", "attempt": 1}
    other["record"]["at_end"] = ["demo-a1-0", "demo-a1-1"]
    assert not _report(other).stories[0].carried_on


def test_a_recorded_run_of_three_groups_tells_a_group_restarted_in_place_from_one_carried_on() -> None:
    """The R = 3 run: group 2's node lost; a worker of group 1 died of SIGPIPE on the lost peer's
    socket, so the operator restarted group 1 in place as well (same pod, new workers)."""
    run = _run(RUN_R3)
    r = _report(run)
    untouched, in_place, lost = r.stories
    assert untouched.carried_on and untouched.steps_back == 0 and untouched.heals == ()
    assert in_place.same_pods and in_place.pids_same is False and not in_place.carried_on
    assert in_place.heals and in_place.heals[0].from_step == 0 and in_place.steps_back == 0
    assert lost.lost_node and not lost.same_pods and lost.heals and lost.checkpoint_reads == 0
    assert r.survivors_never_went_back
    text = format_group_report(r, run["startedAt"])
    assert "group 1         restarted in place: demo-a0-1 same UID, new worker pids; healed from a live peer: step 0 -> " in text
    assert text.endswith("carried on untouched (same pods and worker pids): group 0")
    assert [(m.kind, m.group) for m in group_marks(r, run["startedAt"])] == [("node lost", 2), ("healed", 1), ("healed", 2)]


def test_the_picture_is_drawn_from_the_report(tmp_path: Path) -> None:
    from railyard.demo.plots import draw_all
    from railyard.demo.record import Record, Sample

    run = _run()
    r = _report(run)
    rec = Record(started_at=run["startedAt"])
    rec.add_sample(Sample(run["startedAt"] + 14, "Running", 0, 1, 6.0, 300.0))
    rec.add_sample(Sample(run["startedAt"] + 60, "Running", 1, 80, 2.0, 500.0))
    rec.finished_at = run["startedAt"] + 68
    assert r.injected_at is not None
    rec.actions.append((r.injected_at, "fail node-1"))
    paths = draw_all(rec, tmp_path, r)
    assert all(p.stat().st_size > 5000 for p in paths)
