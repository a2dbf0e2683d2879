"""Railyard's SDK: what only the training program knows, told to Railyard in a few calls.

Run any PyTorch program under the launcher (``spec.trainer.program``) and it gets the gang,
rail-aware placement, failure classes and restarts with no change. These calls add the rest
(docs/trainer.md, "Your own program", has the table of what each gives)::

    from railyard_trainer import sdk as railyard

    railyard.report_step(step, loss=loss, tokens=n)          # hangs and stragglers from real steps
    if railyard.should_checkpoint(step):                     # the tiers' schedule
        dcp.save(state, storage_writer=railyard.storage_writer(step))
    if (reader := railyard.storage_reader()) is not None:    # resume: verified, fastest tier first
        dcp.load(state, storage_reader=reader)
    railyard.health_check(step=step)                         # silent data corruption
    railyard.close()                                         # before destroy_process_group

Guarantees:

- **Torch-light.** Importing this module imports neither torch nor CUDA; the calls that need
  torch import it on first use. Outside Railyard (plain torchrun, a laptop) every call works:
  nothing is sent, and checkpoints go only where ``RAILYARD_CHECKPOINT_*_DIR`` name folders.
- **Never stops training by itself.** A heartbeat that cannot be delivered, or a checkpoint that
  fails to write, is reported and retried; only three things end the program, each with its
  exit code: the watchdog (no step reported for ``spec.trainer.watchdogSeconds`` after the first
  report, outside :func:`paused`: 76), a confirmed corruption (:class:`SDCDetected`, 75), and a
  required checkpoint that does not verify (``NoVerifiedCheckpoint``, 77).
- **Collective where it says so.** ``storage_reader``, ``storage_writer``/``dcp.save``,
  ``Checkpointer(...)``, ``Checkpointer.restore`` and ``health_check`` must be called by every
  rank at the same point; ``report_step``, ``should_checkpoint``, ``tiers``, ``restore_point``
  and ``paused`` are local.
- **Nothing torn.** A checkpoint exists only once its manifest is committed (every shard written
  and hashed); a restore loads only shards whose SHA-256 matches; a lost node's memory tier comes
  back from its neighbour's replica.

The bundled trainer uses this module for its own heartbeats and checkpoints: one implementation.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from railyard_trainer.hooks import SDCDetected
from railyard_trainer.sdk.session import Identity, RestorePoint, Session, Tier

if TYPE_CHECKING:
    from railyard_trainer.config import TrainerConfig
    from railyard_trainer.sdk.checkpoint import Checkpointer
    from railyard_trainer.sdk.dcp import RailyardStorageReader, RailyardStorageWriter

__all__ = [
    "Checkpointer",
    "Identity",
    "RestorePoint",
    "SDCDetected",
    "Session",
    "Tier",
    "close",
    "health_check",
    "init",
    "paused",
    "report_step",
    "restore_point",
    "session",
    "should_checkpoint",
    "storage_reader",
    "storage_writer",
    "tiers",
]

_SESSION: Session | None = None
_LOCK = threading.Lock()


def init(
    *,
    config: TrainerConfig | None = None,
    identity: Identity | None = None,
    speed_probe: bool = True,
    watchdog: bool = True,
) -> Session:
    """Start the SDK for this process (optional: any call starts it with the defaults).

    ``speed_probe=False``: :func:`report_step` runs no probe (pass ``compute_s`` yourself, or the
    rank is not scored for stragglers). ``watchdog=False``: no in-process watchdog (the
    operator's hang rule still applies once steps are reported). ``config``/``identity``: the
    bundled trainer's own; a program leaves them to the launcher's environment.
    """
    global _SESSION
    with _LOCK:
        if _SESSION is not None and not _SESSION._closed:
            return _SESSION
        if config is None:
            s = Session.from_env(speed_probe=speed_probe, watchdog=watchdog)
        else:
            s = Session(config, identity or Identity.from_env(os.environ), speed_probe=speed_probe, watchdog=watchdog)
        _SESSION = s
    return s


def session() -> Session:
    """This process's session (started with the defaults on first use)."""
    s = _SESSION
    return s if s is not None and not s._closed else init()


def report_step(
    step: int,
    *,
    loss: float | None = None,
    tokens: int | None = None,
    step_time_s: float | None = None,
    compute_s: float | None = None,
    grad_norm: float | None = None,
) -> None:
    """A training step finished on this rank (local, cheap; call it on every rank).

    ``tokens``: this rank's tokens in the step (throughput); ``step_time_s``: default, the time
    since the previous report. The first call opts the rank into progress reports: from then on
    a rank whose step stops advancing is hung (the operator's rule, ``spec.health``; and this
    process's watchdog after ``spec.trainer.watchdogSeconds``): wrap evaluations and other
    long pauses in :func:`paused`. ``compute_s``: the straggler signal, the rank's own device
    time for a fixed amount of work; default, the speed probe is run (a few ms on a GPU).
    """
    session().report_step(
        step, loss=loss, tokens=tokens, step_time_s=step_time_s, compute_s=compute_s, grad_norm=grad_norm
    )


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No step is due inside (evaluation, a long save of one's own): no hang verdict, no watchdog."""
    with session().paused():
        yield


def should_checkpoint(step: int) -> bool:
    """Whether a tier is due at ``step`` (``spec.checkpoint``'s intervals)."""
    return session().should_checkpoint(step)


def tiers() -> dict[str, Tier]:
    """Where each tier lives for this job (``<root>/<job>``) and its schedule."""
    return session().tiers()


def restore_point() -> RestorePoint | None:
    """Where this attempt resumed from: the verified checkpoint loaded (``loaded``), or before a
    load the operator's hint (not verified yet); None: a fresh start. Local."""
    return session().restore_point()


def storage_writer(step: int) -> RailyardStorageWriter:
    """A DCP StorageWriter into the tiers due at ``step`` (all active ones when none is):
    ``dcp.save(state, storage_writer=railyard.storage_writer(step))``. Collective (the first
    call sets the tiers up), as ``dcp.save`` is."""
    from railyard_trainer.sdk.dcp import open_writer

    return open_writer(session(), step)


def storage_reader() -> RailyardStorageReader | None:
    """A DCP StorageReader of the checkpoint to resume from, verified; None on a fresh start.
    Collective: ``if (r := railyard.storage_reader()) is not None: dcp.load(state, storage_reader=r)``.
    Raises ``NoVerifiedCheckpoint`` (exit 77) when the operator named a checkpoint that does not verify."""
    from railyard_trainer.sdk.dcp import open_reader

    return open_reader(session())


def health_check(*, step: int | None = None, model: Any = None, optimizer: Any = None, mesh: Any = None) -> bool:
    """Silent-data-corruption checks, collective: every rank's device computes a known answer
    and the majority names a bad one; with ``model`` (and HSDP's ``mesh``) the parameters that
    must be replicas are compared bit for bit; with ``optimizer`` its state must be finite.
    Raises :class:`SDCDetected` on every rank when corruption is confirmed (exit 75: the
    operator quarantines the node and resumes from the newest clean checkpoint); returns False
    when a check failed without naming a rank (later checkpoints of the attempt are then not
    marked clean), True when all passed."""
    return session().health_check(step=step, model=model, optimizer=optimizer, mesh=mesh)


def close() -> None:
    """Wait for checkpoints in flight, send the last heartbeat (call before destroy_process_group)."""
    s = _SESSION
    if s is not None:
        s.close()


def __getattr__(name: str) -> Any:
    if name == "Checkpointer":
        from railyard_trainer.sdk.checkpoint import Checkpointer

        return Checkpointer
    if name == "NoVerifiedCheckpoint":
        from railyard_trainer.checkpoint.restore import NoVerifiedCheckpoint

        return NoVerifiedCheckpoint
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@atexit.register
def _close_at_exit() -> None:
    # a program that forgot close(): the last heartbeat and saves in flight still go out
    with contextlib.suppress(Exception):
        close()
