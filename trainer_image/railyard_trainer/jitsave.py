"""The workers' side of the just-in-time save before a planned move (operator: railyard.logic.jitsave;
launcher: railyard_trainer.inplace writes the order to ``RAILYARD_SAVE_ORDER_FILE``).

Every rank must save the SAME step: the save's own collectives pair the ranks' saves, and a
restore needs every rank's shard of one step. The launchers hear the order at different moments,
so no rank decides alone. Each step already all-reduces the loss (a SUM); two numbers ride along:
whether this rank has read the order (1 or 0) and the order's step. Every rank gets the same sums
at the same step, so every rank decides the same: save at this step when all ``world`` ranks
have heard and this step is not before the order's step (:func:`decide_save_now`). A rank that
is already past the order's step when it hears saves, with the others, at the first step where
all of them have heard: never mismatched. Orders naming different steps (which the operator
never sends for one attempt) give sums no rank can take for one step: nothing is saved, and the
operator's move goes ahead after its timeout from the newest save.

With faultTolerance ReplicaGroups the order reaches only the replica groups a planned move
replaces (railyard.logic.groupleave): at the agreed step, after its commit, their ranks first
leave the quorum (the other groups go on without them, no step of theirs fails) and say so in the
file :func:`left_marker` names, which their launcher reports to the operator (``left_step``).

After the save the workers wait for it to commit (so the heartbeat reports it) and hold still,
paused for the hang rules, until the restart stops them, at most ``HOLD_S``: a move that does
not come (the node was uncordoned) lets training go on, and a later order (another step) is a
save of its own.

Torch-free: the train loop does the all-reduce (railyard_trainer.train).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from railyard.protocol import podenv

#: Longest hold after a just-in-time save (the operator's move restarts the workers well before).
HOLD_S = 120.0


@dataclass(frozen=True, slots=True)
class Heard:
    """What this rank contributes to the step's sums: (heard 0/1, the order's step or 0)."""

    heard: float
    step: float


def decide_save_now(step: int, *, heard: float, step_sum: float, world: int, done: bool) -> bool:
    """Whether every rank saves at ``step`` (the same answer on every rank: only the sums and the
    step, which all ranks share, decide)."""
    if done or world <= 0 or round(heard) != world:
        return False
    target, rest = divmod(round(step_sum), world)
    if rest != 0:
        return False  # different steps ordered: no one step to agree on
    return step >= target


class SaveOrderWatch:
    """Reads the launcher's save order for this attempt: one small read per step (a missing file
    until the first order; after a save, a later order of another step is a save of its own)."""

    def __init__(self, path: str | None, attempt: int) -> None:
        self.path = Path(path) if path else None
        self.attempt = attempt
        #: the step of the order read last (-1: none)
        self.step = -1
        #: the step saved at last (-1: none), and the order it was for
        self.saved = -1
        self.saved_for = -1

    @classmethod
    def from_env(cls, env: Mapping[str, str], attempt: int) -> SaveOrderWatch:
        return cls(podenv.SAVE_ORDER_FILE.get(env) or None, attempt)

    @property
    def pending(self) -> bool:
        return self.step >= 0 and self.step != self.saved_for

    def heard(self) -> Heard:
        """This rank's contribution to the step's sums: an order read and not saved for yet."""
        if self.path is not None and not self.pending:
            self.step = _read_order(self.path, self.attempt)
        return Heard(1.0, float(self.step)) if self.pending else Heard(0.0, 0.0)

    def save_now(self, step: int, *, heard: float, step_sum: float, world: int) -> bool:
        """From the step's sums: whether every rank saves now (all of them have this order pending)."""
        if decide_save_now(step, heard=heard, step_sum=step_sum, world=world, done=not self.pending):
            self.saved, self.saved_for = step, self.step
            return True
        return False


def _read_order(path: Path, attempt: int) -> int:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return -1  # not written yet (the launcher writes it whole, by a rename)
    if not isinstance(raw, dict) or raw.get("attempt") != attempt:
        return -1
    step = raw.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else -1


def left_marker(order_file: Path) -> Path:
    """Where the workers say they left the quorum (beside the order file their launcher wrote)."""
    return order_file.with_name(order_file.name + ".left")


def write_left(order_file: Path, step: int) -> None:
    """The workers' word that they left the quorum after ``step`` (written whole, by a rename)."""
    marker = left_marker(order_file)
    tmp = marker.with_name(f"{marker.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"step": step}))
    os.replace(tmp, marker)


def read_left(order_file: Path) -> int:
    """The step the workers left the quorum after (-1: they have not)."""
    try:
        raw = json.loads(left_marker(order_file).read_text())
    except (OSError, ValueError):
        return -1
    step = raw.get("step") if isinstance(raw, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else -1


def hold(*, until_gone: Path | None, hold_s: float = HOLD_S, tick: Callable[[], None] = lambda: None,
         clock: Callable[[], float] = time.monotonic, pause: Callable[[float], None] = time.sleep) -> None:
    """Hold still after the save until the restart stops this process (or ``hold_s``); ``tick``
    runs every second (forwards the save's events to the heartbeat). A removed order file ends
    the hold early (a launcher, or a test, withdrawing it)."""
    end = clock() + hold_s
    while clock() < end:
        tick()
        if until_gone is not None and not until_gone.exists():
            return
        pause(min(1.0, max(end - clock(), 0.0)))


