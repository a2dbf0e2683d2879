"""Tiered checkpoints end to end on CPU: 4 gloo ranks (2 pods x 2) and 2-rank follow-ups.

The spawned process groups are reused across checks: one 4-rank run goes through all its
scenarios (harness.main_scenarios) and each test below asserts on what one scenario observed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import harness

pytestmark = [pytest.mark.torch, pytest.mark.timeout(400)]

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def results(tmp: Path, name: str, world: int) -> list[dict[str, Any]]:
    out = []
    for r in range(world):
        path = tmp / f"result-{name}-rank{r}.json"
        assert path.exists(), f"rank {r} did not finish scenario {name!r}"
        out.append(json.loads(path.read_text()))
    return out


@pytest.fixture(scope="module")
def main_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("ckpt-main")
    harness.run(harness.main_scenarios, 4, str(tmp))
    return tmp


@pytest.fixture(scope="module")
def kill_run(tmp_path_factory: pytest.TempPathFactory, main_run: Path) -> Path:
    tmp = tmp_path_factory.mktemp("ckpt-kill")
    # Rank 1 dies mid-save, rank 0 then fails on its next collective: both exits are expected.
    with pytest.raises(Exception):  # noqa: B017 - torch raises ProcessExitedException/ProcessRaisedException
        harness.run(harness.kill_scenario, 2, str(tmp))
    assert (tmp / "kill-step2-rank0.ok").exists(), "the step-2 save did not complete before the kill"
    harness.run(harness.restore_scenario, 2, str(tmp), str(main_run))
    return tmp


def test_a_rank_plans_its_shard_once_and_reuses_the_plan_for_every_later_save(main_run: Path) -> None:
    # The node tiers save the same snapshot buffers each time: DCP's plan is worked out by the
    # first save (memory, step 2) and reused by the local and memory saves after it, whose
    # contents the restore tests check. The shared tier plans with DCP across ranks, each time.
    for r in results(main_run, "save", 4):
        node = [(tier, step, planned) for tier, step, planned in r["planned"] if tier != "shared"]
        assert node[0] == ("memory", 2, True)
        assert [n for n in node[1:] if n[2]] == []
        assert {(t, s) for t, s, _ in node} == {("memory", 2), ("local", 3), ("memory", 4), ("local", 6),
                                              ("memory", 6), ("memory", 8)}


def test_saves_are_committed_per_tier_interval_and_gc_keeps_newest(main_run: Path) -> None:
    for r in results(main_run, "save", 4):
        assert r["fresh_restore"] is True
        assert r["finished"] is True
        assert r["committed"] == {"memory": [6, 8], "local": [3, 6], "shared": [3, 6]}
    events = results(main_run, "save", 4)[0]["events"]
    by_tier: dict[str, list[int]] = {}
    for tier, step, ok, nbytes, blocked, duration in events:
        assert ok, (tier, step)
        assert nbytes > 0 and 0 <= blocked <= duration
        by_tier.setdefault(tier, []).append(step)
    assert by_tier == {"memory": [2, 4, 6, 8], "local": [3, 6], "shared": [3, 6]}
    assert results(main_run, "save", 4)[1]["events"] == [], "only rank 0 reports events"


def test_restore_equals_uninterrupted_run(main_run: Path) -> None:
    for r in results(main_run, "restore", 4):
        assert (r["tier"], r["step"]) == ("memory", 8)
        assert r["eq8"]["equal"] and r["eq8"]["n"] > 6, r["eq8"]
        assert r["view"] == r["view_ref"] == {"step": 8, "position": 64, "lr_steps": 8}
        assert r["eq10"]["equal"], r["eq10"]
        assert r["rng_restored"], "the rank's RNG continues where the checkpoint left it"
    rs = results(main_run, "restore", 4)
    assert len({tuple(r["rng"]) for r in rs}) == 4, "each rank has its own RNG stream"
    # Events reach the health monitor (rank 0 only); every rank notes what it restored.
    assert rs[0]["events"] == [["restore", "memory", 8, 3]]
    assert all(r["events"] == [] for r in rs[1:])
    assert all(r["noted"] == [["memory", 8]] and r["left_to_drain"] == 0 for r in rs)


def test_wiped_memory_tier_recovered_from_neighbour_replica(main_run: Path) -> None:
    for r in results(main_run, "replica", 4):
        assert (r["tier"], r["step"]) == ("memory", 8)
        assert r["eq8"]["equal"], r["eq8"]
        assert r["healed"], "the lost node's shard was not written back into its memory tier"


def test_corrupt_shard_falls_back_to_previous_step_then_other_tier(main_run: Path) -> None:
    for r in results(main_run, "corrupt", 4):
        assert r["first"] == ["memory", 6]
        assert r["first_eq6"]["equal"]
        assert r["first_view"] == r["view_ref"]
        assert "memory step 8" in r["first_detail"]
        assert r["second"] == ["local", 6]
        assert r["second_eq6"]["equal"]


def test_failing_tiers_do_not_stop_training_and_sdc_suspect_is_skipped(main_run: Path) -> None:
    rs = results(main_run, "flaky", 4)
    assert all(r["steps_done"] == 6 for r in rs)
    events = rs[0]["events"]
    shared = [e for e in events if e[0] == "shared"]
    local = [e for e in events if e[0] == "local"]
    memory = [e for e in events if e[0] == "memory"]
    assert [e[1] for e in shared] == [2, 4, 6] and not any(e[2] for e in shared)
    assert all("shared" in e[4] or "Directory" in e[4] for e in shared), shared
    assert [e[1] for e in local] == [2, 4, 6] and not any(e[2] for e in local)
    assert all("rank 3" in e[4] for e in local), local
    assert [(e[1], e[2], e[3]) for e in memory] == [(2, True, True), (4, True, True), (6, True, False)]
    assert all(r["restored"] == ["memory", 4] for r in rs)


def test_kill_during_save_leaves_no_committed_checkpoint(kill_run: Path) -> None:
    for r in results(kill_run, "after_kill", 2):
        assert r["step4_dir_exists"] and r["step4_has_files"], "the kill did not happen mid-save"
        assert not r["step4_manifest"]
        assert r["restored"] == ["memory", 2]
        assert r["weights_equal_step2"]


def test_required_checkpoint_missing_exits_with_its_code_and_says_why(kill_run: Path) -> None:
    for r in results(kill_run, "after_kill", 2):
        code, message = r["refused"]
        assert code == 77
        assert "no committed checkpoint found" in message


def test_resume_on_different_world_size_from_shared(kill_run: Path) -> None:
    for r in results(kill_run, "after_kill", 2):
        assert r["reshard"] == ["shared", 6]
        assert r["reshard_eq6"]["equal"], r["reshard_eq6"]
        assert r["reshard_view"]["step"] == 6 and r["reshard_view"] == r["view_ref"]


def test_node_tier_reshards_onto_fewer_ranks_fetching_what_a_node_lacks(tmp_path: Path) -> None:
    harness.run(harness.reshard_source_scenario, 4, str(tmp_path))
    harness.run(harness.node_reshard_scenario, 2, str(tmp_path))
    rs = results(tmp_path, "node_reshard", 2)
    for r in rs:
        assert r["restored"] == ["memory", 4], r["detail"]
        assert "resharded" in r["detail"]
        assert r["eq4"]["equal"] and r["eq4"]["n"] > 6, r["eq4"]
        assert r["view"] == r["view_ref"] == {"step": 4, "position": 32, "lr_steps": 4}
    # new rank 1 needs old ranks 2 and 3: its node got them back from pod 0's replica
    assert {"rank-00002", "rank-00003"} <= set(rs[1]["healed"])


def test_a_save_due_while_one_is_running_is_skipped_on_every_rank_not_queued(tmp_path: Path) -> None:
    harness.run(harness.queue_scenario, 2, str(tmp_path))
    rs = results(tmp_path, "queue", 2)
    assert rs[1]["pending_at_4"], "rank 1's step-2 save was still held at step 4"
    for r in rs:
        # rank 1 skipped step 4 (its save was held), so no rank wrote it; step 2 finished once
        # released (maybe_save(4) did not wait for it) and step 6 saved as usual
        assert r["history"] == [[2, "memory", True, False], [4, "memory", False, True], [6, "memory", True, False]]
        assert r["skipped"] == {"memory": 1}
        assert r["committed"] == [2, 6] and r["dirs"] == ["step-00000002", "step-00000006"]
        # each record says where its time went: consecutive phases that add up to its duration
        # (``capture``: the worker's copy of the parameters and optimizer state, snapshot.Capture)
        written = ["snapshot", "capture", "waited", "ready", "write", "drain", "agree", "commit", "confirm"]
        assert r["phases"] == [written, ["snapshot", "waited", "ready"], written]
        assert all(abs(d) < 1e-6 for d in r["phases_minus_duration"]), r["phases_minus_duration"]
        assert all(r["snapshot_is_blocked"])
    assert rs[0]["events"] == [[2, "save", True], [4, "skip", False], [6, "save", True]]
