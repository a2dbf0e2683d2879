"""Parallelize the LLaMA model in the proven order: tensor parallel, activation checkpointing,
torch.compile of each block (optional), FSDP2.

One keyword-only function for the model (TorchTitan's ``parallelize_llama`` shape). It works on
a whole model or on one pipeline stage of it (pieces that are ``None`` are skipped).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from railyard_trainer.model import Transformer
from railyard_trainer.parallel_dims import ParallelDims


def param_dtype_for(mixed_precision: str, device: torch.device) -> torch.dtype:
    """bf16 compute on GPUs ("auto"), fp32 on CPU (exact comparisons in tests)."""
    if mixed_precision == "bf16" or (mixed_precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return torch.float32


def parallelize_llama(
    model: Transformer,
    *,
    mesh: DeviceMesh,
    dims: ParallelDims,
    param_dtype: torch.dtype,
    activation_checkpointing: bool,
    cpu_offload: bool,
    compile_backend: str = "",
) -> Transformer:
    if dims.tp_enabled:
        apply_tp(model, mesh["tp"])
    if activation_checkpointing:
        apply_ac(model)
    if compile_backend:
        apply_compile(model, compile_backend)
    # FSDP also carries mixed precision and offload, so it is applied even with one dp rank then.
    if dims.dp_enabled or param_dtype != torch.float32 or cpu_offload:
        apply_fsdp(
            model,
            # HSDP: a 2-D (replicate, shard) mesh, so FSDP shards within a replica group and
            # all-reduces gradients across the groups (placements (Replicate(), Shard(0))).
            mesh["dp_replicate", "dp_shard"] if dims.hsdp_enabled else mesh["dp"],
            param_dtype=param_dtype,
            cpu_offload=cpu_offload,
            # With PP several microbatches pass through each block: keep it gathered between them.
            reshard_after_forward=not dims.pp_enabled,
        )
    return model


def apply_tp(model: Transformer, tp_mesh: DeviceMesh) -> None:
    """Megatron-style plan: column-wise q/k/v and w1/w3, row-wise wo and w2, one all-reduce each
    for attention and MLP. Embedding row-wise (vocab-sharded), output column-wise with the
    logits gathered for the loss."""
    top: dict[str, ColwiseParallel | RowwiseParallel] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if model.output is not None:
        top["output"] = ColwiseParallel(output_layouts=Replicate())
    if top:
        parallelize_module(model, tp_mesh, top)  # type: ignore[arg-type, unused-ignore]
    block_plan = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, block_plan)


def apply_ac(model: Transformer) -> None:
    """Recompute each block's activations in backward (full activation checkpointing)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for name, block in list(model.layers.named_children()):
        model.layers.register_module(name, checkpoint_wrapper(block, preserve_rng_state=False))


def apply_compile(model: Transformer, backend: str) -> None:
    """Compile each block's forward (after activation checkpointing, before FSDP, as TorchTitan
    does): the blocks are identical, so one compilation serves them all. Only ``forward`` is
    replaced, so FSDP's hooks, which run around it, stay outside the compiled code (TorchTitan
    gets the same by wrapping the block), and parameter names, hence checkpoints, do not change."""
    for block in model.layers.values():
        block.forward = torch.compile(block.forward, backend=backend)  # type: ignore[method-assign, unused-ignore]


def compile_backend_from_env(value: str | None) -> str:
    """``RAILYARD_COMPILE``: unset, empty or ``0`` = eager; ``1`` = inductor; otherwise the name
    of a torch.compile backend (``eager``, ``aot_eager``: cheap, for CPU tests)."""
    if value in (None, "", "0"):
        return ""
    return "inductor" if value == "1" else value


def apply_fsdp(
    model: nn.Module, dp_mesh: DeviceMesh, *, param_dtype: torch.dtype, cpu_offload: bool, reshard_after_forward: bool
) -> None:
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    layers = model.layers
    assert isinstance(layers, nn.ModuleDict)
    blocks = list(layers.values())
    for i, block in enumerate(blocks):
        # The last block's backward starts right after forward: resharding it would only re-gather.
        last = i == len(blocks) - 1
        fully_shard(
            block,
            mesh=dp_mesh,
            mp_policy=mp,
            offload_policy=offload,
            reshard_after_forward=reshard_after_forward and not last,
        )
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=reshard_after_forward)


def clean_fqn(name: str) -> str:
    """Parameter name as in the unwrapped model (activation checkpointing adds a prefix)."""
    return name.replace("_checkpoint_wrapped_module.", "")
