"""The just-in-time save before a planned move (issue 47), trainer side: an order to save at step S
gives a committed memory-tier checkpoint at S on every rank; a rank that hears the order only
after S saves with the others at the first step all of them have heard, never at a step of its
own. 2 gloo ranks, each its own pod and memory tier (tests/checkpoint/jit_harness.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import harness
import jit_harness

from railyard_trainer.jitsave import decide_save_now

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def _results(tmp: Path, world: int) -> list[dict[str, Any]]:
    out = []
    for r in range(world):
        path = tmp / f"result-jit-rank{r}.json"
        assert path.exists(), f"rank {r} did not finish"
        out.append(json.loads(path.read_text()))
    return out


# step, heard (sum), step_sum, world, done -> save now
ROWS = [
    (3, 2.0, 6.0, 2, False, True),    # both heard S=3, at S
    (2, 2.0, 6.0, 2, False, False),   # before S
    (7, 2.0, 6.0, 2, False, True),    # past S when the last rank heard: now, on every rank
    (3, 1.0, 3.0, 2, False, False),   # one rank has not heard
    (3, 2.0, 6.0, 2, True, False),    # saved already this attempt
    (5, 2.0, 7.0, 2, False, False),   # two different steps ordered (3 and 4): no one step
    (0, 0.0, 0.0, 2, False, False),   # no order
]


@pytest.mark.parametrize(("step", "heard", "step_sum", "world", "done", "expected"), ROWS)
def test_the_save_step_is_decided_from_the_sums_every_rank_shares(
    step: int, heard: float, step_sum: float, world: int, done: bool, expected: bool,
) -> None:
    assert decide_save_now(step, heard=heard, step_sum=step_sum, world=world, done=done) is expected


def test_a_later_order_in_the_same_attempt_is_a_save_of_its_own(tmp_path: Path) -> None:
    from railyard_trainer.inplace import write_save_order
    from railyard_trainer.jitsave import Heard, SaveOrderWatch

    order = tmp_path / "save-a2.json"
    watch = SaveOrderWatch(str(order), attempt=2)
    assert watch.heard() == Heard(0.0, 0.0), "no order yet"
    write_save_order(order, attempt=1, step=5)
    assert watch.heard() == Heard(0.0, 0.0), "another attempt's order is not this one's"
    write_save_order(order, attempt=2, step=5)
    assert watch.heard() == Heard(1.0, 5.0)
    assert not watch.save_now(4, heard=1.0, step_sum=5.0, world=1)
    assert watch.save_now(5, heard=1.0, step_sum=5.0, world=1) and watch.saved == 5
    assert watch.heard() == Heard(0.0, 0.0), "saved: nothing pending"
    assert not watch.save_now(6, heard=0.0, step_sum=0.0, world=1)
    write_save_order(order, attempt=2, step=30)
    assert watch.heard() == Heard(1.0, 30.0)
    assert watch.save_now(31, heard=1.0, step_sum=30.0, world=1) and watch.saved == 31


def test_an_order_to_save_at_s_gives_a_committed_memory_checkpoint_at_s_on_every_rank(tmp_path: Path) -> None:
    harness.run(jit_harness.jit_scenario, 2, str(tmp_path), 3, "0,1")
    for r in _results(tmp_path, 2):
        assert r["saved_at"] == [3]
        assert 3 in r["committed"], r["committed"]  # besides the periodic 5
        assert 3 in r["shards"], r["shards"]  # this rank's shard of it
    assert ["memory", 3, True, True] in _results(tmp_path, 2)[0]["events"]  # rank 0 reports it, committed and clean


def test_a_rank_that_hears_after_s_saves_with_the_others_at_one_step(tmp_path: Path) -> None:
    harness.run(jit_harness.jit_scenario, 2, str(tmp_path), 3, "1,6")  # rank 1 hears after step 6
    rs = _results(tmp_path, 2)
    assert rs[0]["saved_at"] == rs[1]["saved_at"] == [7]
    for r in rs:
        assert 7 in r["committed"] and 3 not in r["committed"], r["committed"]
        assert 7 in r["shards"], r["shards"]


def test_a_group_that_left_the_quorum_says_after_which_step(tmp_path: Path) -> None:
    """ReplicaGroups: the workers' word to their launcher (beside the order file) that they left the
    quorum, read back as the step; nothing (or garbage) reads as not left."""
    from railyard_trainer.jitsave import left_marker, read_left, write_left

    order = tmp_path / "save-a0.json"
    assert read_left(order) == -1
    write_left(order, 17)
    assert read_left(order) == 17 and left_marker(order).parent == tmp_path
    left_marker(order).write_text("not json")
    assert read_left(order) == -1
    left_marker(order).write_text(json.dumps({"step": True}))
    assert read_left(order) == -1
