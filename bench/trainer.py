"""Benchmark: tokens/s of each parallel layout against one process, on the same model and data.

Runs the real launcher (``python -m railyard_trainer.launcher``) once per layout with the same
global batch and reads rank 0's JSON step lines; tokens/s is the median over the steps after
warm-up. Reported as the ratio to the single-process run of the same job, so the number is
comparable on a noisy shared machine.

On CPU/gloo with 2 cores, layouts with more processes than cores can only lose: these ratios
measure the framework's overhead (collectives, pipeline bubbles, process contention), not
scaling. GPU throughput (MFU) is measured by bench/gpu/mfu.py.

The data is real by default: token shards made by ``railyard-train prepare`` from
examples/data/apache-2.0.txt with a tokenizer trained on it (``--data synthetic`` for the Markov
chain). A second table times the data path alone: the sampler plus memory-mapped reads per
sequence, on a 4M-token shard set, against the step it feeds.

Run: ``python bench/trainer.py [--steps 20] [--preset tiny] [--data tokens|synthetic]``.
Writes bench/results/trainer.json.
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

from provenance import write_results

#: The code this bench measures (bench/provenance.py: a result is stale once it changed for a round).
MEASURES = (
    "trainer_image/railyard_trainer",
)


RESULTS = Path(__file__).parent / "results" / "trainer.json"

LAYOUTS: dict[str, list[str]] = {
    "single": ["--nproc-per-node", "1"],
    "fsdp(dp=2)": ["--nproc-per-node", "2"],
    "tp=2": ["--nproc-per-node", "2", "--tp", "2"],
    "pp=2 GPipe": ["--nproc-per-node", "2", "--pp", "2", "--schedule", "GPipe"],
    "pp=2 1F1B": ["--nproc-per-node", "2", "--pp", "2", "--schedule", "1F1B"],
    "pp=2 Interleaved1F1B": ["--nproc-per-node", "2", "--pp", "2", "--schedule", "Interleaved1F1B", "--microbatches", "4"],
    "dp=2 x tp=2": ["--nproc-per-node", "4", "--tp", "2"],
    "pp=2 x dp=2": ["--nproc-per-node", "4", "--pp", "2", "--schedule", "1F1B"],
    "hsdp 2 replicas x 2 shards": ["--nproc-per-node", "4", "--dp-replicas", "2"],
}
TEXT = Path(__file__).resolve().parents[1] / "examples" / "data" / "apache-2.0.txt"


def make_shards(root: Path, *, repeat: int = 1) -> Path:
    """Shards of the example text (``repeat`` copies of it) with a tokenizer trained on it."""
    from railyard_trainer.prepare import prepare, train_tokenizer

    src = root / "text.txt"
    src.write_text(TEXT.read_text() * repeat)
    train_tokenizer([str(TEXT)], vocab_size=256, output=str(root / "tokenizer.json"))
    prepare([str(src)], tokenizer_path=str(root / "tokenizer.json"), output=str(root / f"shards-{repeat}"), line_documents=True, shard_tokens=1 << 20)
    return root / f"shards-{repeat}"


def loader_cost(shards: Path, *, seq: int, batch: int, n: int = 200) -> dict[str, float]:
    """Seconds per global batch of the token path (sampler + memmap reads + tensor), and of
    the synthetic source, on this process."""
    import time

    import torch

    from railyard_trainer.config import DatasetConfig
    from railyard_trainer.data import ShardedBatches, build_source

    out = {}
    for kind, cfg in (("tokens", DatasetConfig(type="tokens", path=str(shards))), ("synthetic", DatasetConfig())):
        src = build_source(cfg, vocab_size=256, seed=0, seq_len=seq)
        loader = ShardedBatches(src, batch_size=batch, seq_len=seq, dp_rank=0, dp_size=1, device=torch.device("cpu"))
        loader.next_batch()
        t0 = time.perf_counter()
        for _ in range(n):
            loader.next_batch()
        out[kind] = (time.perf_counter() - t0) / n
    return out


def run_layout(args: list[str], *, preset: str, steps: int, batch: int, seq: int, dataset: dict[str, Any]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAILYARD_", "MASTER_"))}
    env.update({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "RAILYARD_PLAIN_CHECKPOINT": "1", "RAILYARD_DISABLE_HEALTH": "1"})
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "config.json"
        cfg.write_text(json.dumps({"job": "bench", "trainer": {"preset": preset, "steps": steps, "batchSize": batch, "seqLen": seq, "warmupSteps": 2, "dataset": dataset}}))
        out = subprocess.run([sys.executable, "-m", "railyard_trainer.launcher", "--config", str(cfg), *args], env=env, capture_output=True, text=True, timeout=900)
    steps_ev = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"event":"step"')]
    if out.returncode != 0 or not steps_ev:
        raise RuntimeError(f"layout {args} failed with {out.returncode}:\n{out.stderr[-3000:]}")
    warm = [e for e in steps_ev if e["step"] > max(2, steps // 4)]
    return {
        "tokens_per_s": statistics.median(e["tokens_per_s"] for e in warm),
        "step_time_s": statistics.median(e["step_time_s"] for e in warm),
        "final_loss": steps_ev[-1]["loss"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--data", choices=["tokens", "synthetic"], default="tokens")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated subset of the layouts (single is always run)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()
    chosen = ["single", *(n for n in a.layouts.split(",") if n and n != "single")]
    unknown = [n for n in chosen if n not in LAYOUTS]
    if unknown:
        ap.error(f"--layouts: unknown {unknown}; choose from {list(LAYOUTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        dataset: dict[str, Any] = {"type": "synthetic"}
        if a.data == "tokens":
            dataset = {"type": "tokens", "path": str(make_shards(Path(tmp)))}
        measured = {name: run_layout(LAYOUTS[name], preset=a.preset, steps=a.steps, batch=a.batch_size, seq=a.seq_len, dataset=dataset) for name in chosen}
        big = make_shards(Path(tmp), repeat=800)  # ~4M tokens in 4 shard files
        cost = loader_cost(big, seq=a.seq_len, batch=a.batch_size)
    base = measured["single"]["tokens_per_s"]
    results: list[dict[str, Any]] = []
    print(f"{'layout':<24}{'tokens/s':>12}{'vs single':>11}{'step s':>10}{'loss@end':>10}")
    for name, m in measured.items():
        ratio = m["tokens_per_s"] / base
        print(f"{name:<24}{m['tokens_per_s']:>12.0f}{ratio:>11.2f}{m['step_time_s']:>10.4f}{m['final_loss']:>10.4f}")
        results.append({"metric": f"tokens_per_s[{name}]", "value": round(m["tokens_per_s"], 1), "unit": "tokens/s", "target": None, "meets": None})
        if name != "single":
            results.append({"metric": f"tokens_per_s_ratio_vs_single[{name}]", "value": round(ratio, 3), "unit": "ratio", "target": None, "meets": None})
    step_s = measured["single"]["step_time_s"]
    print(f"\ndata path, per global batch of {a.batch_size} x {a.seq_len + 1} tokens: tokens {cost['tokens'] * 1e3:.3f} ms "
          f"({cost['tokens'] / step_s:.2%} of a single-process step), synthetic {cost['synthetic'] * 1e3:.3f} ms")
    results += [
        {"metric": "data_path_seconds_per_batch[tokens, 4M-token memmap]", "value": round(cost["tokens"], 6), "unit": "s", "target": None, "meets": None},
        {"metric": "data_path_seconds_per_batch[synthetic]", "value": round(cost["synthetic"], 6), "unit": "s", "target": None, "meets": None},
        {"metric": "data_path_fraction_of_single_process_step[tokens]", "value": round(cost["tokens"] / step_s, 5), "unit": "ratio", "target": "< 0.01", "meets": cost["tokens"] / step_s < 0.01},
    ]
    # Same data, same model: every layout ends at the same loss (a cheap end-to-end check).
    spread = max(m["final_loss"] for m in measured.values()) - min(m["final_loss"] for m in measured.values())
    results.append({"metric": "final_loss_spread_across_layouts", "value": round(spread, 6), "unit": "nats", "target": "< 1e-3", "meets": spread < 1e-3})
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(a.out, {"bench": "trainer", "config": {**vars(a), "out": str(a.out)}, "results": results}, MEASURES, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
