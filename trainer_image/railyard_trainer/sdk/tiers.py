"""The tiers behind the SDK's facade: :class:`Checkpoints`, which the bundled train loop calls
(``hooks.Checkpointer``: ``restore(ctx)``, ``due(step)``, ``maybe_save(ctx, checks_passed=)``)
and :class:`railyard_trainer.sdk.checkpoint.Checkpointer` wraps for a program's own model.

Behind it is ``railyard_trainer.checkpoint``'s manager (memory tier with its neighbour replica,
local disk, shared storage; manifests; checksum-verified restore), used through its public methods
only. The facade adds what the SDK knows: the watchdog and heartbeats pause while a save blocks,
and the restore point is recorded and reported. ``Session.checkpoints`` builds it; this module
knows the session only as a type, so the two do not import each other.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from railyard.protocol import podenv
from railyard_trainer import hooks
from railyard_trainer.events import log_event

if TYPE_CHECKING:
    from railyard_trainer.sdk.session import Session


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
