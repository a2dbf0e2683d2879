"""SDC catch rates per parallel layout: bit flips injected into the real trainer, multi-rank.

Each layout (FSDP, dp x tp, pp x dp, HSDP) runs as real gloo ranks on CPU: the trainer's own
``Trainer`` (mesh, parallelize, pipeline, optimizer, train loop order, health monitor), with a
boundary "checkpointer" that is due every ``interval`` steps (so the loop verifies before it,
as before a real save) and an injector in place of the fault injector. Every trial restores a
snapshot taken at a boundary, flips one bit of one element of one tensor on one rank at a
step before the next boundary, and counts the flip **caught** if the health package raised an
SDC verdict or the boundary's ``checks_passed`` was false (so that checkpoint would not be
marked clean). Injection points are the trainer's: ``grad`` right after backward (before
clipping and the checks), ``param`` right after the optimizer step. Every rank draws the same
trial plan from one seed, so no coordination is needed beyond the trainer's own collectives.

Used by ``bench/sdc.py`` (the catch-rate table) and ``tests/health``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from railyard.protocol import podenv
from railyard.protocol.ports import free_port
from railyard_trainer.hooks import SDCDetected, TrainContext

#: name -> (processes, pp, tp, HSDP replica groups); dp is derived.
LAYOUTS: dict[str, tuple[int, int, int, int]] = {
    "fsdp": (2, 1, 1, 1),
    "dp_x_tp": (4, 1, 2, 1),
    "pp_x_dp": (4, 2, 1, 1),
    "hsdp": (4, 1, 1, 2),
}
EXPONENT_BITS = (30, 29, 28, 27, 26, 25, 24, 23)
TOP_MANTISSA_BITS = (22, 21, 20, 19)
TARGETS = ("param", "grad")


@dataclass(frozen=True)
class Trial:
    target: str
    bit: int
    #: steps after the boundary at which the flip happens (1..interval)
    at: int
    rank: int
    #: which of the victim rank's tensors / elements, as a fraction in [0, 1)
    tensor_pick: float
    element_pick: float
    #: only tensors whose name contains this (empty: any)
    only: str = ""


@dataclass
class TrialResult:
    layout: str
    target: str
    bit: int
    rank: int
    tensor: str = ""
    before: float = 0.0
    after: float = 0.0
    caught: bool = False
    by: str = ""
    latency_steps: int = -1
    #: not caught, and the state at the checkpoint is bit-identical to the clean run's: the flip
    #: was absorbed (e.g. a tiny value added below the ulp of Adam's moments) and did no harm
    absorbed: bool = False


def plan_trials(
    *,
    targets: tuple[str, ...],
    bits: tuple[int, ...],
    trials: int,
    world: int,
    interval: int,
    seed: int,
    only: str = "",
) -> list[Trial]:
    rng = random.Random(seed)
    out = []
    for target in targets:
        for bit in bits:
            for _ in range(trials):
                out.append(
                    Trial(
                        target,
                        bit,
                        rng.randrange(1, interval + 1),
                        rng.randrange(world),
                        rng.random(),
                        rng.random(),
                        only,
                    )
                )
    return out


class _Boundary:
    """Stands in for the checkpointer: due every ``interval`` steps; records checks_passed."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.passed: dict[int, bool] = {}

    def due(self, step: int) -> bool:
        return step % self.interval == 0

    def maybe_save(self, ctx: TrainContext, *, checks_passed: bool) -> None:
        if self.due(ctx.step):
            self.passed[ctx.step] = checks_passed

    def restore(self, ctx: TrainContext) -> None:
        return None

    def is_saving(self) -> bool:
        return False

    def close(self) -> None:
        return None


