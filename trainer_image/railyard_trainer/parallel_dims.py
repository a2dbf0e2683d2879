"""Parallel dimensions (pp x dp x tp) that validate themselves, and the device mesh built from them.

The mesh order is ``("pp", "dp", "tp")`` with tp innermost, so
``rank == (pp * dp_size + dp) * tp_size + tp``: the same convention as the operator's rank table
(``railyard.protocol.ranktable``); the arithmetic and its validation are
:mod:`railyard.protocol.mesh`, shared with the operator. Validation is torch-free; only :meth:`ParallelDims.build_mesh`
imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from railyard.protocol.mesh import (
    MESH_DIM_NAMES,
    check_mesh,
    derive_data_parallel,
    mesh_coordinates,
    mesh_rank,
)
from railyard_trainer.config import ConfigError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


@dataclass(frozen=True)
class ParallelDims:
    """The trainer's view of the mesh; the rules are :mod:`railyard.protocol.mesh`'s."""

    pp: int
    dp: int
    tp: int
    world_size: int
    procs_per_node: int

    def __post_init__(self) -> None:
        if self.dp < -1:
            raise ConfigError([f"dp: {self.dp} must be at least 1 (or -1/0 to derive it)"])
        if self.dp in (-1, 0) and self.pp >= 1 and self.tp >= 1:
            dp = derive_data_parallel(self.world_size, self.pp, self.tp)
            if not dp:
                raise ConfigError([f"parallelism: world size {self.world_size} is not divisible by pipeline x tensor = {self.pp * self.tp}; choose sizes whose product divides the number of processes"])
            # Frozen dataclass: deriving dp is the one mutation, done before anyone sees the object.
            object.__setattr__(self, "dp", dp)
        problems = check_mesh(world_size=self.world_size, procs_per_node=self.procs_per_node, pp=self.pp, dp=max(self.dp, 1) if self.dp in (-1, 0) else self.dp, tp=self.tp)
        if problems:
            raise ConfigError(problems)

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) of a global rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside [0, {self.world_size})")
        return mesh_coordinates(rank, self.dp, self.tp)

    def rank_of(self, pp: int, dp: int, tp: int) -> int:
        return mesh_rank(pp, dp, tp, self.dp, self.tp)

    def build_mesh(self, device_type: str) -> DeviceMesh:
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, (self.pp, self.dp, self.tp), mesh_dim_names=MESH_DIM_NAMES)
