"""The prepared GPU run (bench/gpu/run.sh) works before the GPU does: its parts run on the CPU
in the dry mode (tiny shapes, a few steps) through the same command the GPU run uses, and
write the same results file. The GPU machine is lent rarely and briefly; a script that rotted
in between would waste the loan.

The trainer runs as on a GPU, bf16 under FSDP2, here on gloo. To keep the run short, only
one trainer part runs: the 8b part, tiny here, with activation checkpointing. The other
variants take the same path with AC off or on. The compiled variant adds only
RAILYARD_COMPILE, which is tested on its own below, and CPU offload applies only on a GPU. TorchTitan is not
installed in the test environment (it must not be: its dependencies could pull another torch),
so its part must be skipped with the reason, not fail."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Only catches a hang: the run takes ~40 s on a loaded 2-core machine.
HANG_S = 240

PARTS = ["env", "sdc", "titan/1b/eager", "snapshot", "ours/8b/ac"]


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RAILYARD_BENCH_SMOKE") != "all",
                    reason="the whole prepared GPU run, dry (~40 s): RAILYARD_BENCH_SMOKE=all runs it, as before a GPU loan")
def test_the_gpu_run_runs_every_part_dry_on_the_cpu(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAILYARD_", "MASTER_"))}
    # No wheels: what the test environment has is what the run gets (torchtitan absent).
    env.update(RAILYARD_GPU_WHEELS=str(tmp_path / "no-wheels"), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    proc = subprocess.run(
        ["bash", str(ROOT / "bench/gpu/run.sh"), "--out", str(tmp_path / "out"), "--dry", "--only", ",".join(PARTS)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "out/gpu_h200.json").read_text())
    assert report["bench"] == "gpu_h200_dry" and report["dry"] is True
    parts = report["parts"]
    assert list(parts) == PARTS, "each part ran, in the planned order"
    failed = {name: d["error"][-1500:] for name, d in parts.items() if "error" in d}
    assert not failed, failed

    assert report["env"]["torch"] and "nvidia_smi" in report["env"]
    assert parts["sdc"]["kat_stable"] and parts["sdc"]["caught"], parts["sdc"]
    for name in ("ours/8b/ac",):
        d = parts[name]
        assert d["preset"] == "tiny", "dry: the GPU run's part names, tiny shapes"
        assert d["steps_done"] >= 3 and d["tokens_per_s"] > 0 and d["flops_per_token"] > 0, (name, d)
        assert d["mfu"] is None, "no GPU, no peak FLOP/s: MFU is not made up"
    assert parts["titan/1b/eager"]["skipped"] and "torchtitan" in parts["titan/1b/eager"]["reason"]
    snap = parts["snapshot"]
    assert snap["bytes"] > 0 and snap["copy_gb_s"] > 0 and snap["raw_copy_gb_s"] > 0 and snap["stall_s"] >= 0, snap
    assert all(s["ok"] for s in snap["saves"]), snap["saves"]

    metrics = {r["metric"] for r in report["results"]}
    assert {"tokens_per_s[ours/8b/ac]", "mfu[ours/8b/ac]", "peak_memory_gib[ours/8b/ac]",
            "sdc: bit flip in a device parameter caught (exit SDC_DETECTED)", "snapshot: memory-tier copy / raw copy_",
            "skipped[titan/1b/eager]"} <= metrics, metrics
    assert all(set(r) == {"metric", "value", "unit", "target", "meets"} for r in report["results"])


def test_a_part_out_of_time_is_recorded_and_the_rest_go_on(tmp_path: Path) -> None:
    """The overall budget leaves no time: every part is skipped with the reason, and the
    results file is still written in the standard shape."""
    report = _run_module().run_all(tmp_path, dry=True, budget_s=5)
    assert report["results"] and all(r["metric"].startswith("error[") for r in report["results"])
    assert all("budget" in d["error"] for d in report["parts"].values())
    assert json.loads((tmp_path / "gpu_h200.json").read_text())["results"] == report["results"]


@pytest.mark.parametrize(("value", "backend"), [(None, ""), ("", ""), ("0", ""), ("1", "inductor"), ("eager", "eager")])
def test_railyard_compile_names_the_backend(value: str | None, backend: str) -> None:
    from railyard_trainer.parallelize import compile_backend_from_env

    assert compile_backend_from_env(value) == backend


@pytest.mark.torch
def test_compiled_blocks_keep_their_parameter_names_and_results() -> None:
    """Each block compiled in place: the names checkpoints use are unchanged, and the eager
    backend computes what the uncompiled model does."""
    import torch

    from railyard_trainer.model import Transformer
    from railyard_trainer.model_args import PRESETS
    from railyard_trainer.parallelize import apply_compile

    torch.manual_seed(0)
    plain = Transformer(PRESETS["tiny"])
    torch.manual_seed(0)
    compiled = Transformer(PRESETS["tiny"])
    apply_compile(compiled, "eager")
    assert [n for n, _ in plain.named_parameters()] == [n for n, _ in compiled.named_parameters()]
    tokens = torch.randint(0, 256, (2, 16))
    torch.testing.assert_close(compiled(tokens), plain(tokens))


def _run_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("railyard_bench_gpu_run", ROOT / "bench/gpu/run.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


H200 = 143771 * 2**20  # nvidia-smi's memory.total, MiB


@pytest.mark.parametrize(
    ("preset", "offload", "gpu", "host", "fits"),
    [
        ("1b", False, H200, 0, True),
        ("8b", False, H200, 0, True),  # 128.5 GB of state + activations: fits in 150 GB
        ("8b", False, 80e9, 0, False),  # not on an 80 GB GPU
        ("8b", True, H200, 130e9, False),  # offloaded: 128.5 GB + the CPU optimizer's temporaries
        ("8b", True, H200, 400e9, True),
        ("8b", False, 0, 0, True),  # unknown sizes: tried, and a failure is recorded
    ],
)
def test_a_preset_that_cannot_fit_is_skipped_with_the_sizes(preset: str, offload: bool, gpu: float, host: float, fits: bool) -> None:
    reason = _run_module().memory_misfit(preset, offload=offload, gpu_total=gpu, host_available=host)
    assert (reason == "") is fits, reason
    if not fits:
        assert preset in reason and "GB" in reason


def test_a_partial_result_keeps_its_figures_beside_its_error() -> None:
    """A part stopped by its time limit reports what it measured before (record_partial)."""
    details = {
        "snapshot": {"error": "partial: the part ran out of time after this", "copy_gb_s": 20.0, "raw_copy_gb_s": 25.0},
        "ours/1b/eager": {"error": "launcher exit -9 after 0 steps", "steps_done": 0},
        "titan/1b/eager": {"skipped": True, "reason": "torchtitan is not installed"},
    }
    rows = {r["metric"]: r for r in _run_module().build_report(details, dry=False, budget_s=440)["results"]}
    assert rows["error[snapshot]"]["meets"] is False and rows["error[ours/1b/eager]"]["meets"] is False
    assert rows["snapshot: memory-tier copy / raw copy_"]["value"] == 0.8
    assert not any("stall" in m for m in rows), "no stall was measured"
    assert not any(m.startswith("tokens_per_s") for m in rows), "no steps, no throughput, no ratio"
    assert "skipped[titan/1b/eager]" in rows
