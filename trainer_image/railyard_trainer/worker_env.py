"""What the launcher tells each worker process, through its environment (torch-free)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from railyard_trainer.config import ConfigError


@dataclass(frozen=True)
class WorkerEnv:
    rank: int
    local_rank: int
    world_size: int
    procs_per_node: int
    #: (pp, dp, tp) sizes, from the rank table.
    mesh_shape: tuple[int, int, int]
    #: This rank's (pp, dp, tp) coordinates, from the rank table.
    coords: tuple[int, int, int]
    config_path: str
    node: str = ""
    pod_index: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerEnv:
        e = os.environ if env is None else env
        try:
            return cls(
                rank=int(e["RANK"]),
                local_rank=int(e["LOCAL_RANK"]),
                world_size=int(e["WORLD_SIZE"]),
                procs_per_node=int(e["LOCAL_WORLD_SIZE"]),
                mesh_shape=_triple(e["RAILYARD_MESH_SHAPE"]),
                coords=_triple(e["RAILYARD_MESH_COORDS"]),
                config_path=e["RAILYARD_CONFIG"],
                node=e.get("RAILYARD_NODE_NAME", ""),
                pod_index=int(e.get("RAILYARD_POD_INDEX", "0")),
            )
        except (KeyError, ValueError) as exc:
            raise ConfigError([f"worker environment: {exc!r}; start workers with railyard-train, not directly"]) from exc

    def to_env(self) -> dict[str, str]:
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.procs_per_node),
            "RAILYARD_MESH_SHAPE": ",".join(map(str, self.mesh_shape)),
            "RAILYARD_MESH_COORDS": ",".join(map(str, self.coords)),
            "RAILYARD_CONFIG": self.config_path,
            "RAILYARD_NODE_NAME": self.node,
            "RAILYARD_POD_INDEX": str(self.pod_index),
        }


def _triple(s: str) -> tuple[int, int, int]:
    a, b, c = (int(x) for x in s.split(","))
    return a, b, c
