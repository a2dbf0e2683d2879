"""Exact resume: N steps straight and N/2 + resume + N/2 give the same losses bit for bit, from
each checkpoint tier (memory, local, shared), for FSDP, dp x tp and pp x dp on CPU, training on
token shards made by `railyard-train prepare`; and a resume onto another data-parallel degree
from a node tier (resharded) continues with the same samples.

A "crash after step N/2" is made by deleting the step-N checkpoints of a finished run: the
run's own losses are then the uninterrupted reference, and nothing depends on how far a
background save had got when a process died.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from .launch import Run, run_launcher

pytestmark = [pytest.mark.torch, pytest.mark.slow]

TEXT = Path(__file__).resolve().parents[2] / "examples" / "data" / "apache-2.0.txt"
STEPS, HALF = 6, 3
TIERS = ("memory", "local", "shared")
LAYOUTS = {
    "fsdp": ["--nproc-per-node", "2"],
    "dp_x_tp": ["--nproc-per-node", "4", "--tp", "2"],
    "pp_x_dp": ["--nproc-per-node", "4", "--pp", "2"],
}
#: Each layout's resume onto another data-parallel degree (from a node tier).
OTHER_DEGREE = {
    "fsdp": (["--nproc-per-node", "1"], "memory"),
    "dp_x_tp": (["--nproc-per-node", "2", "--tp", "2"], "local"),
    "pp_x_dp": (["--nproc-per-node", "2", "--pp", "2"], "memory"),
}
ENV = {"RAILYARD_PLAIN_CHECKPOINT": "0", "RAILYARD_DISABLE_HEALTH": "0"}


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from railyard_trainer.prepare import prepare, train_tokenizer

    root = tmp_path_factory.mktemp("data")
    train_tokenizer([str(TEXT)], vocab_size=256, output=str(root / "tokenizer.json"))
    prepare([str(TEXT)], tokenizer_path=str(root / "tokenizer.json"), output=str(root / "shards"), line_documents=True)
    return root / "shards"


def _checkpoint(tiers: Path, enabled: tuple[str, ...]) -> dict[str, Any]:
    return {t: {"enabled": t in enabled, "intervalSteps": HALF, "keep": 3, "dir": str(tiers / t)} for t in TIERS}


def _train(workdir: Path, args: list[str], shards: Path, tiers: Path, enabled: tuple[str, ...], attempt: int) -> Run:
    return run_launcher(
        workdir, [*args, "--attempt", str(attempt)],
        trainer={"steps": STEPS, "dataset": {"type": "tokens", "path": str(shards)}},
        config={"checkpoint": _checkpoint(tiers, enabled)}, timeout=240, **ENV,
    )


@pytest.fixture(scope="module")
def straight(shards: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Run, Path]]:
    """Per layout: the uninterrupted run, saving every tier at steps 3 and 6."""
    out = {}
    for name, args in LAYOUTS.items():
        root = tmp_path_factory.mktemp(f"straight-{name}")
        run = _train(root / "run", args, shards, root / "tiers", TIERS, attempt=0)
        assert run.code == 0, run.explain()
        out[name] = (run, root / "tiers")
    return out


def _crashed_after_half(tiers: Path, tier: str, dest: Path) -> Path:
    """A copy of one tier as a crash right after step N/2 would have left it."""
    shutil.copytree(tiers / tier, dest / tier)
    for step_dir in (dest / tier).glob(f"*/step-{STEPS:08d}"):
        shutil.rmtree(step_dir)
    return dest


#: (layout, tier) of the bit-exact resumes: every layout and every tier once (a Latin square,
#: not the 3 x 3 product: each resume is a multi-process torch run, and the suite has a time
#: budget). With the resumes onto another degree below (fsdp and pp x dp from memory, dp x tp
#: from local) each node tier is resumed in two layouts; the shared tier is DCP's resharding
#: load, the same code in every layout.
EXACT = [("fsdp", "local"), ("dp_x_tp", "memory"), ("pp_x_dp", "shared")]
assert {layout for layout, _ in EXACT} == set(LAYOUTS) and {tier for _, tier in EXACT} == set(TIERS)


@pytest.mark.parametrize(("layout", "tier"), EXACT)
def test_resumed_losses_equal_the_uninterrupted_run_bit_for_bit(layout: str, tier: str, straight: dict[str, tuple[Run, Path]], shards: Path, tmp_path: Path) -> None:
    full, tiers = straight[layout]
    resumed = _train(tmp_path / "run", LAYOUTS[layout], shards, _crashed_after_half(tiers, tier, tmp_path / "tiers"), (tier,), attempt=1)
    assert resumed.code == 0, resumed.explain()
    restored = resumed.of("restored", rank=0)
    assert [(e["tier"], e["step"]) for e in restored] == [(tier, HALF)], resumed.explain()
    after, reference = resumed.losses(), full.losses()
    assert sorted(after) == list(range(HALF + 1, STEPS + 1))
    assert {s: after[s] for s in after} == {s: reference[s] for s in after}, "not bit-identical"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_resume_onto_another_data_parallel_degree_from_a_node_tier(layout: str, straight: dict[str, tuple[Run, Path]], shards: Path, tmp_path: Path) -> None:
    full, tiers = straight[layout]
    args, tier = OTHER_DEGREE[layout]
    resumed = _train(tmp_path / "run", args, shards, _crashed_after_half(tiers, tier, tmp_path / "tiers"), (tier,), attempt=1)
    assert resumed.code == 0, resumed.explain()
    restored = resumed.of("restored", rank=0)
    assert [(e["tier"], e["step"]) for e in restored] == [(tier, HALF)], resumed.explain()
    assert "resharded" in restored[0]["detail"]
    after, reference = resumed.losses(), full.losses()
    assert sorted(after) == list(range(HALF + 1, STEPS + 1))
    # same samples and state; only the summation order of the reductions differs
    for s in after:
        assert abs(after[s] - reference[s]) < 1e-5, (s, after[s], reference[s])
