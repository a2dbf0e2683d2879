"""The two small interfaces the train loop calls: a checkpointer and a health monitor.

The loop knows nothing about tiers, heartbeats or SDC checks; it calls these hooks at fixed
points. ``railyard_trainer.checkpoint`` and ``railyard_trainer.health`` fill them in; the null
implementations here keep the loop runnable without either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh


class SDCDetected(RuntimeError):
    """A health check confirmed silent data corruption. The launcher exits with SDC_DETECTED."""

    def __init__(self, message: str, *, rank: int, node: str = "", step: int = -1) -> None:
        super().__init__(message)
        self.rank = rank
        self.node = node
        self.step = step


class HangDetected(RuntimeError):
    """The rank's own watchdog found it stuck. The launcher exits with HANG_OR_STRAGGLER."""


@dataclass
class StepMetrics:
    step: int
    loss: float
    grad_norm: float
    step_time_s: float
    #: Device time of the rank's speed probe: collective-free, in the device's own clock (the
    #: straggler signal; see speed_probe.py and protocol.heartbeat).
    compute_s: float
    tokens_per_s: float
    lr: float
    memory_bytes: int = 0


@dataclass
class TrainContext:
    """Everything a hook may need, owned by the train loop. Fields are filled as they exist."""

    rank: int
    local_rank: int
    world_size: int
    node: str
    pod_index: int
    job: str
    attempt: int
    #: ParallelDims of this run (pp, dp, tp).
    dims: Any
    mesh: DeviceMesh | None
    #: The model chunks this rank holds (one per pipeline stage it runs; one without PP).
    model_parts: list[torch.nn.Module]
    optimizer: torch.optim.Optimizer | None
    lr_scheduler: Any
    #: Stateful data loader: state_dict() / load_state_dict().
    data: Any
    step: int = 0
    #: The full trainer config (railyard_trainer.config.TrainerConfig).
    config: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RestoreResult:
    step: int
    tier: str
    duration_s: float
    detail: str = ""


class Checkpointer(Protocol):
    def restore(self, ctx: TrainContext) -> RestoreResult | None:
        """Load the newest verified checkpoint into ctx (model, optimizer, data, step)."""

    def maybe_save(self, ctx: TrainContext, *, checks_passed: bool) -> None:
        """Called after every optimizer step; saves on the tiers whose interval is due."""

    def due(self, step: int) -> bool:
        """Whether ``maybe_save`` at ``step`` will save (the loop verifies the state first)."""

    def is_saving(self) -> bool:
        """True while a save is blocking or in flight (heartbeats report it)."""

    def close(self) -> None:
        """Wait for in-flight saves (bounded) and release resources."""


class HealthMonitor(Protocol):
    def preflight(self, ctx: TrainContext) -> None:
        """Checks before the first step (known-answer test). May raise SDCDetected."""

    def after_backward(self, ctx: TrainContext, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Gradients are ready, optimizer not yet stepped. May raise SDCDetected."""

    def after_step(self, ctx: TrainContext, metrics: StepMetrics) -> None:
        """Periodic checks and the heartbeat. May raise SDCDetected."""

    def verify(self, ctx: TrainContext) -> None:
        """Run the full (collective) checks now: a checkpoint of this step follows. May raise
        SDCDetected."""

    def checks_passed(self) -> bool:
        """Whether the state at this step may be marked clean in a checkpoint: the checks of
        this step ran and passed, and no earlier check of this attempt failed (a corrupted
        step taints every state derived from it)."""

    def close(self) -> None: ...


class NullHealth:
    def preflight(self, ctx: TrainContext) -> None:
        return None

    def after_backward(self, ctx: TrainContext, loss: Any, grad_norm: Any) -> None:
        return None

    def after_step(self, ctx: TrainContext, metrics: StepMetrics) -> None:
        return None

    def verify(self, ctx: TrainContext) -> None:
        return None

    def checks_passed(self) -> bool:
        """Health checks are switched off: checkpoints are marked clean by configuration."""
        return True

    def close(self) -> None:
        return None
