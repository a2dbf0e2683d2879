"""A small FSDP2 language model, trained the way one writes it for torchrun.

    torchrun --nproc-per-node 2 examples/fsdp2_train.py --steps 40 --checkpoint-dir /tmp/ckpt
    railyard-train --nproc-per-node 2 examples/fsdp2_train.py --steps 40 --checkpoint-dir /tmp/ckpt
    railyard-train --nproc-per-node 2 examples/fsdp2_train_railyard.py --steps 40

examples/fsdp2_train.py has no Railyard import: it checkpoints with torch.distributed.checkpoint
into --checkpoint-dir every --checkpoint-every steps and resumes from the newest complete one
there, as under torchrun. examples/fsdp2_train_railyard.py is the same script with the SDK's
lines added (docs/trainer.md shows the diff): its DCP saves go through Railyard's tiers on
spec.checkpoint's schedule (memory with a neighbour's replica, local disk, shared), its resume is
verified, each step is reported (hangs and stragglers judged from real steps) and every
--check-every steps the known-answer SDC check runs; it runs under plain torchrun too. Their
TrainingJobs: examples/fsdp2-train.yaml and examples/fsdp2-train-railyard.yaml. CPU (gloo) or
GPUs (NCCL).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.fsdp import fully_shard

from railyard_trainer import sdk as railyard


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True) for _ in range(layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


class AppState(Stateful):
    """Model and optimizer as DCP saves them (the recipe of PyTorch's DCP tutorial)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        model, optim = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def batch(step: int, rank: int, args: argparse.Namespace, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable synthetic language: each sequence counts up by a small stride modulo the vocabulary."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
    start = torch.randint(0, args.vocab, (args.batch_size, 1), generator=g)
    stride = torch.randint(1, 4, (args.batch_size, 1), generator=g)
    seq = (start + stride * torch.arange(args.seq_len + 1)) % args.vocab
    return seq[:, :-1].to(device), seq[:, 1:].to(device)


def latest_checkpoint(root: str | None) -> str | None:
    """The newest complete checkpoint (DCP writes .metadata last) under root."""
    done = sorted(p for p in Path(root).glob("step-*") if (p / ".metadata").exists()) if root else []
    return str(done[-1]) if done else None


def log(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=os.environ.get("CHECKPOINT_DIR"))
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--check-every", type=int, default=20, help="SDC known-answer check every N steps")
    args = p.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    model = TinyLM(args.vocab, args.dim, args.layers, heads=4).to(device)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    state = {"app": AppState(model, optimizer), "step": 0}

    if (reader := railyard.storage_reader()) is not None:
        dcp.load(state, storage_reader=reader)
    start = int(state["step"])
    if rank == 0:
        log("start", world_size=world, resumed_from=start, attempt=os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    for step in range(start + 1, args.steps + 1):
        t0 = time.perf_counter()
        inputs, labels = batch(step, rank, args, device)
        loss = F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss = loss.detach()
        dist.all_reduce(loss)
        loss = float(loss) / world
        dt = time.perf_counter() - t0
        if rank == 0:
            log("step", step=step, loss=round(loss, 4), step_time_s=round(dt, 4))
        railyard.report_step(step, loss=loss, tokens=inputs.numel(), step_time_s=dt)
        state["step"] = step
        if railyard.should_checkpoint(step):
            dcp.save(state, storage_writer=railyard.storage_writer(step))
        if step % args.check_every == 0:
            railyard.health_check(step=step, optimizer=optimizer)
    if rank == 0:
        log("done", step=args.steps, loss=round(loss, 4) if args.steps > start else None)
    railyard.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
