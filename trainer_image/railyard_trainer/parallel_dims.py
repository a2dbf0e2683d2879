"""Parallel dimensions (pp x dp x tp) that validate themselves, and the device mesh built from them.

The mesh order is ``("pp", "dp", "tp")`` with tp innermost, so
``rank == (pp * dp_size + dp) * tp_size + tp``: the same convention as the operator's rank table
(``railyard.protocol.ranktable``); the arithmetic and its validation are
:mod:`railyard.protocol.mesh`, shared with the operator. Validation is torch-free; only :meth:`ParallelDims.build_mesh`
imports torch.

HSDP (``dp_replicas > 1``, TorchTitan's ``dp_replicate`` x ``dp_shard``): the data-parallel
dimension is split into ``("dp_replicate", "dp_shard")`` with ``dp == replica * dp_shard +
shard``, so the rank order and the rank table are unchanged; the mesh also carries their
flattening under the name ``"dp"`` (batches are split over it).
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

HSDP_MESH_DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True)
class ParallelDims:
    """The trainer's view of the mesh; the rules are :mod:`railyard.protocol.mesh`'s."""

    pp: int
    dp: int
    tp: int
    world_size: int
    procs_per_node: int
    #: HSDP replica groups (1: plain FSDP over all dp ranks).
    dp_replicas: int = 1

    def __post_init__(self) -> None:
        if self.dp < -1:
            raise ConfigError([f"dp: {self.dp} must be at least 1 (or -1/0 to derive it)"])
        if self.dp in (-1, 0) and self.pp >= 1 and self.tp >= 1:
            dp = derive_data_parallel(self.world_size, self.pp, self.tp)
            if not dp:
                raise ConfigError(
                    [
                        f"parallelism: world size {self.world_size} is not divisible by pipeline x tensor = "
                        f"{self.pp * self.tp}; choose sizes whose product divides the number of processes"
                    ]
                )
            # Frozen dataclass: deriving dp is the one mutation, done before anyone sees the object.
            object.__setattr__(self, "dp", dp)
        problems = check_mesh(
            world_size=self.world_size,
            procs_per_node=self.procs_per_node,
            pp=self.pp,
            dp=max(self.dp, 1) if self.dp in (-1, 0) else self.dp,
            tp=self.tp,
        )
        if self.dp_replicas < 1 or self.dp % self.dp_replicas:
            problems.append(
                f"parallelism.dataReplicas: {self.dp_replicas} does not divide the data-parallel size {self.dp}"
            )
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

    @property
    def hsdp_enabled(self) -> bool:
        return self.dp_replicas > 1

    @property
    def dp_shard(self) -> int:
        """Ranks each replica group shards the model over (dp without HSDP)."""
        return self.dp // self.dp_replicas

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) of a global rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside [0, {self.world_size})")
        return mesh_coordinates(rank, self.dp, self.tp)

    def rank_of(self, pp: int, dp: int, tp: int) -> int:
        return mesh_rank(pp, dp, tp, self.dp, self.tp)

    def build_mesh(self, device_type: str) -> DeviceMesh:
        from torch.distributed.device_mesh import init_device_mesh

        if not self.hsdp_enabled:
            return init_device_mesh(device_type, (self.pp, self.dp, self.tp), mesh_dim_names=MESH_DIM_NAMES)
        mesh = init_device_mesh(
            device_type, (self.pp, self.dp_replicas, self.dp_shard, self.tp), mesh_dim_names=HSDP_MESH_DIM_NAMES
        )
        mesh["dp_replicate", "dp_shard"]._flatten("dp")
        return mesh

    def mesh_coordinates(self, mesh: DeviceMesh) -> tuple[int, int, int]:
        """This rank's (pp, dp, tp) on a mesh from :meth:`build_mesh` (HSDP dims combined)."""
        c = tuple(int(x) for x in mesh.get_coordinate() or ())
        if len(c) == 4:
            return c[0], c[1] * self.dp_shard + c[2], c[3]
        return c[0], c[1], c[2]
