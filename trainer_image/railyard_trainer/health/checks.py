"""SDC checks on tensors: bitwise checksums, the known-answer test, replica comparison, the
parameter magnitude guard and votes. Each check is a small function usable without a process
group; :mod:`railyard_trainer.health.monitor` wires them to the train loop's hooks.

The scheme (docs/health.md has the reasoning):

- **Known-answer test (KAT)** before the first step and every N steps: a fixed-seed matrix
  product on the rank's device; its bitwise checksum must match every other rank's (same
  hardware, same kernels) and the rank's own first result. The majority names a bad rank.
- **Cross-replica checksum** every N steps: whatever should be bit-identical across a mesh
  dimension (plain tensors under data parallelism, DTensor shards with a Replicate placement
  on that dimension: HSDP replicas, TP-replicated norms) is checksummed per dimension and
  compared across the dimension's group; the majority names the odd rank.
- **State guard** every step: the bit sums of the parameters after the optimizer step must
  be unchanged when the next backward is done (nothing may touch them at rest); exact.
- **Magnitude guard** every step: an optimizer step moves a parameter by about the learning
  rate; a flipped high exponent bit moves it by 2^64 or more, or makes it non-finite. The
  per-tensor max |p| before and after the step bounds what arithmetic can do.
- **Spike + replay**: see :mod:`railyard_trainer.health.spike` and the monitor.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence

import torch

_INT_VIEW = {
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.int64: torch.int64,
    torch.int32: torch.int32,
}


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The rank-local data of a tensor (DTensor shard or the tensor itself)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


@torch.no_grad()
def tensor_checksum(tensors: Iterable[torch.Tensor]) -> int:
    """Exact checksum of the bits: sum of the elements' bit patterns as int64, position-weighted.

    Any single bit flip changes it (a flip of bit k changes the sum by +-2^k, never 0 mod 2^64);
    the weighting by (index mod 8191 + 1) also catches swapped elements. Stays on the device:
    one reduction per tensor, one host transfer at the end.
    """
    total: torch.Tensor | None = None
    for t in tensors:
        x = local_tensor(t).detach()
        if x.numel() == 0:
            continue
        iv = _INT_VIEW.get(x.dtype)
        bits = x.contiguous().view(iv) if iv is not None else x.contiguous().view(torch.uint8)
        bits64 = bits.reshape(-1).to(torch.int64)
        weights = torch.arange(bits64.numel(), device=bits64.device, dtype=torch.int64).remainder_(8191).add_(1)
        s = (bits64 * weights).sum()
        total = s if total is None else total + s
    return int(total.item()) if total is not None else 0


@torch.no_grad()
def bit_sums(tensors: Sequence[torch.Tensor]) -> list[int]:
    """Per tensor, the sum of its elements' bit patterns in int64: exact for any single bit
    flip (it moves the sum by +-2^k), one read of the data, no copies. For data at rest."""
    sums: list[torch.Tensor] = []
    for t in tensors:
        x = local_tensor(t).detach()
        iv = _INT_VIEW.get(x.dtype)
        if iv is None or x.numel() == 0:
            sums.append(torch.zeros((), dtype=torch.int64, device=x.device))
            continue
        sums.append(x.view(iv).sum(dtype=torch.int64))
    return _to_host_ints(sums)


def _to_host_ints(values: list[torch.Tensor]) -> list[int]:
    """One device-to-host transfer per device, not one per tensor (each would be a sync)."""
    out: list[int] = [0] * len(values)
    by_dev: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        by_dev.setdefault(v.device, []).append(i)
    for idx in by_dev.values():
        host = torch.stack([values[i] for i in idx]).cpu().tolist()
        for i, v in zip(idx, host, strict=True):
            out[i] = int(v)
    return out


@torch.no_grad()
def known_answer_checksum(device: torch.device, *, n: int = 256, rounds: int = 4, seed: int = 20240229) -> int:
    """Bitwise digest of a fixed-seed chain of matrix products on ``device`` (float32)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    a = (torch.rand(n, n, generator=g) - 0.5).to(device)
    b = (torch.rand(n, n, generator=g) - 0.5).to(device)
    for _ in range(rounds):
        a = torch.tanh(a @ b)
    raw = a.contiguous().view(torch.int32).cpu().numpy().tobytes()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big", signed=True)


def odd_ones_out(values: Sequence[int]) -> tuple[list[int], bool]:
    """Indices whose value differs from the strict majority, and whether a majority exists.

    With no strict majority (e.g. two replicas that disagree) nobody can be named.
    """
    if not values:
        return [], True
    value, count = Counter(values).most_common(1)[0]
    if count * 2 <= len(values):
        return [i for i in range(len(values))], False
    return [i for i, v in enumerate(values) if v != value], True


@torch.no_grad()
def max_abs_per_tensor(tensors: Sequence[torch.Tensor]) -> list[float]:
    """max |x| per tensor (rank-local data), non-finite preserved; one host transfer."""
    locs = [local_tensor(t).detach() for t in tensors]
    vals = [x.abs().amax().float() if x.numel() else torch.zeros((), device=x.device) for x in locs]
    out: list[float] = [0.0] * len(vals)
    by_dev: dict[torch.device, list[int]] = {}
    for i, v in enumerate(vals):
        by_dev.setdefault(v.device, []).append(i)
    for idx in by_dev.values():
        for i, v in zip(idx, torch.stack([vals[i] for i in idx]).cpu().tolist(), strict=True):
            out[i] = float(v)
    return out


def magnitude_jumps(
    before: Sequence[float], after: Sequence[float], *, factor: float = 64.0, margin: float = 1.0
) -> list[int]:
    """Indices where max |p| became non-finite or grew beyond ``factor x before + margin``.

    An optimizer step changes each element by roughly the learning rate (Adam's update is
    bounded by lr x a small constant), so growth by 64x plus one unit is not arithmetic; a
    flipped high exponent bit multiplies by 2^64 or more.
    """
    out = []
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        if a != a or a in (float("inf"), float("-inf")) or a > factor * b + margin:
            out.append(i)
    return out
