"""The train loop: build everything once in ``Trainer.__init__``, then ``train()`` fits on a screen.

Hooks (see hooks.py) are called at fixed points: ``checkpointer.restore`` before the first step,
``health.preflight`` before step 1, ``health.after_backward`` with the loss and grad norm before
the optimizer step, ``health.after_step`` with the step's metrics, and
``checkpointer.maybe_save(checks_passed=health.checks_passed())`` after every step.

Heartbeats, the watchdog and the checkpoint tiers are the SDK's (railyard_trainer.sdk), the same
calls a program of one's own makes: ``session.report_step`` after each step, and the
checkpointer is the SDK's facade over the tiers.

``compute_s`` (the straggler signal) is the device time of this rank's speed probe
(speed_probe.py), a fixed, collective-free workload run every step: under FSDP a healthy rank's
forward+backward waits for the slowest peer inside the all-gathers, so forward+backward time
(logged as ``fwd_bwd_s``) cannot tell the slow rank from the ones waiting for it.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from railyard.protocol import podenv
from railyard.protocol.trainerconfig import world_parallelism
from railyard_trainer import hooks, sdk
from railyard_trainer.config import ConfigError, TrainerConfig
from railyard_trainer.data import ShardedBatches, build_source, model_vocab_size
from railyard_trainer.events import log_event
from railyard_trainer.faults import FaultInjector
from railyard_trainer.ft import FTManager, StepExchange, build_ft_manager, ft_problems
from railyard_trainer.grads import clip_grad_norm_
from railyard_trainer.jitsave import SaveOrderWatch, hold, write_left
from railyard_trainer.model import Transformer, cross_entropy_loss
from railyard_trainer.model_args import PRESETS
from railyard_trainer.parallel_dims import ParallelDims
from railyard_trainer.parallelize import (
    clean_fqn,
    compile_backend_from_env,
    parallelize_llama,
    param_dtype_for,
)
from railyard_trainer.pipeline import STAGES_PER_RANK, build_pipeline, check_microbatches
from railyard_trainer.replicas import HealState
from railyard_trainer.speed_probe import SpeedProbe
from railyard_trainer.train_state import ModelState, Optimizers, WarmupCosine
from railyard_trainer.watchdog import Watchdog
from railyard_trainer.worker_env import WorkerEnv

#: Above this many parameters the model is built on the meta device and initialised after
#: sharding (each rank only ever holds its shard); below, it is built whole with the seed, so
#: every layout starts from bit-identical weights.
META_INIT_PARAMS = int(podenv.META_INIT_PARAMS.get(os.environ))

#: Dense bf16 peak FLOP/s per GPU, by device-name substring (for MFU).
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}


def init_distributed(env: WorkerEnv, timeout_s: float) -> torch.device:
    from railyard_trainer.rendezvous import build_attempt_store

    # a store fenced by the attempt (railyard_trainer/rendezvous.py), or env://
    store = build_attempt_store(timeout_s)
    fenced: dict[str, object] = (
        {} if store is None else {"store": store, "rank": env.rank, "world_size": env.world_size}
    )
    if torch.cuda.is_available():
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timedelta(seconds=timeout_s), device_id=device, **fenced)  # type: ignore[arg-type]
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s), **fenced)  # type: ignore[arg-type]
    return device


class Trainer:
    def __init__(self, cfg: TrainerConfig, env: WorkerEnv) -> None:
        self.cfg, self.env = cfg, env
        t = cfg.trainer
        # with faultTolerance ReplicaGroups this world is one replica group (replicas.py)
        world = world_parallelism(cfg.parallelism, cfg.fault_tolerance)
        self.dims = ParallelDims(
            pp=env.mesh_shape[0],
            dp=env.mesh_shape[1],
            tp=env.mesh_shape[2],
            world_size=env.world_size,
            procs_per_node=env.procs_per_node,
            dp_replicas=world.data_replicas,
        )
        preset = PRESETS[t.preset]
        args = replace(
            preset, vocab_size=model_vocab_size(t.dataset, preset_vocab=preset.vocab_size, fixed=t.vocab_size)
        )
        stages = self.dims.pp * STAGES_PER_RANK[cfg.parallelism.pipeline_schedule] if self.dims.pp_enabled else 1
        problems = args.problems(tp=self.dims.tp, stages=stages)
        if t.batch_size % self.dims.dp:
            problems.append(
                f"trainer.batchSize: {t.batch_size} is not divisible by the data-parallel size {self.dims.dp}"
            )
        problems.extend(ft_problems(cfg, group_dp=self.dims.dp))
        if problems:
            raise ConfigError(problems)
        self.microbatches = (
            check_microbatches(
                cfg.parallelism.pipeline_schedule,
                self.dims.pp,
                cfg.parallelism.microbatches or 0,
                t.batch_size // self.dims.dp,
            )
            if self.dims.pp_enabled
            else 1
        )

        self.device = init_distributed(env, t.collective_timeout_seconds)
        self.mesh = self.dims.build_mesh(self.device.type)
        coords = self.dims.mesh_coordinates(self.mesh)
        log_event(
            "start",
            rank=env.rank,
            local_rank=env.local_rank,
            node=env.node,
            coords=list(env.coords),
            mesh_coords=list(coords),
            device=str(self.device),
        )
        if coords != env.coords:
            raise ConfigError(
                [
                    f"rank table: rank {env.rank} has coordinates {env.coords} but the mesh puts it at {coords}; the "
                    "rank table is inconsistent"
                ]
            )
        self.pp_rank, self.dp_rank, self.tp_rank = coords

        torch.manual_seed(t.seed)
        meta = args.num_params() > META_INIT_PARAMS
        with torch.device("meta" if meta else self.device):
            model = Transformer(args)
        param_dtype = param_dtype_for(t.mixed_precision, self.device)
        offload = t.cpu_offload and self.device.type == "cuda"
        # Not in the CRD yet: bench/gpu/run.py measures it first (RAILYARD_COMPILE).
        compile_backend = compile_backend_from_env(podenv.COMPILE.get(os.environ))

        def parallelize(m: Transformer) -> Transformer:
            return parallelize_llama(
                m,
                mesh=self.mesh,
                dims=self.dims,
                param_dtype=param_dtype,
                activation_checkpointing=t.activation_checkpointing,
                cpu_offload=offload,
                compile_backend=compile_backend,
            )

        self.schedule = None
        if self.dims.pp_enabled:
            pipe = build_pipeline(
                model,
                pp_mesh=self.mesh["pp"],
                device=self.device,
                schedule=cfg.parallelism.pipeline_schedule,
                microbatches=self.microbatches,
                loss_fn=cross_entropy_loss,
                parallelize=parallelize,
            )
            self.schedule, self.parts, self.has_first, self.has_last = (
                pipe.schedule,
                pipe.parts,
                pipe.has_first,
                pipe.has_last,
            )
        else:
            self.parts, self.has_first, self.has_last = [parallelize(model)], True, True
        del model
        if meta:
            for part in self.parts:
                part.to_empty(device="cpu" if offload else self.device)
                part.init_weights(buffer_device=self.device)
        # From here on each rank draws from its own stream (saved and restored with checkpoints).
        seed_rank_rng(t.seed, env.rank)
        self.optimizer = Optimizers(
            self.parts,
            lr=t.learning_rate,
            weight_decay=t.weight_decay,
            fused=self.device.type == "cuda" and not offload,
        )  # type: ignore[arg-type]
        self.lr_scheduler = WarmupCosine(
            self.optimizer, peak_lr=t.learning_rate, warmup_steps=t.warmup_steps, total_steps=t.steps
        )
        source = build_source(
            t.dataset, vocab_size=args.vocab_size, seed=t.seed, seq_len=t.seq_len, vocab_fixed=t.vocab_size is not None
        )
        self.data = ShardedBatches(
            source,
            batch_size=t.batch_size,
            seq_len=t.seq_len,
            dp_rank=self.dp_rank,
            dp_size=self.dims.dp,
            device=self.device,
        )
        self.flops_per_token = args.flops_per_token(t.seq_len)
        self.peak_flops = _peak_flops(self.device)
        self.ctx = hooks.TrainContext(
            rank=env.rank, local_rank=env.local_rank, world_size=env.world_size, node=env.node,
            pod_index=env.pod_index, job=cfg.job, attempt=cfg.attempt, dims=self.dims, mesh=self.mesh,
            model_parts=list(self.parts), optimizer=self.optimizer, lr_scheduler=self.lr_scheduler,
            data=self.data, step=0, config=cfg,
        )
        self.ctx.extra["device"] = self.device
        # The health package replays a suspect step with this (every layout, pipelines included).
        self.ctx.extra["replay_step"] = self.replay_step
        # Heartbeats, watchdog and checkpoint tiers: the SDK's, as for any program.
        self.session = sdk.init(config=cfg, identity=_identity(env))
        self.session.bind(self.ctx)
        # This loop changes the parameters and optimizer state only in optimizer.step(): a save
        # copies them during the next forward and backward (checkpoint.snapshot.Capture).
        self.checkpointer = self.session.checkpoints(self.ctx, final_step=t.steps, defer_capture=True)
        self.health = _build_health(cfg, self.ctx)
        # The fault tolerance (ft.py): replica groups, or none; the loop below never asks which.
        heal_state = HealState(
            parts={
                "model": ModelState(self.parts),
                "optimizer": self.optimizer,
                "lr_scheduler": self.lr_scheduler,
                "data": self.data,
            },
            get_position=lambda: {"step": self.ctx.step},
            set_position=lambda pos: setattr(self.ctx, "step", int(pos["step"])),
        )
        self.ft: FTManager = build_ft_manager(
            cfg, ctx=self.ctx, data=self.data, state=heal_state, unit=self.dims.dp, rank=env.rank, world=env.world_size,
            device=self.device, paused=self.session.paused, add_waiting_probe=self.session.reporter.add_waiting_probe)
        self.faults = FaultInjector(cfg.active_faults(), rank=env.rank, log=log_event, group=self.ft.group)
        self.probe = SpeedProbe(self.device)
        self.watchdog: Watchdog = self.session.watchdog
        self.log_all_ranks = podenv.LOG_ALL_RANKS.get(os.environ)
        self.dump_grads_dir = podenv.DUMP_GRADS.get(os.environ)
        # A just-in-time save before a planned move (jitsave.py): agreed on in the loss's all-reduce.
        self.jit = SaveOrderWatch.from_env(os.environ, cfg.attempt)
        self._heard_sums = (0.0, 0.0)

    def train(self) -> None:
        self.ctx.extra["restore"] = self.ft.restore(lambda: self.checkpointer.restore(self.ctx))
        self.health.preflight(self.ctx)
        self.session.expect_progress(first_step_factor=5.0)
        while self.ctx.step < self.cfg.trainer.steps:
            self.run_step()
        self.watchdog.stop()
        log_event("done", rank=self.env.rank, step=self.ctx.step, **self.ft.done_fields(self.parts))

    def run_step(self) -> hooks.StepMetrics:
        """One step with its checks and checkpoint. Before a checkpoint the health package
        verifies the state it would hold (its collective checks run at that very step), so a
        checkpoint is marked clean only when checks covering its step ran and passed."""
        metrics = self.ft.next_step(self.train_step)
        self.health.after_step(self.ctx, metrics)
        self.session.report_step(
            metrics.step, loss=metrics.loss, step_time_s=metrics.step_time_s, compute_s=metrics.compute_s,
            grad_norm=metrics.grad_norm, tokens_per_s=metrics.tokens_per_s,
        )
        if self.checkpointer.due(self.ctx.step):
            self.health.verify(self.ctx)
        self.checkpointer.maybe_save(self.ctx, checks_passed=self.health.checks_passed())
        heard, step_sum = self._heard_sums
        if self.jit.save_now(self.ctx.step, heard=heard, step_sum=step_sum, world=self.env.world_size):
            self._save_before_move()
        return metrics

    def _save_before_move(self) -> None:
        """Every rank at this same step: save to the memory tier (the manager's own path), wait
        for the commit, hold still until the planned move restarts the workers. A replica group
        leaves the quorum first (the others go on without it) and says so to its launcher."""
        step = self.ctx.step
        left = self.ft.leave(step)
        if left and self.jit.path is not None:
            write_left(self.jit.path, step)
        tiers = [t for t in getattr(self.checkpointer, "tiers", ()) if t.name == "memory" and t.active]
        save = getattr(self.checkpointer, "save", None)
        if not tiers or save is None:
            log_event("jit_save_skipped", rank=self.env.rank, step=step, why="no memory tier in this checkpointer")
            if not left:
                return  # (a group that left cannot train on: it holds still all the same)
        elif not tiers[0].due(step):  # (a due one was saved by maybe_save just now)
            self.health.verify(self.ctx)
            save(self.ctx, tiers=tiers, checks_passed=self.health.checks_passed())
        saved = bool(tiers) and save is not None
        if saved:
            log_event("jit_save", rank=self.env.rank, step=step, attempt=self.cfg.attempt)
        with self.session.paused():
            if saved:
                self.checkpointer.wait(self.checkpointer.settings.timeout_s)
            hold(until_gone=self.jit.path, tick=lambda: self.checkpointer.forward_events(self.ctx))

    def replay_step(self) -> tuple[float, float]:
        """Forward+backward of this step's batch again (all ranks together): (loss, grad norm),
        the norm computed exactly as the step's own (all stages, no clipping)."""
        inputs, labels = self.ctx.extra["batch"]
        with torch.enable_grad():
            loss = self.forward_backward(inputs, labels)
        norm = clip_grad_norm_(self.parts, 0.0, pp_group=self.mesh["pp"].get_group() if self.dims.pp_enabled else None)
        return float(loss), float(norm)

    def train_step(self, step: int, exchange: StepExchange) -> hooks.StepMetrics | None:
        """One step, its batch and cross-group exchange through ``exchange`` (ft.py); None when
        the step did not commit (its gradients are dropped, the manager tries it again)."""
        start = time.perf_counter()
        self.faults.before_step(step)
        inputs, labels = exchange.batch(self.data)
        self.ctx.extra["batch"] = (inputs, labels)
        self._sync()
        t0 = time.perf_counter()
        loss = self.forward_backward(inputs, labels)
        self._sync()
        fwd_bwd_s = time.perf_counter() - t0
        fwd_bwd_s += self.faults.slow_down(step, fwd_bwd_s)
        # The straggler signal (speed_probe.py): forward+backward includes FSDP's waits for
        # the slowest peer, the probe does not. A "slow" fault slows the device, probe included.
        compute_s = self.probe.run(self.faults.slow_factor(step))
        if self.dump_grads_dir and step == 1:
            self._dump_grads(Path(self.dump_grads_dir))
        self.faults.maybe_flip(step, "grad", self.parts)
        exchange.reduce_gradients(p for part in self.parts for p in part.parameters())
        grad_norm = clip_grad_norm_(
            self.parts,
            self.cfg.trainer.grad_clip,
            pp_group=self.mesh["pp"].get_group() if self.dims.pp_enabled else None,
        )
        lr = self.lr_scheduler.get_last_lr()[0]
        global_loss = exchange.reduce_loss(self._global_loss(loss))
        if not exchange.commit(step):
            self.optimizer.zero_grad()
            return None
        self.health.after_backward(self.ctx, loss, grad_norm)
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad()
        self.faults.maybe_flip(step, "param", self.parts)
        step_time = time.perf_counter() - start
        tokens_per_s = self.cfg.trainer.batch_size * self.cfg.trainer.seq_len / step_time
        metrics = hooks.StepMetrics(
            step=step,
            loss=global_loss,
            grad_norm=float(grad_norm),
            step_time_s=step_time,
            compute_s=compute_s,
            tokens_per_s=tokens_per_s,
            lr=lr,
            memory_bytes=self._memory_bytes(),
        )
        if (self.env.rank == 0 or self.log_all_ranks) and (
            step % self.cfg.trainer.log_every_steps == 0 or step == self.cfg.trainer.steps
        ):
            extra: dict[str, Any] = {}
            if self.peak_flops:
                extra["mfu"] = round(tokens_per_s / self.env.world_size * self.flops_per_token / self.peak_flops, 4)
            extra.update(exchange.log_fields())
            log_event(
                "step",
                rank=self.env.rank,
                step=step,
                loss=global_loss,
                grad_norm=metrics.grad_norm,
                lr=lr,
                step_time_s=round(step_time, 5),
                fwd_bwd_s=round(fwd_bwd_s, 5),
                compute_s=round(compute_s, 5),
                tokens_per_s=round(tokens_per_s, 1),
                memory_bytes=metrics.memory_bytes,
                **extra,
            )
        return metrics

    def forward_backward(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Loss of this rank's batch (zero on pipeline stages without the loss), grads ready."""
        if self.schedule is None:
            loss = cross_entropy_loss(self.parts[0](inputs), labels)
            loss.backward()  # type: ignore[no-untyped-call, unused-ignore]
            return loss.detach()
        losses: list[torch.Tensor] = []
        target = labels if self.has_last else None
        if self.has_first:
            self.schedule.step(inputs, target=target, losses=losses, return_outputs=False)
        else:
            self.schedule.step(target=target, losses=losses, return_outputs=False)
        if self.has_last:
            return torch.stack([x.detach().float() for x in losses]).mean()
        return torch.zeros((), device=self.device)

    def _global_loss(self, loss: torch.Tensor) -> float:
        """Mean loss of the global batch: only last-stage ranks contribute, tp ranks repeat it."""
        # two numbers ride along (jitsave.py): whether this rank heard a save order, its step
        heard = self.jit.heard()
        buf = torch.tensor([0.0, heard.heard, heard.step], dtype=torch.float64, device=loss.device)
        buf[0] = loss.detach().double().reshape(())
        dist.all_reduce(buf)
        self._heard_sums = (float(buf[1]), float(buf[2]))
        return float(buf[0]) / (self.dims.dp * self.dims.tp)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _memory_bytes(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def _dump_grads(self, out: Path) -> None:
        """Test hook: full (unsharded) first-step gradients by parameter name, one file per stage."""
        grads: dict[str, torch.Tensor] = {}
        for part in self.parts:
            for name, p in part.named_parameters():
                g = p.grad
                if g is None:
                    continue
                full = g.full_tensor() if isinstance(g, DTensor) else g
                grads[clean_fqn(name)] = full.detach().float().cpu()
        if self.dp_rank == 0 and self.tp_rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            torch.save(grads, out / f"grads-pp{self.pp_rank}.pt")

    def finish_after_sdc(self, timeout_s: float = 60.0) -> None:
        """An SDC verdict ends the attempt, agreed by every rank, so the ranks can still talk:
        let the saves in flight commit (each marked clean or not when it was taken) and send the
        last heartbeat with their events. Otherwise the newest clean checkpoint, still being
        written when the corruption was seen, is lost and the next attempt restores an older
        one (or none). Bounded; never raises."""
        try:
            wait = getattr(self.checkpointer, "wait", None)
            if callable(wait) and not wait(timeout_s):
                return  # still writing: the attempt ends without it, as before
            self.checkpointer.close()
            forward = getattr(self.checkpointer, "forward_events", None)
            if callable(forward):
                forward(self.ctx)
            self.health.close()
            self.session.close()
        except Exception:
            logging.getLogger(__name__).exception("finishing the checkpoints in flight after the SDC verdict failed")

    def close(self) -> None:
        self.watchdog.stop()
        self.checkpointer.close()
        self.health.close()
        self.session.close()
        self.ft.close()
        # Nobody leaves while a peer may still talk to the store rank 0 hosts.
        dist.barrier()
        dist.destroy_process_group()


def seed_rank_rng(seed: int, rank: int) -> None:
    """Give each rank its own RNG stream, a function of (seed, rank) only."""
    torch.manual_seed((seed * 1_000_003 + rank + 1) & ((1 << 63) - 1))  # CPU and every CUDA device


def _peak_flops(device: torch.device) -> float:
    if device.type != "cuda":
        return 0.0
    if podenv.PEAK_FLOPS.is_set(os.environ):
        return float(podenv.PEAK_FLOPS.get(os.environ))
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), 0.0)


def _identity(env: WorkerEnv) -> sdk.Identity:
    return sdk.Identity(
        rank=env.rank, local_rank=env.local_rank, world_size=env.world_size, procs_per_node=env.procs_per_node,
        pod_index=env.pod_index, node=env.node, mesh_shape=env.mesh_shape,
    )


def _build_health(cfg: TrainerConfig, ctx: hooks.TrainContext) -> hooks.HealthMonitor:
    if not podenv.DISABLE_HEALTH.get(os.environ):
        try:
            from railyard_trainer.health import build_health_monitor
        except ImportError as exc:
            log_event("fallback", rank=ctx.rank, what="health", reason=repr(exc))
        else:
            return build_health_monitor(cfg, ctx)
    return hooks.NullHealth()
