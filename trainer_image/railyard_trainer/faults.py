"""Fault injection for tests and demos: crash, hang, slow down, flip a bit, exit with a code.

Off by default; configured in ``trainer.faults`` (each fault names its rank, step and attempt,
so a restarted gang does not re-inject; with replica groups it may name its group). Every injection logs a ``{"event":
"fault"}`` line
first, so a test can tell an injected failure from a real one.

- ``crash``: raises at the start of step S -> the worker exits APPLICATION (1).
- ``exit``: exits with ``code`` at the start of step S (a process dying with a given status).
- ``hang``: stops making progress at the start of step S -> the watchdog exits 76.
- ``slow``: from step S the rank's device is ``factor`` times slower, as a throttled GPU is:
  its forward/backward takes ``factor`` times as long (a sleep of ``(factor - 1) x`` its time)
  and its speed probe does ``factor`` times the work (speed_probe.py), so the slow-down shows in
  the device time the straggler rule reads, whatever else the machine is doing.
- ``bitflip``: flips bit ``bit`` (default 30, the top exponent bit) of one element of a real tensor of the rank:
  ``target: grad`` right after backward at step S (before clipping and ``after_backward``),
  ``target: param`` right after the optimizer step at step S (before ``after_step`` and the
  checkpoint). Detecting it is the health package's job (exit SDC_DETECTED).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from railyard_trainer.config import FaultSpec
from railyard_trainer.parallelize import clean_fqn

_HIGH_BIT = {
    torch.float32: (torch.int32, 1 << 30),
    torch.bfloat16: (torch.int16, 1 << 14),
    torch.float16: (torch.int16, 1 << 14),
}


class InjectedCrash(RuntimeError):
    pass


class InjectedExit(SystemExit):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.exit_code = code


class FaultInjector:
    def __init__(
        self, faults: tuple[FaultSpec, ...], *, rank: int, log: Callable[..., None], group: int | None = None
    ) -> None:
        # ``group``: this replica group's index (faultTolerance ReplicaGroups); a fault that names
        # a group applies only there
        self.faults = [f for f in faults if f.rank == rank and (f.group is None or f.group == group)]
        self.rank = rank
        self.log = log

    def _due(self, kind: str, step: int, *, target: str | None = None) -> FaultSpec | None:
        for f in self.faults:
            if f.kind == kind and f.step == step and (target is None or f.target == target):
                return f
        return None

    def before_step(self, step: int) -> None:
        if f := self._due("crash", step):
            self.log("fault", rank=self.rank, kind="crash", step=step)
            raise InjectedCrash(f"injected crash on rank {self.rank} at step {step}")
        if f := self._due("exit", step):
            self.log("fault", rank=self.rank, kind="exit", step=step, code=f.code)
            raise InjectedExit(f.code)
        if f := self._due("slow", step):
            # Logged here, once: the slow-down applies to every later step.
            self.log("fault", rank=self.rank, kind="slow", step=step, factor=f.factor)
        if self._due("hang", step):
            self.log("fault", rank=self.rank, kind="hang", step=step)
            while True:
                time.sleep(1.0)

    def slow_factor(self, step: int) -> float:
        """How many times slower this rank's device is at ``step`` (1.0: not slowed)."""
        for f in self.faults:
            if f.kind == "slow" and step >= f.step:
                return f.factor
        return 1.0

    def slow_down(self, step: int, compute_s: float) -> float:
        """Sleep to stretch this step's forward/backward; returns the seconds slept."""
        for f in self.faults:
            if f.kind == "slow" and step >= f.step:
                extra = (f.factor - 1.0) * compute_s
                time.sleep(extra)
                return extra
        return 0.0

    def maybe_flip(self, step: int, target: str, parts: Sequence[nn.Module]) -> None:
        if self._due("bitflip", step, target=target) is None:
            return
        f = self._due("bitflip", step, target=target)
        assert f is not None
        name, tensor = _victim(parts, grad=target == "grad")
        index, before, after = flip_bit(tensor, f.bit)
        self.log(
            "fault",
            rank=self.rank,
            kind="bitflip",
            step=step,
            target=target,
            tensor=name,
            index=index,
            before=before,
            after=after,
        )


def _victim(parts: Sequence[nn.Module], *, grad: bool) -> tuple[str, torch.Tensor]:
    """The first block weight with a non-empty local shard (a real tensor the health checks see);
    embeddings come last because most of their gradient rows are exactly zero."""
    candidates = [(clean_fqn(n), p) for part in parts for n, p in part.named_parameters() if p.ndim >= 2]
    candidates.sort(key=lambda np_: not np_[0].startswith("layers."))
    for name, p in candidates:
        t: Any = p.grad if grad else p
        if t is None:
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        if local.numel() > 0:
            return name, local
    raise RuntimeError("bitflip: this rank holds no non-empty weight to corrupt")


@torch.no_grad()
def flip_bit(t: torch.Tensor, bit: int = 30) -> tuple[int, float, float]:
    """Flip bit ``bit`` (of the float32 layout; 16-bit floats: the same bit of their top 16)
    of the middle element of ``t`` in place."""
    int_dtype, _ = _HIGH_BIT[t.dtype]
    mask = 1 << (bit if int_dtype == torch.int32 else max(bit - 16, 0))
    flat = t.view(-1)
    index = flat.numel() // 2
    cell = flat[index : index + 1]
    before = float(cell.item())
    cell.view(int_dtype).bitwise_xor_(torch.tensor(mask, dtype=int_dtype, device=t.device))
    return index, before, float(cell.item())


def flip_high_bit(t: torch.Tensor) -> tuple[int, float, float]:
    """Flip the highest exponent bit of the middle element of ``t`` in place."""
    return flip_bit(t, 30)
