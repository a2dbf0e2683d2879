"""Every parallel layout computes what one process computes, on the same data (fp32, gloo).

First-step gradients (unsharded, by parameter name) to ~1e-6 and the losses of 10 steps to
~1e-4, against a single-process run of the same model and the same global batches.
"""

from __future__ import annotations

import math

import pytest

from .launch import Run

pytestmark = pytest.mark.torch

#: Every parallelism and every pipeline schedule. 1F1B is run once, in pp x dp: the same schedule
#: on the same two stages, and pipeline stages without a data-parallel dimension are GPipe's and
#: Interleaved1F1B's (each multi-process run costs the suite seconds of CPU).
LAYOUTS = {
    "fsdp": ["--nproc-per-node", "2"],
    "tp": ["--nproc-per-node", "2", "--tp", "2"],
    "pp-gpipe": ["--nproc-per-node", "2", "--pp", "2", "--schedule", "GPipe"],
    "pp-interleaved": ["--nproc-per-node", "2", "--pp", "2", "--schedule", "Interleaved1F1B"],
    # With activation checkpointing: recomputation must not change the numbers.
    "dp-x-tp+ac": ["--nproc-per-node", "4", "--tp", "2", "--activation-checkpointing"],
    "pp-x-dp": ["--nproc-per-node", "4", "--pp", "2", "--schedule", "1F1B"],
}


@pytest.fixture(scope="module")
def reference(trainer_runs) -> Run:  # type: ignore[no-untyped-def]
    run = trainer_runs("single", ["--nproc-per-node", "1"], dump_grads=True)
    assert run.code == 0, run.explain()
    return run


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_single_process(layout: str, reference: Run, trainer_runs) -> None:  # type: ignore[no-untyped-def]
    import torch

    run = trainer_runs(layout, LAYOUTS[layout], dump_grads=True)
    assert run.code == 0, run.explain()

    assert set(run.grads) == set(reference.grads)
    worst = max((run.grads[k] - reference.grads[k]).abs().max().item() for k in reference.grads)
    scale = max(g.abs().max().item() for g in reference.grads.values())
    assert worst < 1e-6, f"{layout}: first-step gradients differ by up to {worst:.2e} (largest gradient {scale:.2e})"
    assert all(torch.isfinite(g).all() for g in run.grads.values())

    ref, got = reference.losses(), run.losses()
    assert sorted(got) == list(range(1, 11))
    diffs = [abs(got[s] - ref[s]) for s in ref]
    assert max(diffs) < 1e-4, f"{layout}: losses differ by up to {max(diffs):.2e}: {got} vs {ref}"
    print(f"[{layout}] first-step grads differ by <= {worst:.1e}; 10-step losses by <= {max(diffs):.1e}")
    # The comparison is not vacuous: training moved the loss.
    assert ref[10] < ref[1] - 0.1 and not math.isnan(ref[10])


def test_ranks_sit_where_the_mesh_says(trainer_runs) -> None:  # type: ignore[no-untyped-def]
    run = trainer_runs("pp-x-dp", LAYOUTS["pp-x-dp"], dump_grads=True)
    starts = {e["rank"]: e for e in run.of("start")}
    assert sorted(starts) == [0, 1, 2, 3]
    for rank, e in starts.items():
        assert e["coords"] == e["mesh_coords"] == [rank // 2, rank % 2, 0]
