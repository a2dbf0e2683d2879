"""Bit-flip injection harness for the SDC checks (bench/sdc.py and tests/health use it).

A small model trains in one process on CPU through the real monitor's hooks, in the same
order as the train loop (backward, clip, after_backward, optimizer step, after_step,
checks_passed, checkpoint). Each trial restores a clean snapshot taken at a tier-2 checkpoint,
flips one bit at a random step before the next tier-2 checkpoint, and counts the flip caught
if a check raised SDCDetected or reported a failure (checks_passed() false) before that
checkpoint would be written. Injection points: a gradient right after backward (a compute
fault), a parameter right after the optimizer step, a parameter at rest between steps.
"""

from __future__ import annotations

import copy
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from railyard_trainer.health.monitor import HealthSettings, RailyardHealthMonitor
from railyard_trainer.hooks import SDCDetected, StepMetrics, TrainContext

TARGETS = ("grad", "param_after_update", "param_at_rest")


@dataclass
class HarnessResult:
    flips: int = 0
    caught: int = 0
    confirmed: int = 0
    by_target: dict[str, list[int]] = field(default_factory=dict)  # target -> [flips, caught]
    by_check: Counter[str] = field(default_factory=Counter)
    missed: list[dict[str, Any]] = field(default_factory=list)
    clean_steps: int = 0
    clean_false_sdc: int = 0
    clean_failed_checks: int = 0
    steps_run: int = 0
    wall_s: float = 0.0
    latency_steps: list[int] = field(default_factory=list)


def build_model(seed: int) -> torch.nn.Module:
    from railyard_trainer.model import Transformer
    from railyard_trainer.model_args import ModelArgs

    torch.manual_seed(seed)
    return Transformer(
        ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, ffn_dim=64, max_seq_len=64)
    )


def make_batch(step: int, *, vocab: int = 128, batch: int = 4, seq: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable synthetic language: each sequence counts up from a random start."""
    g = torch.Generator().manual_seed(1000 + step)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    tokens = (start + torch.arange(seq + 1)) % vocab
    noise = torch.rand(tokens.shape, generator=g) < 0.1
    tokens = torch.where(noise, torch.randint(0, vocab, tokens.shape, generator=g), tokens)
    return tokens[:, :-1], tokens[:, 1:]


@torch.no_grad()
def flip_bit(t: torch.Tensor, index: int, bit: int) -> tuple[float, float]:
    flat = t.view(-1)
    cell = flat[index : index + 1]
    before = float(cell.item())
    cell.view(torch.int32).bitwise_xor_(torch.tensor(1 << bit, dtype=torch.int32))
    return before, float(cell.item())


class Harness:
    def __init__(
        self, *, seed: int = 0, sdc_interval: int = 10, tier2_interval: int = 20, bits: tuple[int, ...] = (30,)
    ) -> None:
        self.rng = random.Random(seed)
        self.model = build_model(seed)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-3, weight_decay=0.01)
        self.tier2 = tier2_interval
        self.bits = bits
        self.ctx = TrainContext(
            rank=0, local_rank=0, world_size=1, node="node-0", pod_index=0, job="harness", attempt=0,
            dims=None, mesh=None, model_parts=[self.model], optimizer=self.opt, lr_scheduler=None, data=None,
        )
        self.monitor = RailyardHealthMonitor(HealthSettings(sdc_interval_steps=sdc_interval), self.ctx)
        self.params = list(self.model.parameters())

    def step(self, inject: str | None = None) -> bool:
        """One training step; returns checks_passed(). Raises SDCDetected."""
        ctx = self.ctx
        ctx.step += 1
        inputs, labels = make_batch(ctx.step)
        ctx.extra["batch"] = (inputs, labels)
        self.opt.zero_grad(set_to_none=True)
        from railyard_trainer.model import cross_entropy_loss

        t0 = time.perf_counter()
        loss = cross_entropy_loss(self.model(inputs), labels)
        loss.backward()  # type: ignore[no-untyped-call]
        compute = time.perf_counter() - t0
        if inject == "grad":
            self._flip([p.grad for p in self.params if p.grad is not None])
        gn = torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.monitor.after_backward(ctx, loss.detach(), gn)
        self.opt.step()
        if inject == "param_after_update":
            self._flip(self.params)
        self.monitor.after_step(
            ctx, StepMetrics(ctx.step, float(loss.detach()), float(gn), compute, compute, 0.0, 3e-3)
        )
        ok = self.monitor.checks_passed()
        if inject == "param_at_rest":
            self._flip(self.params)
        return ok

    def _flip(self, tensors: list[Any]) -> None:
        t = self.rng.choice(tensors)
        index = self.rng.randrange(t.numel())
        self.last_flip = (index, *flip_bit(t, index, self.rng.choice(self.bits)))

    def snapshot(self) -> tuple[dict[str, Any], dict[str, Any], int]:
        return copy.deepcopy(self.model.state_dict()), copy.deepcopy(self.opt.state_dict()), self.ctx.step

    def restore(self, snap: tuple[dict[str, Any], dict[str, Any], int]) -> None:
        self.model.load_state_dict(snap[0])
        self.opt.load_state_dict(snap[1])
        self.ctx.step = snap[2]
        self.monitor.reset_after_restore()
        self.monitor.preflight(self.ctx)


def run(
    *,
    flips: int,
    clean_steps: int,
    seed: int = 0,
    tier2_interval: int = 20,
    sdc_interval: int = 10,
    bits: tuple[int, ...] = (30,),
    warmup: int = 40,
) -> HarnessResult:
    t0 = time.perf_counter()
    torch.set_num_threads(1)
    h = Harness(seed=seed, sdc_interval=sdc_interval, tier2_interval=tier2_interval, bits=bits)
    res = HarnessResult()
    h.monitor.preflight(h.ctx)
    for _ in range(warmup):
        h.step()
    # Clean run: nothing injected; any SDC verdict or failed check is a false positive.
    for _ in range(clean_steps):
        try:
            ok = h.step()
        except SDCDetected:
            res.clean_false_sdc += 1
            ok = False
        res.clean_failed_checks += not ok
    res.clean_steps = clean_steps
    # Align to a tier-2 boundary and keep that checkpoint as the trials' clean start.
    while h.ctx.step % tier2_interval:
        h.step()
    snap = h.snapshot()
    for i in range(flips):
        h.restore(snap)
        target = TARGETS[i % len(TARGETS)]
        at = h.rng.randrange(1, tier2_interval + 1)  # steps after the checkpoint
        caught, confirmed, where = False, False, ""
        for k in range(1, tier2_interval + 1):
            try:
                ok = h.step(target if k == at else None)
            except SDCDetected as exc:
                caught, confirmed, where = True, True, str(exc).split(":")[0]
                res.latency_steps.append(k - at)
                break
            if not ok and k >= at:
                caught, where = True, "failed_check"
                res.latency_steps.append(k - at)
                break
            res.steps_run += 1
        if not caught and at == tier2_interval and target == "param_at_rest":
            # Flipped after the boundary's checks: the next step's checks run before the next
            # checkpoint; give it that step.
            try:
                caught = not h.step()
            except SDCDetected as exc:
                caught, confirmed, where = True, True, str(exc).split(":")[0]
        res.flips += 1
        res.caught += caught
        res.confirmed += confirmed
        row = res.by_target.setdefault(target, [0, 0])
        row[0] += 1
        row[1] += caught
        if caught:
            res.by_check[where] += 1
        else:
            _idx, before, after = h.last_flip
            res.missed.append({"target": target, "step_offset": at, "before": before, "after": after})
    res.wall_s = time.perf_counter() - t0
    return res
