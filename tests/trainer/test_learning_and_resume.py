"""The tiny preset learns; a run stopped at step K and resumed equals an uninterrupted one, also
on a different world size (the data position is counted in global samples)."""

from __future__ import annotations

import math
import shutil

import pytest

from .launch import run_launcher

pytestmark = pytest.mark.torch

UNIFORM = math.log(256)


def test_tiny_preset_learns_the_synthetic_language(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # 60 steps x 8 sequences x 32 tokens; the chain's entropy is 1.03 nats, uniform is 5.55.
    run = run_launcher(tmp_path, ["--nproc-per-node", "1"], trainer={"steps": 60, "seed": 7})
    assert run.code == 0, run.explain()
    losses = run.losses()
    assert losses[1] > UNIFORM - 0.5
    assert min(losses[s] for s in range(55, 61)) < 2.5, losses


@pytest.fixture(scope="module")
def interrupted(trainer_runs, tmp_path_factory):  # type: ignore[no-untyped-def]
    """2 ranks (FSDP), checkpoint every 5 steps, rank 1 exits with code 42 at step 7."""
    ckpt = tmp_path_factory.mktemp("ckpt")
    run = trainer_runs(
        "interrupted", ["--nproc-per-node", "2"],
        trainer={"faults": [{"kind": "exit", "rank": 1, "step": 7, "code": 42}]},
        config={"checkpoint": {"path": str(ckpt), "intervalSteps": 5}},
    )
    return run, ckpt


def _resume(tmp_path, ckpt, nproc: int):  # type: ignore[no-untyped-def]
    own = tmp_path / "ckpt"
    shutil.copytree(ckpt, own)
    return run_launcher(
        tmp_path / "run", ["--nproc-per-node", str(nproc), "--attempt", "1"],
        trainer={"faults": [{"kind": "exit", "rank": 1, "step": 7, "code": 42}]},  # attempt 0 only
        config={"checkpoint": {"path": str(own), "intervalSteps": 5}},
    )


def test_injected_exit_stops_the_run_with_its_code(interrupted) -> None:  # type: ignore[no-untyped-def]
    run, ckpt = interrupted
    assert run.code == 42, run.explain()
    assert run.of("fault", kind="exit", rank=1, step=7, code=42)
    assert run.of("launcher_exit")[0]["workers"]["1"] == 42
    assert max(run.losses()) == 6
    assert (ckpt / "t" / "step-00000005" / "COMPLETE").exists()


@pytest.mark.parametrize("nproc", [2, 1])
def test_resumed_run_equals_uninterrupted(nproc: int, interrupted, trainer_runs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, ckpt = interrupted
    uninterrupted = trainer_runs("fsdp", ["--nproc-per-node", "2"], dump_grads=True)
    assert uninterrupted.code == 0, uninterrupted.explain()
    run = _resume(tmp_path, ckpt, nproc)
    assert run.code == 0, run.explain()
    assert run.of("restored", rank=0)[0]["step"] == 5
    resumed, full = run.losses(), uninterrupted.losses()
    assert sorted(resumed) == [6, 7, 8, 9, 10]
    tol = 1e-6 if nproc == 2 else 1e-4  # same layout: same arithmetic; other layout: summation order
    for s in resumed:
        assert abs(resumed[s] - full[s]) < tol, (s, resumed[s], full[s])


def test_big_model_path_builds_on_meta_and_initialises_shards(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Presets above 500M parameters are built on the meta device and initialised after
    # sharding; force that path on the tiny model (tp=2: every weight is a DTensor shard).
    run = run_launcher(tmp_path, ["--nproc-per-node", "2", "--tp", "2"], trainer={"steps": 20}, RAILYARD_META_INIT_PARAMS="0")
    assert run.code == 0, run.explain()
    losses = run.losses()
    assert abs(losses[1] - UNIFORM) < 1.0  # freshly initialised, not zeros or garbage
    assert losses[20] < losses[1] - 1.0
