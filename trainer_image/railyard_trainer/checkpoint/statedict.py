"""State-dict helpers of the checkpoint manager: the tensor state of a rank (model, optimizer,
RNG) and its way back, per-rank DCP metadata merged into one checkpoint, the files a load
reads, and the tree walks the deferred capture uses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from railyard_trainer.checkpoint.shardio import MergedShardReader
from railyard_trainer.hooks import TrainContext
from railyard_trainer.train_state import rng_key, rng_state, set_rng_state

_FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


_NONSTRICT = StateDictOptions(flatten_optimizer_state_dict=True, strict=False)


def _uses_default_state_dict(opt: torch.optim.Optimizer) -> bool:
    return type(opt).state_dict is torch.optim.Optimizer.state_dict


def _optim_holder(ctx: TrainContext) -> nn.Module:
    """The module the optimizer's parameters belong to (all parts when there are several)."""
    return ctx.model_parts[0] if len(ctx.model_parts) == 1 else nn.ModuleList(ctx.model_parts)


def tensor_state(ctx: TrainContext) -> dict[str, Any]:
    """Model and optimizer state keyed by parameter name (DCP reshards by name), and this
    rank's RNG state under a key only the same rank of the same layout has.

    ``ctx.extra["state_dict"]`` (a callable) gives the state instead: a program's own state
    dict as DCP planned it (the SDK's StorageWriter, railyard_trainer/sdk/dcp.py)."""
    provided = ctx.extra.get("state_dict")
    if callable(provided):
        return dict(provided())
    model: dict[str, Any] = {}
    for m in ctx.model_parts:
        model.update(get_model_state_dict(m))
    state: dict[str, Any] = {"model": model, "rng": {rng_key(ctx): rng_state(ctx)}}
    opt = ctx.optimizer
    if opt is not None:
        if _uses_default_state_dict(opt):
            state["optim"] = get_optimizer_state_dict(_optim_holder(ctx), opt, options=_FLAT)
        else:
            # The trainer's Optimizers container already gives a flat, name-keyed dict.
            state["optim"] = opt.state_dict()
    return state


def apply_tensor_state(ctx: TrainContext, state: Mapping[str, Any]) -> None:
    rng = (state.get("rng") or {}).get(rng_key(ctx))
    if rng is not None:
        set_rng_state(ctx, rng)
    for m in ctx.model_parts:
        set_model_state_dict(m, state["model"], options=StateDictOptions(strict=len(ctx.model_parts) == 1))
    opt = ctx.optimizer
    if opt is not None and "optim" in state:
        if _uses_default_state_dict(opt):
            set_optimizer_state_dict(_optim_holder(ctx), opt, optim_state_dict=state["optim"], options=_FLAT)
        else:
            opt.load_state_dict(dict(state["optim"]))


def _keep_saved_rng(template: dict[str, Any], metadata: Metadata) -> None:
    """Drop the RNG entry from a load template when the checkpoint has none for this rank
    (another layout, or written before RNG states were saved): the rank keeps its own stream."""
    keys = list(template.get("rng") or {})
    if not any(k.startswith(f"rng.{key}.") for key in keys for k in metadata.state_dict_metadata):
        template.pop("rng", None)


def merge_rank_metadata(metas: Mapping[str, Metadata]) -> Metadata:
    """Per-rank DCP checkpoints (``rank-RRRRR/`` -> its metadata) as one checkpoint: every
    tensor's chunks from all ranks (a replicated chunk once), storage paths prefixed with the
    rank's folder, non-tensor values from the first rank that has them."""
    state: dict[str, Any] = {}
    storage: dict[MetadataIndex, Any] = {}
    planner: dict[str, Any] = {}
    for folder in sorted(metas):
        m = metas[folder]
        for fqn, md in m.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                cur = state.setdefault(fqn, TensorStorageMetadata(properties=md.properties, size=md.size, chunks=[]))
                have = {tuple(c.offsets) for c in cur.chunks}
                for c in md.chunks:
                    if tuple(c.offsets) not in have:
                        cur.chunks.append(c)
                        have.add(tuple(c.offsets))
            else:
                state.setdefault(fqn, md)
        for idx, info in (m.storage_data or {}).items():
            key = MetadataIndex(idx.fqn, idx.offset)
            if key not in storage:
                storage[key] = replace(info, relative_path=f"{folder}/{info.relative_path}")
        for k, v in (m.planner_data or {}).items():
            planner.setdefault(k, v)
    return Metadata(state_dict_metadata=state, planner_data=planner, storage_data=storage)


def files_needed(template: dict[str, Any], metadata: Metadata) -> set[str]:
    """Relative paths of the files a load of ``template`` from ``metadata`` reads."""
    planner = DefaultLoadPlanner()
    planner.set_up_planner(template, metadata, is_coordinator=False)
    plan = planner.create_local_plan()
    storage = metadata.storage_data
    return {storage[MetadataIndex(i.storage_index.fqn, i.storage_index.offset)].relative_path for i in plan.items}


#: Reads a node tier's step directory through merged per-rank metadata (export uses it).
_MergedReader = MergedShardReader


def _jsonable(value: Any) -> Any:
    """Round-trip through JSON (tensors to lists) so the manifest stays plain JSON."""

    def default(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            return o.tolist()
        if hasattr(o, "item"):
            return o.item()
        raise TypeError(f"{type(o).__name__} is not JSON serializable")

    return json.loads(json.dumps(value, default=default))


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (no autograd), or the tensor."""
    return t._local_tensor if isinstance(t, DTensor) else t


def _defer(src: Any, buf: Any, live: set[int] | None, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """``src`` with every tensor leaf whose storage is in ``live`` (None: every leaf) replaced
    by the matching leaf of ``buf``, the (source, buffer) local shards appended to ``pairs``."""
    if isinstance(src, torch.Tensor) and isinstance(buf, torch.Tensor):
        s, b = _local(src), _local(buf)
        if (live is None or s.untyped_storage().data_ptr() in live) and s.shape == b.shape and s.dtype == b.dtype:
            pairs.append((s, b))
            return buf
        return src
    if isinstance(src, Mapping) and isinstance(buf, Mapping):
        return {k: _defer(v, buf[k], live, pairs) if k in buf else v for k, v in src.items()}
    if isinstance(src, list | tuple) and isinstance(buf, list | tuple) and len(src) == len(buf):
        out = [_defer(v, b, live, pairs) for v, b in zip(src, buf, strict=True)]
        return tuple(out) if isinstance(src, tuple) else out
    return src


def _tensors(state: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    if isinstance(state, torch.Tensor):
        out.append(state)
    elif isinstance(state, Mapping):
        for v in state.values():
            out.extend(_tensors(v))
    elif isinstance(state, list | tuple):
        for v in state:
            out.extend(_tensors(v))
    return out
