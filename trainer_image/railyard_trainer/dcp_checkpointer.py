"""The plain fallback checkpointer: synchronous DCP save and load to one directory.

Used when ``railyard_trainer.checkpoint`` (tiered, verified checkpoints) is not installed or is
switched off (``RAILYARD_PLAIN_CHECKPOINT=1``). Layout: ``<path>/<job>/step-NNNNNNNN/`` with
DCP's files plus ``COMPLETE``, written after every rank finished; a directory without it is an
interrupted save and is ignored. Configuration (``checkpoint`` in config.json):
``path`` (default ``$RAILYARD_CHECKPOINT_SHARED_DIR``; no path: checkpoints off) and
``intervalSteps`` (default 0: only after the last step).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystemReader

from railyard.protocol import podenv
from railyard.protocol.manifest import step_dirname
from railyard_trainer.config import TrainerConfig
from railyard_trainer.hooks import RestoreResult, TrainContext
from railyard_trainer.train_state import app_state, rng_key

COMPLETE = "COMPLETE"


class DCPCheckpointer:
    def __init__(self, root: Path | None, *, interval: int, last_step: int, restore_step: int | None = None) -> None:
        self.root = root
        self.interval = interval
        self.last_step = last_step
        self.restore_step = restore_step
        self._saving = False
        self._last_saved = -1

    def _complete_steps(self) -> list[int]:
        if self.root is None or not self.root.is_dir():
            return []
        return sorted(int(d.name.split("-")[1]) for d in self.root.glob("step-*") if (d / COMPLETE).exists())

    def restore(self, ctx: TrainContext) -> RestoreResult | None:
        steps = self._complete_steps()
        if self.restore_step is not None:
            steps = [s for s in steps if s == self.restore_step]
        if not steps:
            return None
        assert self.root is not None
        path = self.root / step_dirname(steps[-1])
        t0 = time.monotonic()
        saved = FileSystemReader(path).read_metadata().state_dict_metadata
        # This rank's RNG state exists only in a checkpoint of the same layout.
        rng = any(k.startswith(f"rng.{rng_key(ctx)}.") for k in saved)
        dcp.load(app_state(ctx, rng=rng), checkpoint_id=str(path))  # type: ignore[attr-defined, unused-ignore]
        self._last_saved = ctx.step
        return RestoreResult(step=ctx.step, tier="dcp", duration_s=time.monotonic() - t0, detail=str(path))

    def due(self, step: int) -> bool:
        if self.root is None or step == self._last_saved:
            return False
        return step == self.last_step or (self.interval > 0 and step % self.interval == 0)

    def maybe_save(self, ctx: TrainContext, *, checks_passed: bool) -> None:
        if not self.due(ctx.step):
            return
        assert self.root is not None
        path = self.root / step_dirname(ctx.step)
        self._saving = True
        try:
            dcp.save(app_state(ctx), checkpoint_id=str(path))  # type: ignore[attr-defined, unused-ignore]
            dist.barrier()
            if dist.get_rank() == 0:
                (path / COMPLETE).write_text(f"checks_passed={checks_passed}\n")
            self._last_saved = ctx.step
        finally:
            self._saving = False

    def is_saving(self) -> bool:
        return self._saving

    def close(self) -> None:
        return None


def build_dcp_checkpointer(cfg: TrainerConfig) -> DCPCheckpointer:
    raw_path = cfg.checkpoint.get("path") or podenv.CHECKPOINT_SHARED_DIR.get(os.environ)
    root = Path(raw_path) / cfg.job if raw_path else None
    restore_step = None
    if cfg.restore and isinstance(cfg.restore.get("step"), int):
        restore_step = int(cfg.restore["step"])
    return DCPCheckpointer(
        root,
        interval=int(cfg.checkpoint.get("intervalSteps", 0)),
        last_step=cfg.trainer.steps,
        restore_step=restore_step,
    )