class _Injector:
    """Replaces the trainer's fault injector: flips the armed bit at the armed step."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.armed: tuple[int, Trial] | None = None
        self.hit: tuple[str, float, float] | None = None

    def before_step(self, step: int) -> None:
        return None

    def slow_down(self, step: int, compute_s: float) -> float:
        return 0.0

    def slow_factor(self, step: int) -> float:
        return 1.0

    @torch.no_grad()
    def maybe_flip(self, step: int, target: str, parts: list[nn.Module]) -> None:
        if self.armed is None:
            return
        at, trial = self.armed
        if at != step or trial.target != target or trial.rank != self.rank:
            return
        from railyard_trainer.parallelize import clean_fqn

        cands: list[tuple[str, torch.Tensor]] = []
        for part in parts:
            for name, p in part.named_parameters():
                t: Any = p.grad if target == "grad" else p
                if t is None or (trial.only and trial.only not in name):
                    continue
                local = t.to_local() if isinstance(t, DTensor) else t
                if local.numel():
                    cands.append((clean_fqn(name), local))
        if not cands:
            return
        name, local = cands[int(trial.tensor_pick * len(cands))]
        flat = local.view(-1)
        i = int(trial.element_pick * flat.numel())
        cell = flat[i : i + 1]
        before = float(cell.item())
        cell.view(torch.int32).bitwise_xor_(torch.tensor(1 << trial.bit, dtype=torch.int32))
        self.hit = (name, before, float(cell.item()))


def _local_state(trainer: Any) -> dict[str, Any]:
    params = [
        (p.to_local() if isinstance(p, DTensor) else p).detach().clone()
        for part in trainer.parts
        for p in part.parameters()
    ]
    optim = copy.deepcopy(
        [{id_: _clone_state(st) for id_, st in enumerate(o.state.values())} for o in trainer.optimizer.inner]
    )
    monitor = trainer.health
    return {
        "params": params, "optim": optim, "step": trainer.ctx.step, "consumed": trainer.data.consumed,
        "lr_steps": trainer.lr_scheduler.steps_taken,
        "spikes": copy.deepcopy((monitor.grad_spikes, monitor.loss_spikes, monitor.conc_spikes)),
    }


def _clone_state(st: dict[str, Any]) -> dict[str, Any]:
    return {
        k: ((v.to_local() if isinstance(v, DTensor) else v).detach().clone() if isinstance(v, torch.Tensor) else v)
        for k, v in st.items()
    }


@torch.no_grad()
def _restore_local_state(trainer: Any, snap: dict[str, Any]) -> None:
    for p, saved in zip((p for part in trainer.parts for p in part.parameters()), snap["params"], strict=True):
        (p.to_local() if isinstance(p, DTensor) else p).copy_(saved)
        p.grad = None
    for o, saved_states in zip(trainer.optimizer.inner, snap["optim"], strict=True):
        for st, saved in zip(o.state.values(), saved_states.values(), strict=True):
            for k, v in saved.items():
                cur = st[k]
                if isinstance(cur, torch.Tensor):
                    (cur.to_local() if isinstance(cur, DTensor) else cur).copy_(v)
                else:
                    st[k] = v
    trainer.ctx.step = snap["step"]
    trainer.data.consumed = snap["consumed"]
    trainer.lr_scheduler.load_state_dict({"steps_taken": snap["lr_steps"]})
    monitor = trainer.health
    monitor.grad_spikes, monitor.loss_spikes, monitor.conc_spikes = copy.deepcopy(snap["spikes"])
    monitor.reset_after_restore()


def _kind(text: str) -> str:
    return text.split(":")[0].strip()


def layout_worker(
    rank: int, world: int, port: int, layout: str, plan: list[dict[str, Any]], opts: dict[str, Any], out: str
) -> None:
    """One rank of one layout: warm up, then run every trial of ``plan``; rank 0 writes results."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
    )
    for var in (podenv.HEARTBEAT_URL, podenv.DISABLE_HEALTH):
        os.environ.pop(var.name, None)
    os.environ[podenv.PLAIN_CHECKPOINT.name] = podenv.PLAIN_CHECKPOINT.render(True)  # replaced by the boundary below
    torch.set_num_threads(1)
    logging.getLogger("railyard_trainer").setLevel(logging.ERROR)
    from railyard_trainer.config import TrainerConfig
    from railyard_trainer.parallel_dims import ParallelDims
    from railyard_trainer.train import Trainer
    from railyard_trainer.worker_env import WorkerEnv

    _, pp, tp, replicas = LAYOUTS[layout]
    interval = int(opts["interval"])
    cfg = TrainerConfig.from_dict(
        {
            "job": f"sdc-{layout}",
            "trainer": {
                "preset": "tiny",
                "steps": 100_000,
                "batchSize": 8,
                "seqLen": 32,
                "learningRate": 3e-3,
                "warmupSteps": 2,
                "seed": int(opts["seed"]),
                "logEverySteps": 100_000,
                "collectiveTimeoutSeconds": 120,
                "watchdogSeconds": 100,
            },
            "parallelism": {"tensor": tp, "pipeline": pp, "dataReplicas": replicas},
            "health": {"sdc": {"intervalSteps": int(opts.get("sdc_interval", 10_000))}},
        }
    )
    dims = ParallelDims(pp=pp, dp=-1, tp=tp, world_size=world, procs_per_node=world, dp_replicas=replicas)
    env = WorkerEnv(
        rank=rank,
        local_rank=rank,
        world_size=world,
        procs_per_node=world,
        mesh_shape=(dims.pp, dims.dp, dims.tp),
        coords=dims.coordinates(rank),
        config_path="",
        node=f"node-{rank}",
        pod_index=0,
    )
    trainer = Trainer(cfg, env)
    boundary = _Boundary(interval)
    trainer.checkpointer = boundary  # type: ignore[assignment]
    trainer.ctx.extra["checkpointer"] = boundary
    injector = _Injector(rank)
    trainer.faults = injector  # type: ignore[assignment]
    results: list[TrialResult] = []
    false_verdicts: list[str] = []
    unclean: list[int] = []
    clean_steps = 0
    t0 = time.perf_counter()
    try:
        trainer.health.preflight(trainer.ctx)
        for _ in range(int(opts["warmup"])):
            trainer.run_step()
        while trainer.ctx.step % interval:
            trainer.run_step()
        snap = _local_state(trainer)
        # Clean steps first: any verdict or unclean boundary here is a false positive.
        for _ in range(int(opts.get("clean_steps", 0))):
            try:
                trainer.run_step()
            except SDCDetected as exc:
                false_verdicts.append(str(exc)[:200])
                _restore_local_state(trainer, snap)
                trainer.health.preflight(trainer.ctx)
        unclean = [step for step, ok in boundary.passed.items() if not ok]
        clean_steps = int(opts.get("clean_steps", 0))
        # The clean continuation from the snapshot to the next checkpoint: a missed flip whose
        # state there is bit-identical to this one had no effect at all.
        _restore_local_state(trainer, snap)
        trainer.health.preflight(trainer.ctx)
        for _ in range(interval):
            trainer.run_step()
        reference = _fingerprint(trainer)
        for raw in plan:
            trial = Trial(**raw)
            _restore_local_state(trainer, snap)
            trainer.health.preflight(trainer.ctx)
            start = trainer.ctx.step
            injector.armed, injector.hit = (start + trial.at, trial), None
            res = TrialResult(layout, trial.target, trial.bit, trial.rank)
            for k in range(1, interval + 1):
                try:
                    trainer.run_step()
                except SDCDetected as exc:
                    res.caught, res.by, res.latency_steps = True, _kind(str(exc)), k - trial.at
                    break
            else:
                ok = boundary.passed.get(trainer.ctx.step, True)
                if not ok:
                    taint = trainer.health._taint or ""
                    res.caught, res.by, res.latency_steps = (
                        True,
                        "not clean: " + _kind(taint.split(":", 1)[-1]),
                        interval - trial.at,
                    )
            hit = _gather_hit(injector.hit, trial.rank)
            if hit is not None:
                res.tensor, res.before, res.after = hit
            if not res.caught:
                res.absorbed = _fingerprint(trainer) == reference
            results.append(res)
    finally:
        wall = time.perf_counter() - t0
        if rank == 0:
            Path(out).write_text(
                json.dumps(
                    {
                        "layout": layout,
                        "wall_s": wall,
                        "results": [asdict(r) for r in results],
                        "clean_steps": clean_steps,
                        "clean_false_verdicts": false_verdicts,
                        "clean_unclean_checkpoints": unclean,
                    }
                )
            )
        trainer.close()


