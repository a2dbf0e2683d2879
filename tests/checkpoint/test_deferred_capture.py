"""The pipelined snapshot (snapshot.Capture): a save copies the buffers and RNG state while
training waits, and leaves the parameters and optimizer state (which only an optimizer step
changes) to the worker, which copies them while the next step's forward and backward run. The
next optimizer step waits until it has. What must hold, with the copy held at the worst moments
(2 ranks, FSDP):

- the checkpoint holds the save step's state, though training reached its next optimizer step
  before the copy started; that wait is counted in the save's ``stall_s``;
- when the wait times out, training goes on and the save is dropped, never committed torn;
- with ``defer_capture=False`` (the SDK's default: a program's loop may change its parameters
  elsewhere) nothing is deferred;
- only the leaves that are the parameters' storages (and the optimizer state) are deferred."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

pytest.importorskip("torch")

import harness
import torch

from railyard_trainer.checkpoint.statedict import _defer

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("ckpt-capture")
    harness.run(harness.capture_scenario, 2, str(tmp))
    return [json.loads((tmp / f"result-capture-rank{r}.json").read_text()) for r in range(2)]


def test_a_copy_training_overtook_still_saves_the_save_steps_state(observed: list[dict[str, Any]]) -> None:
    for got in observed:
        assert got["waited"], got
        step2 = next(h for h in got["history"] if h["step"] == 2)
        assert step2["ok"], got
        assert step2["phases"][:2] == ["snapshot", "capture"], step2
        assert step2["stall_s"] > 0, "training's wait at its optimizer step was not counted"
        assert not got["stepped_on"]["equal"], "training did not step on after the copy"
        assert got["restored_step"] == 2 and got["restored"]["equal"], got
        # the whole of the parameters and optimizer state was left to the worker
        assert got["deferred"] == [got["deferrable"]] * 2 and got["deferrable"] == 6 * 4, got


def test_a_copy_training_gave_up_waiting_for_is_dropped_not_committed_torn(observed: list[dict[str, Any]]) -> None:
    for got in observed:
        assert got["drained"], got
        step4 = next(h for h in got["history"] if h["step"] == 4)
        assert not step4["ok"] and "torn" in step4["detail"], step4
        assert got["committed"] == [2], got


def test_without_deferral_the_whole_snapshot_is_taken_while_training_waits(observed: list[dict[str, Any]]) -> None:
    for got in observed:
        assert not got["sync_capture"], got
        assert [h["ok"] for h in got["sync_history"]] == [True], got
        assert "capture" not in got["sync_history"][0]["phases"], got


def test_only_the_parameters_storages_and_the_optimizer_state_are_deferred() -> None:
    param, buffer = torch.ones(4), torch.zeros(3)
    state = {"model": {"w": param.detach(), "running_mean": buffer}, "n": 3}
    bufs = {"model": {"w": torch.empty(4), "running_mean": torch.empty(3)}, "n": 3}
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    out = _defer(state, bufs, {param.untyped_storage().data_ptr()}, pairs)
    assert out["model"]["w"] is bufs["model"]["w"], "a parameter's leaf is left to the worker"
    assert out["model"]["running_mean"] is buffer, "a buffer (a forward may change it) is copied now"
    assert out["n"] == 3 and len(pairs) == 1 and pairs[0][1] is bufs["model"]["w"]
    pairs.clear()
    _defer(state["model"], bufs["model"], None, pairs)  # the optimizer state: every leaf
    assert len(pairs) == 2
