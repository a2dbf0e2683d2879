"""The SDK's state in one process (one rank): who it is, its heartbeats, its watchdog.

Torch-free at import: importing ``railyard_trainer.sdk`` costs milliseconds and never touches
torch or CUDA. What needs torch (the speed probe, the checkpoint tiers, the known-answer test)
is imported on first use, in a program that has imported torch anyway.

Identity comes from the environment the launcher gives every worker (torchrun's ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, and Railyard's
``RAILYARD_CONFIG``, ``RAILYARD_POD_INDEX``, ``RAILYARD_MESH_SHAPE``, ...). Without them (a
script run by plain torchrun, or by hand) the same calls work with defaults: no operator to
talk to, so heartbeats go nowhere; checkpoint tiers only where ``RAILYARD_CHECKPOINT_*_DIR``
name folders.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from railyard.protocol import podenv
from railyard_trainer.checkpoint.settings import CheckpointSettings, parse_checkpoint_settings
from railyard_trainer.config import ConfigError, TrainerConfig, load_config
from railyard_trainer.events import log_event
from railyard_trainer.health.reporter import Reporter
from railyard_trainer.watchdog import Watchdog

if TYPE_CHECKING:
    from railyard_trainer.hooks import RestoreResult, TrainContext
    from railyard_trainer.sdk.tiers import Checkpoints


@dataclass(frozen=True)
class Identity:
    """Where this process sits in the gang (from the launcher's environment)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    #: processes per pod (LOCAL_WORLD_SIZE)
    procs_per_node: int = 1
    pod_index: int = 0
    node: str = ""
    #: (pp, dp, tp) of the rank table; (1, world_size, 1) without one
    mesh_shape: tuple[int, int, int] = (1, 1, 1)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Identity:
        def num(*names: str, default: int) -> int:
            for name in names:
                raw = env.get(name, "")
                if raw:
                    try:
                        return int(raw)
                    except ValueError as exc:
                        raise ConfigError([f"{name}: expected an integer, got {raw!r}"]) from exc
            return default

        world = num("WORLD_SIZE", default=1)
        shape = (1, world, 1)
        try:
            shape = podenv.MESH_SHAPE.get(env) or shape
        except podenv.PodEnvError as exc:
            raise ConfigError([str(exc)]) from exc
        return cls(
            rank=num("RANK", default=0),
            local_rank=num("LOCAL_RANK", default=0),
            world_size=world,
            procs_per_node=num("LOCAL_WORLD_SIZE", default=world),
            pod_index=num(podenv.POD_INDEX.name, "GROUP_RANK", default=0),
            node=podenv.NODE_NAME.get(env) or socket.gethostname(),
            mesh_shape=shape,
        )


@dataclass(frozen=True)
class Tier:
    """Where one checkpoint tier lives for this job, and when it saves."""

    name: str
    #: the job's folder in the tier (``<root>/<job>``); "" when the tier has no folder here
    path: str
    interval_steps: int
    keep: int
    #: memory tier: each pod's shards are also kept in its replica peer's memory tier
    replicate: bool
    #: enabled and has a folder
    active: bool


@dataclass(frozen=True)
class RestorePoint:
    """Where this attempt resumes: a verified checkpoint it loaded (``loaded``), or, before
    anything was loaded, the operator's hint of what to restore (not yet verified)."""

    step: int
    tier: str
    attempt: int
    loaded: bool
    detail: str = ""


class Session:
    """One rank's SDK state. Made once per process by :func:`railyard_trainer.sdk.init` (or on
    the first call of any SDK function); thread-safe where it matters (the beat threads)."""

    def __init__(
        self,
        config: TrainerConfig,
        identity: Identity,
        *,
        env: Mapping[str, str] | None = None,
        speed_probe: bool = True,
        watchdog: bool = True,
    ) -> None:
        env = os.environ if env is None else env
        self.config = config
        self.identity = identity
        self.env = dict(env)
        self.speed_probe = speed_probe and podenv.SPEED_PROBE.get(env)
        self.reporter = Reporter.from_env(
            env, rank=identity.rank, local_rank=identity.local_rank, pod_index=identity.pod_index, node=identity.node,
            job=config.job, namespace=config.namespace, attempt=config.attempt,
            interval_s=config.health.heartbeat_interval_seconds,
        )
        self.watchdog = Watchdog(config.trainer.watchdog_seconds, rank=identity.rank)
        self._watch = watchdog
        self._probe: Any = None
        self._device: Any = None
        self._last_report: float | None = None
        self._restore: RestorePoint | None = None
        self._checkpoints: list[Checkpoints] = []
        self._dcp: Any = None
        self._monitor: Any = None
        self._health_ctx: TrainContext | None = None
        self._closed = False
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> Session:
        """The session of a worker the launcher started (or of a plain script: defaults)."""
        env = os.environ if env is None else env
        path = podenv.CONFIG.get(env)
        config = load_config(path) if path else TrainerConfig(job=podenv.JOB.get(env) or "local")
        return cls(config, Identity.from_env(env), env=env, **kwargs)

    # ------------------------------------------------------------------ who and where
    @property
    def rank(self) -> int:
        return self.identity.rank

    @property
    def attempt(self) -> int:
        return self.config.attempt

    @property
    def checkpoint_settings(self) -> CheckpointSettings:
        return parse_checkpoint_settings(_checkpoint_section(self.config), env=self.env, restore=self.config.restore)

    def tiers(self) -> dict[str, Tier]:
        """Each tier's folder for this job and its schedule (from the job's spec.checkpoint and
        the pod's RAILYARD_CHECKPOINT_*_DIR). Torch-free."""
        out = {}
        for t in self.checkpoint_settings.tiers:
            path = os.path.join(t.root, self.config.job) if t.root else ""
            out[t.name] = Tier(t.name, path, t.interval_steps, t.keep, t.replicate, t.active)
        return out

    def device(self) -> Any:
        """The rank's compute device: ``cuda:LOCAL_RANK``'s current device when CUDA is there."""
        if self._device is None:
            import torch

            self._device = (
                torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
            )
        return self._device

    def collective_device(self) -> Any:
        """Where tensors for collectives on the default process group live (NCCL: the GPU)."""
        import torch
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
            return self.device()
        return torch.device("cpu")

    # ------------------------------------------------------------------ progress
    def expect_progress(self, *, first_step_factor: float = 1.0) -> None:
        """Opt into progress reports now: the operator's hang rule applies to this rank and its
        watchdog runs (the next step is due within ``first_step_factor`` x watchdogSeconds)."""
        if not self.reporter.progress:
            self.reporter.begin_progress()
        if self._watch and not self.watchdog.running:
            self.watchdog.start(first_step_factor=first_step_factor)

    def report_step(
        self,
        step: int,
        *,
        loss: float | None = None,
        tokens: int | None = None,
        step_time_s: float | None = None,
        compute_s: float | None = None,
        grad_norm: float | None = None,
        tokens_per_s: float | None = None,
    ) -> None:
        now = time.perf_counter()
        if step_time_s is None:
            step_time_s = now - self._last_report if self._last_report is not None else 0.0
        self._last_report = now
        if tokens_per_s is None:
            tokens_per_s = tokens / step_time_s if tokens and step_time_s > 0 else 0.0
        if compute_s is None:
            compute_s = self._probe_once() if self.speed_probe else 0.0
        self.reporter.report_step(
            step,
            step_time_s=float(step_time_s),
            compute_s=float(compute_s),
            loss=None if loss is None else float(loss),
            grad_norm=None if grad_norm is None else float(grad_norm),
            tokens_per_s=float(tokens_per_s),
        )
        self.expect_progress()
        self.watchdog.beat()

    def _probe_once(self) -> float:
        """The straggler signal for a program: the trainer's speed probe (a fixed,
        collective-free workload on the rank's device), run once per reported step."""
        if self._probe is None:
            from railyard_trainer.speed_probe import SpeedProbe

            self._probe = SpeedProbe(self.device())
        return float(self._probe.run())

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No step is due while inside (evaluation, a long save): neither the watchdog nor the
        operator's hang rule fires, and their clocks restart when it ends."""
        with self.watchdog.paused(), self.reporter.paused():
            yield
        self._last_report = time.perf_counter()

    # ------------------------------------------------------------------ checkpoints
    def train_context(
        self, *, model_parts: list[Any], optimizer: Any = None, lr_scheduler: Any = None, data: Any = None
    ) -> TrainContext:
        """A :class:`hooks.TrainContext` for a program's own objects (what the checkpoint tiers
        and the health checks read)."""
        from railyard_trainer.hooks import TrainContext
        from railyard_trainer.parallel_dims import ParallelDims

        i = self.identity
        pp, dp, tp = i.mesh_shape
        if pp * dp * tp != i.world_size:
            pp, dp, tp = 1, i.world_size, 1
        dims = ParallelDims(pp=pp, dp=dp, tp=tp, world_size=i.world_size, procs_per_node=max(i.procs_per_node, tp))
        ctx = TrainContext(
            rank=i.rank, local_rank=i.local_rank, world_size=i.world_size, node=i.node, pod_index=i.pod_index,
            job=self.config.job, attempt=self.config.attempt, dims=dims, mesh=None, model_parts=list(model_parts),
            optimizer=optimizer, lr_scheduler=lr_scheduler, data=data, step=0, config=self.config,
        )
        self.bind(ctx)
        return ctx

    def bind(self, ctx: TrainContext) -> None:
        """Let the checkpoint tiers and health checks of ``ctx`` report through this session."""
        ctx.extra["reporter"] = self.reporter
        ctx.extra.setdefault("health_monitor", self.reporter)
        if "device" not in ctx.extra:
            ctx.extra["device"] = self.device()

    def checkpoints(self, ctx: TrainContext, *, final_step: int | None, defer_capture: bool = False) -> Checkpoints:
        """The tiered checkpointer of ``ctx`` behind the SDK's facade. Collective (it creates the
        checkpoint's own process group): every rank, same order. ``defer_capture``: the loop
        changes the parameters and optimizer state only in ``optimizer.step()``, so a save may
        copy them while the next step's forward and backward run (the bundled trainer's loop;
        see checkpoint.snapshot.Capture)."""
        from railyard_trainer.sdk.tiers import Checkpoints, build_inner

        cp = Checkpoints(self, build_inner(self.config, ctx, final_step=final_step, defer_capture=defer_capture))
        self._checkpoints.append(cp)
        ctx.extra["checkpointer"] = cp
        return cp

    def should_checkpoint(self, step: int) -> bool:
        """Whether a tier is due at ``step`` (the checkpointer's own answer when there is one)."""
        if self._checkpoints:
            return any(cp.due(step) for cp in self._checkpoints)
        if self._dcp is not None:
            return bool(self._dcp.due(step))
        return any(t.due(step) for t in self.checkpoint_settings.active_tiers)

    def restored(self, result: RestoreResult | None, *, step: int) -> RestorePoint | None:
        """Record what this attempt loaded (``None``: a fresh start) and tell the operator."""
        if result is None:
            return None
        point = RestorePoint(step=step, tier=result.tier, attempt=self.attempt, loaded=True, detail=result.detail)
        self._restore = point
        self.reporter.note_restore(result.tier, step)
        self.reporter.set_step(step)
        log_event(
            "restored",
            rank=self.rank,
            step=step,
            tier=result.tier,
            duration_s=round(result.duration_s, 3),
            detail=result.detail,
        )
        return point

    def restore_point(self) -> RestorePoint | None:
        if self._restore is not None:
            return self._restore
        hint = self.config.restore or {}
        tier, step = hint.get("tier"), hint.get("step")
        if isinstance(tier, str) and isinstance(step, int) and step >= 0:
            return RestorePoint(step=step, tier=tier, attempt=self.attempt, loaded=False, detail="the operator's hint")
        return None

    def dcp(self) -> Any:
        """The tiers behind the DCP StorageWriter/StorageReader pair (built on first use; collective)."""
        if self._dcp is None:
            from railyard_trainer.sdk.dcp import DcpTiers

            self._dcp = DcpTiers(self)
        return self._dcp

    # ------------------------------------------------------------------ health checks
    def health_check(
        self, *, step: int | None = None, model: Any = None, optimizer: Any = None, mesh: Any = None
    ) -> bool:
        """The known-answer test on every rank's device, majority-voted, plus (with ``model``
        and ``mesh``) the cross-replica checksums and (with ``optimizer``) the finiteness of
        its state. Collective over the default process group: every rank, same step. Raises
        :class:`railyard_trainer.hooks.SDCDetected` (exit 75 under the launcher) on every rank
        when corruption is confirmed; False when a check failed without naming a rank (the
        attempt's later checkpoints are then not marked SDC-clean)."""
        from dataclasses import replace

        from railyard_trainer.health.monitor import HealthSettings, RailyardHealthMonitor

        if self._health_ctx is None:
            self._health_ctx = self.train_context(model_parts=[])
            self._health_ctx.extra["device"] = self.collective_device()
        ctx = self._health_ctx
        ctx.model_parts = [] if model is None else list(model) if isinstance(model, list | tuple) else [model]
        ctx.optimizer = optimizer
        ctx.mesh = mesh
        ctx.step = self.reporter.step if step is None else int(step)
        if self._monitor is None:
            settings = replace(HealthSettings.from_config(self.config.health, {}), magnitude_guard=False)
            self._monitor = RailyardHealthMonitor(settings, ctx, reporter=self.reporter)
        monitor = self._monitor
        before = sum(monitor.failures.values())
        monitor.verify(ctx, force=True)
        return sum(monitor.failures.values()) == before

    def checks_passed(self) -> bool:
        """Whether a checkpoint now may be marked SDC-clean: no health check of this attempt
        failed (True when the program runs none: clean by configuration, as without the health
        package)."""
        return True if self._monitor is None else bool(self._monitor.checks_passed())

    # ------------------------------------------------------------------ the end
    def close(self, timeout_s: float | None = None) -> None:
        """Wait for checkpoints in flight, send the last heartbeat, stop the threads. Call it
        before ``destroy_process_group`` (the tiers write in the background on their own group)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.watchdog.stop()
        for cp in self._checkpoints:
            cp.close()
        if self._dcp is not None:
            self._dcp.close()
        self.reporter.close()


def _checkpoint_section(config: TrainerConfig) -> dict[str, Any]:
    return dict(config.checkpoint or {})
