"""DCP's save planning, done once per state structure instead of once per save.

A node tier saves the same snapshot buffers every time (``CheckpointManager._snapshot`` copies
the live state into host buffers allocated once). DCP's :class:`DefaultSavePlanner` nevertheless
works out the whole plan again on every save: every DTensor's local shape and global offset, the
write items, the deduplicated global plan and its metadata, and one ``torch.save`` zip per
non-tensor item (with a flattened optimizer state that is one per parameter and per group
setting: about 800 for the ``small`` preset). On this machine that was about a third of the
checkpoint writer's CPU per save, on the two cores training needs.

:class:`ReusedSavePlanner` keeps what depends only on the structure:

- the local plan, and the global plan and metadata made from it, while the flattened state has
  the same keys, the same tensor objects (held here, so an id cannot be reused by another
  tensor) and the same types elsewhere;
- each tensor item's resolved shard (the same tensor object, so the same memory);
- each non-tensor item's serialised bytes, while its value is the same (compared exactly:
  type, and a float's bits). The learning rate changes every step and is serialised again.

Anything else (new optimizer state, another state dict, a value that is not a plain immutable
scalar) is planned or serialised as DCP does it. The files written are the same as with
:class:`DefaultSavePlanner`. For one rank's own checkpoint (``dcp.save(no_dist=True)``): the
global plan it keeps is the plan of that one rank.
"""

from __future__ import annotations

import dataclasses
import io
import struct
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, WriteItem, WriteItemType

#: Types whose value is compared exactly for reuse of its serialised bytes.
_SCALARS: tuple[type, ...] = (bool, int, str, bytes, type(None))


def frozen_value(obj: Any) -> Any:
    """A hashable key equal for two values exactly when they serialise the same, or None when
    ``obj`` is not a plain immutable value (then it is serialised every time).

    ``0.0`` and ``-0.0`` compare equal in Python but are different bytes, and ``1 == True``:
    the key holds the type and, for a float, its bits."""
    t = type(obj)
    if t is float:
        return (t, struct.pack("<d", obj))
    if t in _SCALARS:
        return (t, obj)
    if t is tuple:
        parts = tuple(frozen_value(x) for x in obj)
        return None if any(p is None for p in parts) else (t, parts)
    return None


def _structure(state: dict[str, Any], is_coordinator: bool) -> tuple[Any, ...]:
    return (is_coordinator, *((k, id(v)) if isinstance(v, torch.Tensor) else (k, type(v)) for k, v in state.items()))


class ReusedSavePlanner(DefaultSavePlanner):
    """:class:`DefaultSavePlanner` that reuses its plans and serialised objects across saves of
    the same structure (see the module docstring). One instance per writer thread."""

    def __init__(self) -> None:
        super().__init__()
        self._key: tuple[Any, ...] | None = None
        #: The tensors of the state the cached plans were made for: alive, so ids stay unique.
        self._held: list[torch.Tensor] = []
        self._local: SavePlan | None = None
        self._global: tuple[SavePlan, list[SavePlan], Metadata] | None = None
        self._shards: dict[MetadataIndex, Any] = {}
        self._blobs: dict[str, tuple[Any, bytes]] = {}
        #: Plans made (not reused); tests and the bench read it.
        self.plans_made = 0

    def set_up_planner(
        self, state_dict: dict[str, Any], storage_meta: StorageMeta | None = None, is_coordinator: bool = False,
    ) -> None:
        super().set_up_planner(state_dict, storage_meta, is_coordinator)
        key = _structure(self.state_dict, is_coordinator)
        if key != self._key:
            self._key = key
            self._held = [v for v in self.state_dict.values() if isinstance(v, torch.Tensor)]
            self._local, self._global = None, None
            self._shards = {}

    def create_local_plan(self) -> SavePlan:
        if self._local is None:
            self._local = super().create_local_plan()
            self.plans_made += 1
        self.plan = self._local
        return self._local

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        cached = self._global
        if cached is None or len(all_plans) != 1 or all_plans[0] is not cached[0]:
            plans, metadata = super().create_global_plan(all_plans)
            cached = (all_plans[0], plans, metadata) if len(all_plans) == 1 else None
            self._global = cached
            return plans, metadata
        _, plans, metadata = cached
        # The storage writer fills in the metadata's storage fields: a copy each save.
        self.global_plan, self.metadata = plans, dataclasses.replace(metadata)
        return plans, self.metadata

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        if write_item.type != WriteItemType.BYTE_IO:
            shard = self._shards.get(write_item.index)
            if shard is None:
                shard = self._shards[write_item.index] = self.lookup_object(write_item.index)
            return shard  # type: ignore[no-any-return]
        obj = self.lookup_object(write_item.index)
        key = frozen_value(obj)
        fqn = write_item.index.fqn
        hit = self._blobs.get(fqn)
        if key is not None and hit is not None and hit[0] == key:
            return io.BytesIO(hit[1])
        out = self.transform_object(write_item, obj)
        if key is not None:
            self._blobs[fqn] = (key, out.getvalue())
        return out  # type: ignore[no-any-return]
