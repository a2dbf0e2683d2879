"""Checkpoints through Railyard's tiers for any program: :class:`Checkpointer`, the SDK's
:class:`railyard_trainer.sdk.tiers.Checkpoints` (the bundled trainer's facade) over a program's
own model and optimizer, on the process's session.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from railyard_trainer.sdk.session import RestorePoint


class Checkpointer:
    """Save and restore a program's model, optimizer and the rest through Railyard's tiers.

    ::

        ckpt = railyard.Checkpointer(model, optimizer, lr_scheduler=sched)
        start = ckpt.restore()          # collective; None on a fresh start, else a RestorePoint
        for step in range((start.step if start else 0) + 1, steps + 1):
            ...
            ckpt.maybe_save(step)       # saves when a tier is due; writes in the background
        railyard.close()                # waits for saves in flight

    ``model``: a module or a list of modules (pipeline stages); its state dict is keyed by
    parameter name (``torch.distributed.checkpoint.state_dict``), so FSDP2 and DTensor models
    work and the shared tier reshards onto another world size. ``optimizer``: a
    ``torch.optim.Optimizer`` over those parameters. ``lr_scheduler`` and ``data``: anything with
    ``state_dict()``/``load_state_dict()``; their state goes into the manifest, so it must be
    JSON (a step counter, a sampler position). Every rank's torch RNG state is saved too.
    ``total_steps``: every tier also saves at that step. Construction is collective (the tiers
    get their own process group): call it on every rank after ``init_process_group``.
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any = None,
        *,
        lr_scheduler: Any = None,
        data: Any = None,
        total_steps: int | None = None,
    ) -> None:
        from railyard_trainer.sdk import session

        self.session = session()
        parts: Sequence[Any] = model if isinstance(model, list | tuple) else [model]
        self.ctx = self.session.train_context(
            model_parts=list(parts), optimizer=optimizer, lr_scheduler=lr_scheduler, data=data
        )
        self.tiers = self.session.checkpoints(self.ctx, final_step=total_steps)

    @property
    def step(self) -> int:
        """The step of the state held: the restored one after :meth:`restore`, else the last saved."""
        return self.ctx.step

    def restore(self) -> RestorePoint | None:
        """Load the newest complete, verified, SDC-clean checkpoint of this job (fastest tier
        first; a lost node's shards from its neighbour's replica). Collective. None: nothing
        to restore (a fresh start). Raises ``NoVerifiedCheckpoint`` (exit 77) when the operator
        named a checkpoint and none verifies."""
        result = self.tiers.restore(self.ctx)
        return self.session.restore_point() if result is not None else None

    def due(self, step: int) -> bool:
        return self.tiers.due(step)

    def maybe_save(self, step: int) -> bool:
        """Call after every optimizer step (every rank): saves the tiers due at ``step``; True
        when it did. Blocks only for a copy of the state into host memory."""
        self.ctx.step = int(step)
        due = self.tiers.due(step)
        self.tiers.maybe_save(self.ctx, checks_passed=self.session.checks_passed())
        return due

    def wait(self, timeout_s: float = 300.0) -> bool:
        """Block until the saves in flight are committed; False on timeout."""
        wait = getattr(self.tiers.inner, "wait", None)
        return bool(wait(timeout_s)) if callable(wait) else True

    def close(self) -> None:
        self.tiers.close()
