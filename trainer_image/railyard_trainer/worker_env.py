"""What the launcher tells each worker process, through its environment (torch-free).

Every worker, the bundled trainer's or the user's program (``spec.trainer.program``), gets the
environment torchrun gives (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK``, ``GROUP_WORLD_SIZE``, ``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``ROLE_NAME``,
``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_RESTART_COUNT``, ``TORCHELASTIC_RUN_ID``) plus
Railyard's: its place in the rank table (``RAILYARD_MESH_SHAPE``, ``RAILYARD_MESH_COORDS``,
``RAILYARD_POD_INDEX``, ``RAILYARD_RANK_TABLE``) and ``RAILYARD_CONFIG``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from railyard.protocol import podenv
from railyard_trainer.config import ConfigError

_V = TypeVar("_V")


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
                mesh_shape=_required(podenv.MESH_SHAPE.get(e), podenv.MESH_SHAPE),
                coords=_required(podenv.MESH_COORDS.get(e), podenv.MESH_COORDS),
                config_path=_required(podenv.CONFIG.get(e) or None, podenv.CONFIG),
                node=podenv.NODE_NAME.get(e),
                pod_index=podenv.POD_INDEX.get(e) or 0,
            )
        except (KeyError, ValueError) as exc:
            raise ConfigError(
                [f"worker environment: {exc!r}; start workers with railyard-train, not directly"]
            ) from exc

    def to_env(self) -> dict[str, str]:
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.procs_per_node),
            # torchrun's names for the same: one role, one "node" (worker group) per pod
            "GROUP_RANK": str(self.pod_index),
            "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "ROLE_NAME": "default",
            podenv.MESH_SHAPE.name: podenv.MESH_SHAPE.render(self.mesh_shape),
            podenv.MESH_COORDS.name: podenv.MESH_COORDS.render(self.coords),
            podenv.CONFIG.name: self.config_path,
            podenv.NODE_NAME.name: self.node,
            podenv.POD_INDEX.name: podenv.POD_INDEX.render(self.pod_index),
        }


def torchrun_env(*, pods: int, attempt: int, run_id: str) -> dict[str, str]:
    """What torchrun gives every worker beyond the rank numbers, for this attempt: programs
    written for torchrun read them (a restarted gang is torchrun's restarted worker group)."""
    return {
        "GROUP_WORLD_SIZE": str(pods),
        "TORCHELASTIC_RESTART_COUNT": str(attempt),
        "TORCHELASTIC_RUN_ID": run_id,
        # the rendezvous store is rank 0's (env://), not an agent's
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        podenv.ATTEMPT.name: podenv.ATTEMPT.render(attempt),
    }


def _required(value: _V | None, var: podenv.EnvVar) -> _V:
    if value is None:
        raise KeyError(var.name)
    return value
