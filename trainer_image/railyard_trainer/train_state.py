"""Optimizer, learning-rate schedule and the trainer state a checkpoint holds.

Everything here is keyed by parameter *name* (FQN), never by position, so a checkpoint written
in one layout (say pp=2 x dp=2) loads into another (say dp=4): DCP reshards by name and global
shape. :func:`app_state` is the one dict a checkpointer hands to ``torch.distributed.checkpoint``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

from railyard_trainer.hooks import TrainContext

_FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


class Optimizers(torch.optim.Optimizer):
    """One AdamW per model part (pipeline stage) behind the Optimizer interface.

    ``state_dict()`` is flat and keyed by parameter name (``state.<fqn>.exp_avg``), merged over
    the parts, so it reshards across layouts. ``param_groups`` are the inner optimizers' groups,
    so a scheduler that sets ``lr`` on them reaches every part (also after a restore).
    """

    def __init__(
        self,
        parts: list[nn.Module],
        *,
        lr: float,
        weight_decay: float,
        betas: tuple[float, float] = (0.9, 0.95),
        fused: bool = False,
    ) -> None:
        self.parts = parts
        # fused (parameters on a GPU): one kernel, and no temporaries the size of the state
        # (foreach's sqrt of exp_avg_sq is one: 32 GB for 8b, which then no longer fits on
        # one H200). foreach elsewhere: what every CPU test's figures were made with.
        self.inner = [
            torch.optim.AdamW(_groups_by_mesh(m), lr=lr, betas=betas, eps=1e-8, weight_decay=weight_decay,
                              foreach=None if fused else True, fused=fused or None)
            for m in parts
        ]
        all_params = [p for m in parts for p in m.parameters()]
        super().__init__(all_params, {"lr": lr})
        self._ready = True

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        # Read through every time: an inner optimizer's load_state_dict replaces its group dicts.
        if not self.__dict__.get("_ready"):
            return self.__dict__.setdefault("_init_groups", [])  # type: ignore[no-any-return]
        return [g for o in self.inner for g in o.param_groups]

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        """Optimizer.__init__ assigns it; the inner optimizers own the groups."""

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for o in self.inner:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.inner:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for m, o in zip(self.parts, self.inner, strict=True):
            out.update(get_optimizer_state_dict(m, o, options=_FLAT))
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for m, o in zip(self.parts, self.inner, strict=True):
            set_optimizer_state_dict(m, o, optim_state_dict=state_dict, options=_FLAT)


def _groups_by_mesh(m: nn.Module) -> list[dict[str, Any]]:
    """One param group per DTensor mesh (and one for plain tensors): a foreach update cannot mix
    them, and with TP but no FSDP the norms stay plain while the projections are DTensors."""
    groups: dict[Any, list[nn.Parameter]] = {}
    for p in m.parameters():
        key = (p.device_mesh.mesh_dim_names, tuple(p.device_mesh.mesh.shape)) if isinstance(p, DTensor) else "local"
        groups.setdefault(key, []).append(p)
    return [{"params": ps} for ps in groups.values()]


class WarmupCosine:
    """Linear warmup to the peak, then cosine decay to 10% of it at the last step.

    Its state is one integer (the number of steps taken), so it is layout-independent.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        peak_lr: float,
        warmup_steps: int,
        total_steps: int,
        min_ratio: float = 0.1,
    ) -> None:
        self.optimizer = optimizer
        self.peak_lr = peak_lr
        self.warmup = warmup_steps
        self.total = total_steps
        self.min_ratio = min_ratio
        self.steps_taken = 0
        self._apply()

    def factor(self, i: int) -> float:
        """LR factor for the (i+1)-th optimizer step."""
        if i < self.warmup:
            return (i + 1) / (self.warmup + 1)
        progress = min(1.0, (i - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    def _apply(self) -> None:
        lr = self.peak_lr * self.factor(self.steps_taken)
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def get_last_lr(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def step(self) -> None:
        self.steps_taken += 1
        self._apply()

    def state_dict(self) -> dict[str, Any]:
        return {"steps_taken": self.steps_taken}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_taken = int(state["steps_taken"])
        self._apply()


class ModelState(Stateful):
    """The model parts' (sharded) state dicts, merged; names as in the unsplit model."""

    def __init__(self, parts: Iterable[nn.Module]) -> None:
        self.parts = list(parts)

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for m in self.parts:
            out.update(get_model_state_dict(m))
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for m in self.parts:
            set_model_state_dict(m, state_dict, options=StateDictOptions(strict=False))


class StepState(Stateful):
    def __init__(self, ctx: TrainContext) -> None:
        self.ctx = ctx

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.ctx.step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.ctx.step = int(state_dict["step"])


def rng_key(ctx: TrainContext) -> str:
    """The checkpoint key of this rank's RNG state: its coordinates *and* the layout, so the
    state is found again only by the same rank of the same layout (on another layout a rank's
    role differs, and it keeps the stream :func:`railyard_trainer.train.seed_rank_rng` gave it)."""
    dims = ctx.dims
    coordinates = getattr(dims, "coordinates", None)
    if not callable(coordinates):
        return f"rank{ctx.rank}-of-{ctx.world_size}"
    pp, dp, tp = coordinates(ctx.rank)
    replicas = int(getattr(dims, "dp_replicas", 1))
    hsdp = f"-hsdp{replicas}" if replicas > 1 else ""
    return f"pp{pp}-dp{dp}-tp{tp}-of-{dims.pp}x{dims.dp}x{dims.tp}{hsdp}"


def rng_state(ctx: TrainContext) -> dict[str, torch.Tensor]:
    """This rank's torch RNG states (CPU, and its CUDA device's), as uint8 tensors."""
    out = {"cpu": torch.get_rng_state()}
    device = ctx.extra.get("device")
    if isinstance(device, torch.device) and device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def set_rng_state(ctx: TrainContext, state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"].to(torch.uint8).cpu())
    device = ctx.extra.get("device")
    if "cuda" in state and isinstance(device, torch.device) and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].to(torch.uint8).cpu(), device)


class RNGState(Stateful):
    """One entry per rank and layout (see :func:`rng_key`)."""

    def __init__(self, ctx: TrainContext) -> None:
        self.ctx = ctx

    def state_dict(self) -> dict[str, Any]:
        return {rng_key(self.ctx): rng_state(self.ctx)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        mine = state_dict.get(rng_key(self.ctx))
        if mine is not None:
            set_rng_state(self.ctx, mine)


def app_state(ctx: TrainContext, *, rng: bool = True) -> dict[str, Stateful]:
    """What a checkpoint holds: model, optimizer, lr schedule, data position, step and this
    rank's RNG state (``rng=False`` leaves it out: a checkpoint of another layout has none for
    this rank).

    Pass it to ``torch.distributed.checkpoint.save``/``load`` as the state dict; every rank
    must call it (the optimizer state dict is gathered by name collectively).
    """
    out: dict[str, Stateful] = {
        "model": ModelState(ctx.model_parts),
        "optim": ctx.optimizer,
        "lr": ctx.lr_scheduler,
        "data": ctx.data,
        "trainer": StepState(ctx),
    }
    if rng:
        out["rng"] = RNGState(ctx)
    return out