def _fingerprint(trainer: Any) -> list[int]:
    """Every rank's checksum of its parameters and optimizer state (collective)."""
    import torch.distributed as dist

    from railyard_trainer.health.checks import tensor_checksum

    tensors = [p for part in trainer.parts for p in part.parameters()]
    for o in trainer.optimizer.inner:
        for st in o.state.values():
            tensors.extend(v for _, v in sorted(st.items()) if isinstance(v, torch.Tensor))
    objs: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(objs, tensor_checksum(tensors))
    return [int(x) for x in objs]


def _gather_hit(hit: tuple[str, float, float] | None, victim: int) -> tuple[str, float, float] | None:
    import torch.distributed as dist

    objs: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(objs, hit)
    return objs[victim]


def run_layout(layout: str, trials: list[Trial], out: Path, *, interval: int = 2, warmup: int = 20, seed: int = 0,
               sdc_interval: int = 10_000, clean_steps: int = 0) -> dict[str, Any]:
    """Run ``clean_steps`` without flips (false positives), then ``trials``, on ``layout``
    (spawns its ranks); returns what rank 0 recorded."""
    from railyard_trainer.zygote import spawn_ranks

    nproc = LAYOUTS[layout][0]
    opts = {
        "interval": interval,
        "warmup": warmup,
        "seed": seed,
        "sdc_interval": sdc_interval,
        "clean_steps": clean_steps,
    }
    spawn_ranks(layout_worker, (nproc, free_port(), layout, [asdict(t) for t in trials], opts, str(out)), nproc)
    data: dict[str, Any] = json.loads(out.read_text())
    return data


@dataclass
class CatchTable:
    """layout -> target -> bit -> [flips that changed the state, caught, absorbed]."""

    cells: dict[str, dict[str, dict[int, list[int]]]] = field(default_factory=dict)
    by: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, r: dict[str, Any]) -> None:
        cell = self.cells.setdefault(r["layout"], {}).setdefault(r["target"], {}).setdefault(int(r["bit"]), [0, 0, 0])
        if r.get("absorbed"):
            cell[2] += 1
            return
        cell[0] += 1
        cell[1] += bool(r["caught"])
        if r["caught"]:
            by = self.by.setdefault(r["layout"], {})
            by[r["by"]] = by.get(r["by"], 0) + 1
