"""TorchTitan on one device, on the shape of one of our presets: the side of bench/gpu/run.py's
comparison that is not ours.

TorchTitan's own model (``torchtitan.models.llama3.Transformer``), its own parallelization
(``parallelize_llama``: activation checkpointing, per-block torch.compile, FSDP2 when there is
more than one rank) and its own mixed precision on one GPU (``maybe_enable_amp``: autocast
bf16, since TorchTitan applies FSDP only with dp_shard > 1), its loss and its default optimizer
(fused AdamW), in a loop of what its Trainer does per step (forward, loss per token, backward,
clip to 1.0, step). Not its Trainer itself: that needs ``datasets`` (pyarrow, ~40 MB) and a
tokenizer, which do not fit in what a run may carry; the tokens here are random, as the data
path is not what is compared.

Pinned to torchtitan 0.2.2 (February 2026, the release for torch 2.10/2.11; 0.3.0 needs a newer
torch). Modules that only the parts of TorchTitan not used here need are stubbed when absent
(``datasets``; ``tensorboard`` behind ``torch.utils.tensorboard``; the MoE Triton kernels where
there is no Triton, i.e. on the CPU), and the stubs are named in the output.

Prints one ``{"event": "titan", ...}`` line (or ``{"event": "titan", "skipped": true, "reason"}``
when torchtitan is not installed), then one ``{"event": "step", ...}`` line per step.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import types
from typing import Any


def stub_missing() -> list[str]:
    """Empty stand-ins for modules torchtitan imports at import time but this loop never calls."""
    stubbed = []
    if importlib.util.find_spec("datasets") is None:
        ds = types.ModuleType("datasets")
        dist_mod = types.ModuleType("datasets.distributed")

        def unavailable(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("datasets is stubbed in bench/gpu/titan.py")

        ds.load_dataset = unavailable  # type: ignore[attr-defined]
        ds.Dataset = ds.IterableDataset = type("Dataset", (), {})  # type: ignore[attr-defined]
        dist_mod.split_dataset_by_node = unavailable  # type: ignore[attr-defined]
        ds.distributed = dist_mod  # type: ignore[attr-defined]
        sys.modules.update({"datasets": ds, "datasets.distributed": dist_mod})
        stubbed.append("datasets")
    if importlib.util.find_spec("tensorboard") is None:
        tb = types.ModuleType("torch.utils.tensorboard")
        tb.SummaryWriter = None  # type: ignore[attr-defined]
        sys.modules["torch.utils.tensorboard"] = tb
        stubbed.append("tensorboard")
    if importlib.util.find_spec("triton") is None:
        kernels = types.ModuleType("torchtitan.models.moe.kernels")
        kernels.generate_permute_indices = None  # type: ignore[attr-defined]
        sys.modules[kernels.__name__] = kernels
        stubbed.append("triton (torchtitan's MoE kernels)")
    return stubbed


def titan_args(preset: str, seq: int) -> Any:
    """TorchTitan's TransformerModelArgs with our preset's shape. Its FFN width is derived
    (int(2/3 x 4 x dim) x multiplier, rounded up to ``multiple_of``): with multiple_of = our
    ffn_dim and a multiplier just under ffn_dim / int(8 x dim / 3), it comes out at ffn_dim."""
    from torchtitan.models.llama3 import TransformerModelArgs

    from railyard_trainer.model_args import PRESETS

    m = PRESETS[preset]
    base = int(2 * 4 * m.dim / 3)
    return TransformerModelArgs(
        dim=m.dim, n_layers=m.n_layers, n_heads=m.n_heads, n_kv_heads=m.n_kv_heads, vocab_size=m.vocab_size,
        multiple_of=m.ffn_dim, ffn_dim_multiplier=(m.ffn_dim - 0.5) / base, norm_eps=m.norm_eps,
        rope_theta=m.rope_theta, max_seq_len=seq,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--preset", default="1b")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--ac", action="store_true", help="full activation checkpointing")
    ap.add_argument("--compile", default="", help="torch.compile backend for each block (inductor; eager on CPU)")
    a = ap.parse_args()
    if importlib.util.find_spec("torchtitan") is None:
        print(json.dumps({"event": "titan", "skipped": True, "reason": "torchtitan is not installed (bench/gpu/fetch-wheels.sh brings its wheel)"}))
        return 0
    stubbed = stub_missing()
    from importlib.metadata import version

    import torch
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.utils import maybe_enable_amp
    from torchtitan.models.llama3 import Transformer, parallelize_llama

    from railyard_trainer.model_args import PRESETS

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    args = titan_args(a.preset, a.seq)
    job = JobConfig()
    job.training.seq_len = a.seq
    job.training.local_batch_size = a.batch
    job.activation_checkpoint.mode = "full" if a.ac else "none"
    job.compile.enable = bool(a.compile)
    job.compile.components = ["model"]
    job.compile.backend = a.compile or "inductor"
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    with torch.device("meta"):
        model = Transformer(args)
    ffn = model.layers["0"].feed_forward.w1.out_features
    if ffn != PRESETS[a.preset].ffn_dim:
        raise SystemExit(f"torchtitan's FFN width {ffn} != ours {PRESETS[a.preset].ffn_dim}: the shapes differ")
    _, flops = args.get_nparams_and_flops(model, a.seq)
    model = parallelize_llama(model, dims, job)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=device)
    model.train()
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=fused, foreach=None if fused else True)
    amp = maybe_enable_amp(dims, job.training.mixed_precision_param, device.type)
    print(json.dumps({"event": "titan", "version": version("torchtitan"), "flops_per_token": flops, "stubbed": stubbed,
                      "mixed_precision": "autocast bf16" if isinstance(amp, torch.autocast) else "fully_shard", "device": str(device)}), flush=True)
    g = torch.Generator(device="cpu").manual_seed(0)
    for step in range(1, a.steps + 1):
        tokens = torch.randint(0, args.vocab_size, (a.batch, a.seq + 1), generator=g).to(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        with amp:
            pred = model(tokens[:, :-1])
        loss = cross_entropy_loss(pred, tokens[:, 1:]) / (a.batch * a.seq)
        del pred
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad()
        loss_value = float(loss.detach())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        mem = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else 0
        print(json.dumps({"event": "step", "step": step, "loss": loss_value, "step_time_s": round(dt, 5),
                          "tokens_per_s": round(a.batch * a.seq / dt, 1), "memory_bytes": mem}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
