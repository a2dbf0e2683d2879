"""Checkpoints through Railyard's tiers, for the bundled trainer and for any program.

One implementation: :class:`Checkpoints` is the facade the bundled train loop calls
(``hooks.Checkpointer``: ``restore(ctx)``, ``due(step)``, ``maybe_save(ctx, checks_passed=)``)
and :class:`Checkpointer` is the same facade over a program's own model and optimizer. Behind
both is ``railyard_trainer.checkpoint``'s manager (memory tier with its neighbour replica, local
disk, shared storage; manifests; checksum-verified restore), used through its public methods
only. The facade adds what the SDK knows: the watchdog and heartbeats pause while a save blocks,
and the restore point is recorded and reported.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from railyard.protocol import podenv
from railyard_trainer import hooks
from railyard_trainer.events import log_event

if TYPE_CHECKING:
    from railyard_trainer.sdk.session import RestorePoint, Session


def build_inner(
    config: Any, ctx: hooks.TrainContext, *, final_step: int | None, defer_capture: bool = False
) -> hooks.Checkpointer:
    """The tiered checkpointer (``railyard_trainer.checkpoint``), or the plain DCP fallback when
    it is switched off (``RAILYARD_PLAIN_CHECKPOINT=1``) or not installed. ``defer_capture``:
    see ``Session.checkpoints``."""
    if not podenv.PLAIN_CHECKPOINT.get(os.environ):
        try:
            from railyard_trainer.checkpoint import build_checkpointer
        except ImportError as exc:
            log_event("fallback", rank=ctx.rank, what="checkpointer", reason=repr(exc))
        else:
            return build_checkpointer(config, ctx, final_step=final_step, defer_capture=defer_capture)
    from railyard_trainer.dcp_checkpointer import build_dcp_checkpointer

    return build_dcp_checkpointer(config)


class Checkpoints:
    """The SDK's facade over one checkpointer (implements ``hooks.Checkpointer``)."""

    def __init__(self, session: Session, inner: hooks.Checkpointer) -> None:
        self.session = session
        self.inner = inner
        session.reporter.add_saving_probe(inner.is_saving)

    def restore(self, ctx: hooks.TrainContext) -> hooks.RestoreResult | None:
        """Load the newest verified checkpoint into ``ctx``; collective. Recorded as the
        session's restore point and reported to the operator."""
        result = self.inner.restore(ctx)
        self.session.restored(result, step=ctx.step)
        return result

    def due(self, step: int) -> bool:
        due = getattr(self.inner, "due", None)
        return bool(due(step)) if callable(due) else False

    def maybe_save(self, ctx: hooks.TrainContext, *, checks_passed: bool) -> None:
        """After an optimizer step: the tiers due now snapshot (blocking, the watchdog paused)
        and write in the background."""
        with self.session.watchdog.paused():
            self.inner.maybe_save(ctx, checks_passed=checks_passed)

    def is_saving(self) -> bool:
        return bool(self.inner.is_saving())

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        # the manager's read-only extras (history, last_committed, drain_events, wait, ...)
        return getattr(self.inner, name)


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
        self.ctx = self.session.train_context(model_parts=list(parts), optimizer=optimizer, lr_scheduler=lr_scheduler, data=data)
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
