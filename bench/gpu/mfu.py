"""Benchmark (GPU only): MFU of the 1B and 8B presets with FSDP2 (+ TP when more GPUs) in bf16.

Runs the real launcher on this machine's GPUs (``--nproc`` defaults to all of them; ``--tp``
to min(nproc, 8) when there are several, else 1) and reads the trainer's own ``mfu`` from its
JSON step lines: tokens/s per GPU x training FLOPs per token (6 x non-embedding params +
12 x layers x dim x seq_len, as TorchTitan counts) / the GPU's dense bf16 peak (989 TFLOP/s
for H100/H200; override with RAILYARD_PEAK_FLOPS). The 8B preset runs with full activation
checkpointing; on one H200 its fp32 master weights, gradients and AdamW state (128.5 GB) fit
with the fused AdamW the trainer uses on a GPU. ``--offload-8b`` tries FSDP CPU offload instead,
which needs ~161 GB of host memory (bench/gpu/README.md). For one GPU, bench/gpu/run.sh is the
prepared run.

Never run by the CPU test suite. Run: ``python bench/gpu/mfu.py [--presets 1b,8b] [--steps 30]``.
Writes bench/results/gpu_mfu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results" / "gpu_mfu.json"
#: What well-tuned FSDP/TP training reaches on H100-class GPUs (TorchTitan reports ~40% for
#: Llama 3 8B in bf16 without float8 or compile); ours has no torch.compile, so we aim lower.
TARGET_MFU = 0.30


def gpu_count() -> int:
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"], capture_output=True, text=True)
    return int(out.stdout.strip() or 0)


def run(preset: str, *, nproc: int, tp: int, steps: int, batch: int, seq: int, offload: bool, ac: bool, timeout: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAILYARD_", "MASTER_"))}
    env.update({"RAILYARD_PLAIN_CHECKPOINT": "1", "RAILYARD_DISABLE_HEALTH": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    trainer = {"preset": preset, "steps": steps, "batchSize": batch, "seqLen": seq, "warmupSteps": 2, "mixedPrecision": "bf16",
               "cpuOffload": offload, "activationCheckpointing": ac, "collectiveTimeoutSeconds": 900, "watchdogSeconds": 600}
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "config.json"
        cfg.write_text(json.dumps({"job": f"mfu-{preset}", "trainer": trainer, "parallelism": {"tensor": tp}}))
        out = subprocess.run([sys.executable, "-m", "railyard_trainer.launcher", "--config", str(cfg), "--nproc-per-node", str(nproc)],
                             env=env, capture_output=True, text=True, timeout=timeout)
    ev = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"event":"step"')]
    if out.returncode != 0 or not ev:
        return {"preset": preset, "error": f"exit {out.returncode}: {out.stderr[-2000:]}"}
    warm = [e for e in ev if e["step"] > min(5, steps // 2)]
    return {
        "preset": preset, "nproc": nproc, "tp": tp, "offload": offload, "ac": ac, "batch": batch, "seq": seq,
        "mfu": statistics.median(e.get("mfu", 0.0) for e in warm),
        "tokens_per_s": statistics.median(e["tokens_per_s"] for e in warm),
        "step_time_s": statistics.median(e["step_time_s"] for e in warm),
        "memory_gib": max(e["memory_bytes"] for e in ev) / 2**30,
        "loss_first_last": [ev[0]["loss"], ev[-1]["loss"]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="1b,8b")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-1b", type=int, default=8)
    ap.add_argument("--batch-8b", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=0)
    ap.add_argument("--tp", type=int, default=0)
    ap.add_argument("--offload-8b", action="store_true", help="8b with FSDP CPU offload (one GPU only)")
    ap.add_argument("--timeout", type=float, default=540)
    a = ap.parse_args()
    nproc = a.nproc or gpu_count()
    if nproc < 1:
        sys.exit("bench/gpu/mfu.py needs at least one CUDA GPU")
    tp = a.tp or (min(nproc, 8) if nproc > 1 else 1)
    rows = []
    for preset in a.presets.split(","):
        big = preset == "8b"
        rows.append(run(preset, nproc=nproc, tp=tp, steps=a.steps, batch=(a.batch_8b if big else a.batch_1b) * max(1, nproc // tp),
                        seq=a.seq_len, offload=big and nproc == 1 and a.offload_8b, ac=big, timeout=a.timeout))
        print(json.dumps(rows[-1]), flush=True)
    results = []
    for r in rows:
        if "error" in r:
            results.append({"metric": f"mfu[{r['preset']}]", "value": None, "unit": "fraction", "target": TARGET_MFU, "meets": False, "detail": r["error"][-500:]})
            continue
        results.append({"metric": f"mfu[{r['preset']}]", "value": round(r["mfu"], 4), "unit": "fraction", "target": TARGET_MFU, "meets": r["mfu"] >= TARGET_MFU, "detail": r})
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"bench": "gpu_mfu", "results": results}, indent=1))
    print(f"{'preset':<8}{'MFU':>8}{'tokens/s':>12}{'mem GiB':>10}")
    for r in rows:
        if "error" not in r:
            print(f"{r['preset']:<8}{r['mfu']:>8.3f}{r['tokens_per_s']:>12.0f}{r['memory_gib']:>10.1f}")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
