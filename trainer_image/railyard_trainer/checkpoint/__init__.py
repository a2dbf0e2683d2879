"""Tiered, asynchronous, verified checkpoints (memory with a neighbour replica, local, shared).

The train loop calls :func:`build_checkpointer` once (collectively, after the process group
and model exist) and uses the result through ``hooks.Checkpointer``: ``restore(ctx)`` before the
first step, ``maybe_save(ctx, checks_passed=...)`` after every optimizer step, ``is_saving()``
for heartbeats, ``close()`` at the end. ``drain_events()`` returns the
``protocol.heartbeat.CheckpointEvent`` list the health package forwards to the operator
(rank 0 only). ``restore`` raises :class:`NoVerifiedCheckpoint` (exit code
``NO_VERIFIED_CHECKPOINT``) when a checkpoint was required and none verifies. See
docs/checkpoints.md.

The manager (and torch) is imported on first use: settings and storage are torch-free, and the
SDK (railyard_trainer.sdk) reads the tiers' settings without importing torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from railyard.protocol import podenv
from railyard.protocol.manifest import TIERS
from railyard.protocol.ranktable import RankTable
from railyard.protocol.restore import PER_NODE_TIERS, Layout
from railyard_trainer.checkpoint.settings import (
    CheckpointConfigError,
    CheckpointSettings,
    TierSettings,
    parse_checkpoint_settings,
)
from railyard_trainer.checkpoint.storage import (
    DirectoryStorage,
    TierStorage,
    delete_job_checkpoints,
)
from railyard_trainer.hooks import TrainContext

if TYPE_CHECKING:
    from railyard_trainer.checkpoint.manager import CheckpointManager, SaveRecord
    from railyard_trainer.checkpoint.restore import NoVerifiedCheckpoint

_FROM_MANAGER = ("CheckpointManager", "SaveRecord")


def __getattr__(name: str) -> Any:
    if name in _FROM_MANAGER:
        from railyard_trainer.checkpoint import manager

        return getattr(manager, name)
    if name == "NoVerifiedCheckpoint":
        from railyard_trainer.checkpoint import restore

        return restore.NoVerifiedCheckpoint
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CheckpointConfigError",
    "CheckpointManager",
    "CheckpointSettings",
    "DirectoryStorage",
    "NoVerifiedCheckpoint",
    "SaveRecord",
    "TierSettings",
    "TierStorage",
    "build_checkpointer",
    "delete_job_checkpoints",
    "load_rank_table",
    "parse_checkpoint_settings",
]


def _section(config: Any, name: str) -> Any:
    if config is None:
        return None
    if isinstance(config, Mapping):
        return config.get(name)
    value = getattr(config, name, None)
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value


def load_rank_table(env: Mapping[str, str] | None = None) -> RankTable | None:
    """``RAILYARD_RANK_TABLE``: a path to the rank table JSON, or the JSON itself."""
    env = os.environ if env is None else env
    raw = podenv.RANK_TABLE.get(env)
    if not raw:
        return None
    text = raw if raw.startswith("{") else Path(raw).read_text()
    return RankTable.from_json(text)


def build_checkpointer(config: Any, ctx: TrainContext, **overrides: Any) -> CheckpointManager:
    """The tiered checkpointer for this rank. Collective: every rank calls it, same order.

    A ``checkpoint`` object in the flat form ``{"path", "intervalSteps"}`` (no tier objects)
    selects the plain DCP checkpointer (railyard_trainer.dcp_checkpointer) instead.

    ``config`` is the TrainerConfig (or the config.json dict): its ``checkpoint`` object and its
    ``restore`` hint are used; tier directories come from RAILYARD_CHECKPOINT_{MEMORY,LOCAL,
    SHARED}_DIR unless a tier object sets ``dir``. Replica peers come from the rank table
    (RAILYARD_RANK_TABLE, ``pods[].replica_peer``), else a ring over the pods.
    """
    from railyard_trainer.checkpoint.manager import CheckpointManager

    raw = _section(config, "checkpoint") or {}
    if isinstance(raw, Mapping) and "path" in raw and not any(t in raw for t in TIERS):
        # The flat form {"path", "intervalSteps"} selects the plain DCP checkpointer.
        from railyard_trainer.dcp_checkpointer import build_dcp_checkpointer

        return build_dcp_checkpointer(config)  # type: ignore[return-value]
    settings = parse_checkpoint_settings(raw, restore=_section(config, "restore"))
    storages = {
        t.name: DirectoryStorage(t.name, t.root, ctx.job, recycle=t.name in PER_NODE_TIERS)
        for t in settings.active_tiers
    }
    table = None
    try:
        table = load_rank_table()
    except (OSError, ValueError, json.JSONDecodeError):
        table = None
    peers = None
    if table is not None:
        peers = {p.pod_index: p.replica_peer for p in table.pods if p.replica_peer >= 0}
    dims = ctx.dims
    layout = Layout(int(getattr(dims, "pp", 1)), int(getattr(dims, "dp", ctx.world_size)), int(getattr(dims, "tp", 1)))
    trainer = _section(config, "trainer")
    steps = trainer.get("steps") if isinstance(trainer, Mapping) else None
    kwargs: dict[str, Any] = dict(
        storages=storages, job=ctx.job, attempt=ctx.attempt, layout=layout,
        pod_index=ctx.pod_index, local_rank=ctx.local_rank, replica_peers=peers,
        final_step=steps if isinstance(steps, int) else None,
    )
    kwargs.update(overrides)
    return CheckpointManager(settings, **kwargs)
