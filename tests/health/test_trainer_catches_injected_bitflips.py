"""The real launcher with the health package on: an injected bit flip ends the attempt with
SDC_DETECTED before the step's checkpoint, naming the rank; a clean run passes its checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from railyard.protocol.exitcodes import ExitCode

try:
    from trainer.launch import run_launcher
except ImportError:  # pragma: no cover - the trainer's test helpers are not importable
    run_launcher = None

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.skipif(run_launcher is None, reason="tests/trainer/launch.py missing")]

TWO = ["--nproc-per-node", "2"]
HEALTH_ON = {"RAILYARD_DISABLE_HEALTH": "0", "RAILYARD_LOG_ALL_RANKS": "1"}


@pytest.mark.parametrize(("target", "rank", "step"), [("grad", 0, 4), ("param", 1, 5)])
def test_an_injected_bitflip_ends_the_attempt_with_the_sdc_exit_code(tmp_path, target: str, rank: int, step: int) -> None:  # type: ignore[no-untyped-def]
    """Also the launcher's side of it (once tests/trainer/test_fault_exit_codes.py's own run per
    target): the flipped rank's exit code, and the clean save before the flip is let finish."""
    assert run_launcher is not None
    tiers = tmp_path / "tiers"
    checkpoint = {"memory": {"intervalSteps": 3, "keep": 2, "dir": str(tiers / "memory")}, "local": {"enabled": False},
                  "shared": {"intervalSteps": 1000, "keep": 1, "dir": str(tiers / "shared")}}
    run = run_launcher(
        tmp_path / "run", TWO, trainer={"steps": 8, "faults": [{"kind": "bitflip", "rank": rank, "step": step, "target": target}]},
        config={"checkpoint": checkpoint, "health": {"sdc": {"intervalSteps": 3}}}, RAILYARD_PLAIN_CHECKPOINT="0", **HEALTH_ON,
    )
    assert run.code == ExitCode.SDC_DETECTED, run.explain()
    assert run.of("fault", kind="bitflip", rank=rank, step=step)
    workers = run.of("launcher_exit")[0]["workers"]
    assert workers[str(rank)] == ExitCode.SDC_DETECTED, workers
    steps = {e["step"] for e in run.of("step")}
    assert step - 1 in steps and step + 1 not in steps, "training went on past the corrupted step"
    # the clean save taken at step 3, before the flip, was let finish before the attempt ended:
    # the next attempt restores it (not nothing, or an older one)
    saved = _manifests(tiers / "memory")
    assert saved.get(3) is True, (saved, run.explain())


def _manifests(root: Path) -> dict[int, bool]:
    """step -> sdc_passed of every committed checkpoint under a tier root."""
    return {int(p.parent.name[5:]): json.loads(p.read_text())["sdc_passed"] for p in root.rglob("manifest.json")}


def _tiered(root: Path, interval: int) -> dict[str, Any]:
    return {
        "memory": {"intervalSteps": interval, "keep": 20, "dir": str(root / "memory")},
        "local": {"enabled": False}, "shared": {"enabled": False},
    }


@pytest.mark.parametrize("replay", [True, False], ids=["replay", "no-replay"])
def test_pp_grad_flip_never_yields_a_clean_checkpoint(tmp_path: Path, replay: bool) -> None:
    """The reproduction of issue 15: pp=2, a gradient bit flip at step 3. With the replay the
    attempt ends with an SDC verdict at step 3; without it, every later checkpoint is suspect."""
    assert run_launcher is not None
    run = run_launcher(
        tmp_path / "run", ["--nproc-per-node", "2", "--pp", "2"],
        trainer={"steps": 6, "faults": [{"kind": "bitflip", "rank": 0, "step": 3, "target": "grad"}]},
        config={"checkpoint": _tiered(tmp_path / "tiers", 1), "health": {"sdc": {"intervalSteps": 50, "replayOnSpike": replay}}},
        RAILYARD_PLAIN_CHECKPOINT="0", **HEALTH_ON,
    )
    saved = _manifests(tmp_path / "tiers")
    # steps 1 and 2 are clean wherever they were committed; a save still in flight when the
    # verdict ended the attempt is lost (the next due save skips instead of waiting for it)
    assert all(ok for step, ok in saved.items() if step <= 2), (saved, run.explain())
    assert not any(ok for step, ok in saved.items() if step > 2), saved
    if replay:
        assert run.code == ExitCode.SDC_DETECTED, run.explain()
        assert set(run.of("launcher_exit")[0]["workers"].values()) == {ExitCode.SDC_DETECTED}, "every rank gives the verdict"
        assert "replay" in run.of("worker_failed")[0]["error"]
        assert max(saved) <= 2
    else:
        assert run.code == 0, run.explain()
        # a memory save due while the previous one is still being written is skipped, not
        # queued (docs/checkpoints.md), so which of steps 2-5 are saved depends on the load;
        # the first and the run's last always are, and every one after the flip is suspect
        assert {1, 6} <= set(saved) <= {1, 2, 3, 4, 5, 6}, saved


def test_hsdp_catches_a_mantissa_flip_in_a_parameter_by_the_cross_replica_vote(tmp_path: Path) -> None:
    """HSDP 2 replicas x 2 shards: a low bit of a weight flipped right after the update moves
    it by ~1e-6 relative (no magnitude check can see it); the replicas' checksums differ at the
    next checkpoint's verification, so the attempt ends with an SDC verdict, nothing clean."""
    assert run_launcher is not None
    run = run_launcher(
        tmp_path / "run", ["--nproc-per-node", "4", "--dp-replicas", "2"],
        trainer={"steps": 6, "faults": [{"kind": "bitflip", "rank": 1, "step": 3, "target": "param", "bit": 20}]},
        config={"checkpoint": _tiered(tmp_path / "tiers", 2), "health": {"sdc": {"intervalSteps": 50}}},
        RAILYARD_PLAIN_CHECKPOINT="0", **HEALTH_ON,
    )
    assert run.code == ExitCode.SDC_DETECTED, run.explain()
    flip = run.of("fault", kind="bitflip")[0]
    assert 0 < abs(flip["after"] - flip["before"]) < abs(flip["before"]), flip
    errors = [e["error"] for e in run.of("worker_failed")]
    # ranks 1 and 3 hold the same shard in the two replicas and see the mismatch; 0 and 2 hear it
    assert len(errors) == 4 and all("replica_checksum" in e for e in errors), errors
    assert sum("over 'dp_replicate' differ between ranks [1, 3]" in e for e in errors) == 2, errors
    saved = _manifests(tmp_path / "tiers")
    assert saved in ({2: True}, {}), f"only step 2 (if its save finished) and clean: {saved}"


@pytest.mark.parametrize(("layout", "only"), [("dp_x_tp", "attention_norm")])
def test_tensor_parallel_replicas_are_compared_across_the_tp_group(layout: str, only: str, tmp_path: Path) -> None:
    """A mantissa flip in a norm weight, which every rank of a TP group holds whole, is caught by
    the replica checksum over "tp" (both targets: the weight, and its gradient)."""
    from railyard_trainer.health.layouts import Trial, run_layout

    trials = [Trial(target, 20, at=1, rank=1, tensor_pick=0.5, element_pick=0.5, only=only) for target in ("param", "grad")]
    data = run_layout(layout, trials, tmp_path / "out.json", warmup=4)
    for r in data["results"]:
        assert only in r["tensor"] and r["caught"] and r["by"] == "replica_checksum", r
