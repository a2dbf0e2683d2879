"""Gradient utilities shared by the train loop (train.py) and the SDC replay (health/monitor.py).

The replay must compute the gradient norm exactly as the loop does, so both import the one
function from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def clip_grad_norm_(
    parts: Sequence[torch.nn.Module], max_norm: float, *, pp_group: dist.ProcessGroup | None
) -> torch.Tensor:
    """Total L2 norm of all gradients of the model (all stages), then clip to ``max_norm``.

    Gradients are grouped by their DTensor mesh (FSDP-only, FSDP+TP, plain) because one foreach
    norm cannot mix meshes; each group's norm is made global with ``full_tensor()``, and with
    pipeline parallelism the squares are summed across stages.
    """
    params = [p for m in parts for p in m.parameters() if p.grad is not None]
    groups: dict[Any, list[torch.Tensor]] = {}
    for p in params:
        g = p.grad
        assert g is not None
        key = (g.device_mesh.mesh_dim_names, tuple(g.device_mesh.mesh.shape)) if isinstance(g, DTensor) else "local"
        groups.setdefault(key, []).append(g)
    device = params[0].device if params else torch.device("cpu")
    sq = torch.zeros((), dtype=torch.float32, device=device if device.type != "meta" else "cpu")
    for grads in groups.values():
        n = torch.nn.utils.get_total_norm(grads, 2.0, foreach=True)
        if isinstance(n, DTensor):
            n = n.full_tensor()
        sq = sq + n.float().to(sq.device) ** 2
    if pp_group is not None:
        dist.all_reduce(sq, group=pp_group)
    total = sq.sqrt()
    if max_norm > 0:
        coef = float((max_norm / (total + 1e-6)).clamp(max=1.0))
        # A non-finite norm leaves the gradients as they are: scaling by 0 (or NaN) would zero
        # every rank's gradients and erase which rank's share was corrupt, which the SDC replay
        # needs to name the bad rank. The step is not usable either way.
        if coef < 1.0 and bool(torch.isfinite(total)):
            for grads in groups.values():
                torch._foreach_mul_(grads, coef)
    return total
