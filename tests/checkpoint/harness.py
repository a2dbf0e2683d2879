"""Multi-process scenarios for the checkpoint tests (imported by spawned gloo ranks).

A small stand-in model (an MLP sharded with FSDP2 ``fully_shard`` over a CPU gloo mesh), the
trainer's WarmupCosine schedule and a stateful counter data loader stand in for the trainer;
every rank plays a pod's process. Each scenario writes what it observed into
``<tmp>/result-<name>-rank<r>.json``; the tests assert on those values.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from railyard.protocol.ports import free_port
from railyard_trainer.checkpoint import CheckpointManager, NoVerifiedCheckpoint, build_checkpointer
from railyard_trainer.hooks import TrainContext
from railyard_trainer.train_state import WarmupCosine

GLOBAL_BATCH = 8
PROCS_PER_POD = 2


class CounterData:
    """Batches are a pure function of the global sample position (like the trainer's loader)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world, self.position = rank, world, 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + self.position)
        x = torch.randn(GLOBAL_BATCH, 16, generator=g)
        y = torch.randn(GLOBAL_BATCH, 8, generator=g)
        self.position += GLOBAL_BATCH
        per = GLOBAL_BATCH // self.world
        sl = slice(self.rank * per, (self.rank + 1) * per)
        return x[sl], y[sl]

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


class FakeMonitor:
    """The health monitor's reporting API (note_checkpoint / note_restore)."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.restored: list[Any] = []

    def note_checkpoint(self, event: Any) -> None:
        self.events.append(event)

    def note_restore(self, tier: str, step: int) -> None:
        self.restored.append([tier, step])


def build_ctx(mesh: DeviceMesh, *, seed: int, job: str, attempt: int = 0) -> TrainContext:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 8))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = WarmupCosine(opt, peak_lr=1e-2, warmup_steps=2, total_steps=20)
    torch.manual_seed(seed * 1000 + rank)  # as the trainer: a stream of each rank's own
    return TrainContext(
        rank=rank, local_rank=rank % PROCS_PER_POD, world_size=world, node=f"node-{rank // PROCS_PER_POD}",
        pod_index=rank // PROCS_PER_POD, job=job, attempt=attempt,
        dims=SimpleNamespace(pp=1, dp=world, tp=1), mesh=mesh, model_parts=[model], optimizer=opt,
        lr_scheduler=sched, data=CounterData(rank, world),
    )


def train_step(ctx: TrainContext) -> None:
    model = ctx.model_parts[0]
    x, y = ctx.data.next_batch()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    assert ctx.optimizer is not None
    ctx.optimizer.step()
    ctx.lr_scheduler.step()
    ctx.optimizer.zero_grad()
    ctx.step += 1


def full_state(ctx: TrainContext) -> dict[str, torch.Tensor]:
    """Unsharded parameters and optimizer state (collective)."""
    out: dict[str, torch.Tensor] = {}
    model = ctx.model_parts[0]
    assert ctx.optimizer is not None
    for name, p in model.named_parameters():
        out[f"param.{name}"] = _full(p)
        for k, v in ctx.optimizer.state.get(p, {}).items():
            out[f"optim.{name}.{k}"] = _full(v) if isinstance(v, torch.Tensor) else torch.tensor(v)
    return out


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, Any]:
    same_keys = sorted(a) == sorted(b)
    diffs = [float((a[k].float() - b[k].float()).abs().max()) for k in a if k in b]
    return {"same_keys": same_keys, "n": len(a), "equal": same_keys and all(torch.equal(a[k], b[k]) for k in a),
            "max_diff": max(diffs) if diffs else -1.0}


def trainer_view(ctx: TrainContext) -> dict[str, Any]:
    return {"step": ctx.step, "position": ctx.data.position, "lr_steps": ctx.lr_scheduler.steps_taken}


def tier_env(tmp: Path, pod: int, *, shared: Path | None = None) -> None:
    os.environ["RAILYARD_CHECKPOINT_MEMORY_DIR"] = str(tmp / "memory" / f"node-{pod}")
    os.environ["RAILYARD_CHECKPOINT_LOCAL_DIR"] = str(tmp / "local" / f"node-{pod}")
    os.environ["RAILYARD_CHECKPOINT_SHARED_DIR"] = str(shared or tmp / "shared")


def ckpt_config(*, memory: int = 2, local: int = 3, shared: int = 3, keep: int = 2, restore: Any = None) -> dict[str, Any]:
    return {
        "checkpoint": {
            "memory": {"enabled": True, "intervalSteps": memory, "keep": keep, "replicate": True},
            "local": {"enabled": True, "intervalSteps": local, "keep": keep},
            "shared": {"enabled": True, "intervalSteps": shared, "keep": keep},
            "timeoutSeconds": 60,
        },
        "restore": restore,
    }


def init(rank: int, world: int, port: int) -> tuple[DeviceMesh, dist.ProcessGroup]:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (world,))
    pg = dist.new_group(backend="gloo", timeout=timedelta(seconds=60))
    return mesh, pg


def record(tmp: Path, name: str, data: dict[str, Any]) -> None:
    (tmp / f"result-{name}-rank{dist.get_rank()}.json").write_text(json.dumps(data, default=str))


def local_weight_bytes(ctx: TrainContext) -> bytes:
    """This rank's shard of the second layer's weight, as stored in its checkpoint file."""
    w = ctx.model_parts[0][2].weight
    local = w.to_local() if isinstance(w, DTensor) else w
    return bytes(local.detach().contiguous().numpy().tobytes())


def flip_inside(path: Path, pattern: bytes) -> None:
    """Flip the lowest mantissa bit of one float inside ``pattern``: the file still loads."""
    data = bytearray(path.read_bytes())
    i = data.find(pattern)
    assert i >= 0, f"{path}: tensor bytes not found"
    data[i + (len(pattern) // 8) * 4] ^= 0x01
    path.write_bytes(bytes(data))


def run(fn: Callable[..., None], world: int, *args: Any) -> None:
    from railyard_trainer.zygote import spawn_ranks

    spawn_ranks(fn, (world, free_port(), *args), world)


# ----------------------------------------------------------------------------- scenarios


def main_scenarios(rank: int, world: int, port: int, tmp_s: str) -> None:
    """4 ranks = 2 pods x 2: save/restore equality, replica recovery, corruption fallback,
    SDC-suspect skip, failing shared tier; writes the step-6 reference for the reshard test."""
    tmp = Path(tmp_s)
    mesh, pg = init(rank, world, port)
    pod = rank // PROCS_PER_POD
    tier_env(tmp, pod)

    def manager(ctx: TrainContext, **cfg: Any) -> CheckpointManager:
        return build_checkpointer(ckpt_config(**cfg), ctx, process_group=pg)

    # -- uninterrupted run with saves: memory every 2 (keep 2), local and shared every 3.
    ctx = build_ctx(mesh, seed=0, job="main")
    m1 = manager(ctx)
    fresh = m1.restore(ctx)
    refs: dict[int, dict[str, torch.Tensor]] = {}
    views: dict[int, dict[str, Any]] = {}
    shard_bytes: dict[int, bytes] = {}
    blocked_during: list[bool] = []
    for _ in range(8):
        train_step(ctx)
        m1.maybe_save(ctx, checks_passed=True)
        blocked_during.append(m1.is_saving())
        # Steps here take milliseconds: let each save finish before the next is due (a save due
        # while one is running is skipped, see test_saves_do_not_queue).
        m1.wait(60)
        if ctx.step in (6, 8):
            refs[ctx.step] = full_state(ctx)
            views[ctx.step] = trainer_view(ctx)
            shard_bytes[ctx.step] = local_weight_bytes(ctx)
        if ctx.step == 8:
            # what this rank's RNG gives right after the step-8 snapshot (each rank its own)
            rng8 = torch.rand(4).tolist()
    finished = m1.wait(60)
    for _ in range(2):  # steps 9, 10 without saves: the continuation reference
        train_step(ctx)
    refs[10] = full_state(ctx)
    events = m1.drain_events()
    m1.close()
    if rank == 0:
        torch.save({"ref6": refs[6], "view6": views[6]}, tmp / "ref6.pt")
    committed = {
        tier: sorted(int(p.parent.name[5:]) for p in (tmp / tier / f"node-{pod}" / "main").glob("step-*/manifest.json"))
        for tier in ("memory", "local")
    }
    committed["shared"] = sorted(int(p.parent.name[5:]) for p in (tmp / "shared" / "main").glob("step-*/manifest.json"))
    record(tmp, "save", {
        "fresh_restore": fresh is None, "finished": finished, "committed": committed,
        "events": [[e.tier, e.step, e.ok, e.bytes, e.blocked_s, e.duration_s] for e in events],
        "saving_seen": any(blocked_during),
        "planned": [[h.tier, h.step, h.planned] for h in m1.history],
    })

    # -- restore into a differently initialised model: equals step 8, then continues like 9-10.
    ctx2 = build_ctx(mesh, seed=123, job="main", attempt=1)
    monitor = FakeMonitor()
    ctx2.extra["health_monitor"] = monitor
    m2 = build_checkpointer(ckpt_config(restore={"tier": "memory", "step": 8, "lastStep": 11}), ctx2, process_group=pg)
    res = m2.restore(ctx2)
    rng_after = torch.rand(4).tolist()
    eq8 = compare(full_state(ctx2), refs[8])
    view_after = trainer_view(ctx2)
    for _ in range(2):
        train_step(ctx2)
    eq10 = compare(full_state(ctx2), refs[10])
    restore_events = [[e.kind, e.tier, e.step, e.steps_lost] for e in monitor.events]
    m2.close()
    record(tmp, "restore", {
        "tier": res.tier if res else None, "step": res.step if res else None, "eq8": eq8, "eq10": eq10,
        "view": view_after, "view_ref": views[8], "events": restore_events, "noted": monitor.restored,
        "rng_restored": rng_after == rng8, "rng": rng_after,
        "left_to_drain": len(m2.drain_events()),
    })

    # -- node lost: pod 1's memory tier wiped; its shards come from pod 0's replica.
    dist.barrier()
    if rank == 2:
        shutil.rmtree(tmp / "memory" / "node-1")
    dist.barrier()
    ctx3 = build_ctx(mesh, seed=7, job="main", attempt=2)
    m3 = manager(ctx3)
    res3 = m3.restore(ctx3)
    eq = compare(full_state(ctx3), refs[8])
    healed = (tmp / "memory" / f"node-{pod}" / "main" / "step-00000008" / f"rank-{rank:05d}" / ".metadata").exists()
    m3.close()
    record(tmp, "replica", {"tier": res3.tier if res3 else None, "step": res3.step if res3 else None,
                            "eq8": eq, "healed": healed, "detail": res3.detail if res3 else ""})

    # -- silently corrupt memory step 8 (one bit inside rank 0's weights, in its only copy
    #    with a manifest, loaded in place; the file still loads): only the checksum can
    #    catch it -> step 6.
    patterns: list[Any] = [None] * world
    dist.all_gather_object(patterns, shard_bytes[8])
    dist.barrier()
    if rank == 0:
        flip_inside(tmp / "memory" / "node-0" / "main" / "step-00000008" / "rank-00000" / "__0_0.distcp", patterns[0])
    dist.barrier()
    ctx4 = build_ctx(mesh, seed=8, job="main", attempt=3)
    m4 = manager(ctx4)
    res4 = m4.restore(ctx4)
    eq4 = compare(full_state(ctx4), refs[6])
    view4 = trainer_view(ctx4)
    m4.close()
    # -- and corrupt every memory copy of step 6 as well: the local tier's step 6 is next.
    dist.all_gather_object(patterns, shard_bytes[6])
    dist.barrier()
    if rank == 0:
        flip_inside(tmp / "memory" / "node-0" / "main" / "step-00000006" / "rank-00001" / "__0_0.distcp", patterns[1])
    dist.barrier()
    ctx5 = build_ctx(mesh, seed=9, job="main", attempt=4)
    m5 = manager(ctx5)
    res5 = m5.restore(ctx5)
    eq5 = compare(full_state(ctx5), refs[6])
    m5.close()
    record(tmp, "corrupt", {
        "first": [res4.tier, res4.step] if res4 else None, "first_eq6": eq4, "first_view": view4,
        "view_ref": views[6], "first_detail": res4.detail if res4 else "",
        "second": [res5.tier, res5.step] if res5 else None, "second_eq6": eq5,
    })

    # -- SDC-suspect step and a failing shared tier (a file where its directory should be) plus
    #    one rank's injected IOError on the local tier: training goes on, failures are events.
    bad_shared = tmp / "not-a-dir"
    if rank == 0:
        bad_shared.write_text("x")
    dist.barrier()
    tier_env(tmp, pod, shared=bad_shared / "shared")
    ctx6 = build_ctx(mesh, seed=0, job="flaky")
    faults = {"before_write": _fail_local_on_rank3}
    m6 = build_checkpointer(ckpt_config(memory=2, local=2, shared=2), ctx6, process_group=pg, faults=faults)
    for _ in range(6):
        train_step(ctx6)
        m6.maybe_save(ctx6, checks_passed=ctx6.step != 6)
    m6.wait(60)
    ev6 = [[e.tier, e.step, e.ok, e.sdc_passed, e.detail[:200]] for e in m6.drain_events()]
    m6.close()
    ctx7 = build_ctx(mesh, seed=5, job="flaky", attempt=1)
    m7 = build_checkpointer(ckpt_config(memory=2, local=2, shared=2), ctx7, process_group=pg)
    res7 = m7.restore(ctx7)
    m7.close()
    record(tmp, "flaky", {"steps_done": ctx6.step, "events": ev6,
                          "restored": [res7.tier, res7.step] if res7 else None})
    dist.barrier()
    dist.destroy_process_group()


def _fail_local_on_rank3(tier: str, step: int, rank: int) -> None:
    if tier == "local" and rank == 3:
        raise OSError(28, "No space left on device (injected)")


def kill_scenario(rank: int, world: int, port: int, tmp_s: str) -> None:
    """2 pods x 1 rank: step 2 saved; rank 1 dies in the middle of the step-4 memory save."""
    global PROCS_PER_POD
    PROCS_PER_POD = 1
    tmp = Path(tmp_s)
    mesh, pg = init(rank, world, port)
    tier_env(tmp, rank)
    ctx = build_ctx(mesh, seed=0, job="killed")
    faults = {"after_write": functools.partial(_die_on_rank1_step4, tmp)}
    cfg = ckpt_config(memory=2, local=100, shared=100)
    m = build_checkpointer(cfg, ctx, process_group=pg, faults=faults)
    for _ in range(4):
        train_step(ctx)
        m.maybe_save(ctx, checks_passed=True)
        if ctx.step == 2:
            m.wait(60)
            (tmp / f"kill-step2-rank{rank}.ok").write_text(json.dumps(full_state(ctx)["param.0.weight"].tolist()))
    m.wait(60)
    # Rank 1 is gone; rank 0 fails on its next collective.
    train_step(ctx)


def _die_on_rank1_step4(tmp: Path, tier: str, step: int, rank: int) -> None:
    """Rank 1 dies once both ranks wrote their step-4 memory shards (the save is mid-way: the
    replicas and the commit are still to come). Rank 1 waits for rank 0's write: its death ends
    rank 0's process too, and a loaded machine could otherwise kill rank 0 before it wrote."""
    if tier != "memory" or step != 4:
        return
    written = tmp / "kill-step4-rank0-wrote"
    if rank == 0:
        written.touch()
        return
    deadline = time.monotonic() + 120  # only catches a hang
    while not written.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    os._exit(137)


def restore_scenario(rank: int, world: int, port: int, tmp_s: str, main_tmp_s: str) -> None:
    """2 ranks: the killed job restores its last committed step; the 4-rank job's shared
    checkpoint restores onto 2 ranks (DCP resharding)."""
    global PROCS_PER_POD
    PROCS_PER_POD = 1
    tmp, main_tmp = Path(tmp_s), Path(main_tmp_s)
    mesh, pg = init(rank, world, port)
    tier_env(tmp, rank)
    ctx = build_ctx(mesh, seed=3, job="killed", attempt=1)
    m = build_checkpointer(ckpt_config(memory=2, local=100, shared=100), ctx, process_group=pg)
    res = m.restore(ctx)
    w = full_state(ctx)["param.0.weight"].tolist()
    m.close()
    saved_w = json.loads((tmp / "kill-step2-rank0.ok").read_text())
    # The operator says step 5 exists, but nothing verifiable does: refuse to start fresh.
    ctx0 = build_ctx(mesh, seed=3, job="vanished", attempt=1)
    m0 = build_checkpointer(ckpt_config(restore={"tier": "memory", "step": 5}), ctx0, process_group=pg)
    try:
        m0.restore(ctx0)
        refused: list[Any] = ["restored anyway"]
    except NoVerifiedCheckpoint as exc:
        refused = [exc.exit_code, str(exc)]
    m0.close()
    step4 = tmp / "memory" / f"node-{rank}" / "killed" / "step-00000004"
    # Reshard: the main run's shared tier (written by 4 ranks) onto 2 ranks; node tiers of
    # pod 0 are visible too but were written with 4 ranks, so they are rejected.
    tier_env(main_tmp, 0)
    ctx2 = build_ctx(mesh, seed=11, job="main", attempt=9)
    m2 = build_checkpointer(ckpt_config(), ctx2, process_group=pg)
    res2 = m2.restore(ctx2)
    ref = torch.load(main_tmp / "ref6.pt")
    eq = compare(full_state(ctx2), ref["ref6"])
    m2.close()
    record(tmp, "after_kill", {
        "restored": [res.tier, res.step] if res else None, "weights_equal_step2": w == saved_w,
        "refused": refused,
        "step4_dir_exists": step4.exists(), "step4_has_files": any(step4.rglob("*.distcp")) if step4.exists() else False,
        "step4_manifest": (step4 / "manifest.json").exists(),
        "reshard": [res2.tier, res2.step] if res2 else None, "reshard_eq6": eq,
        "reshard_view": trainer_view(ctx2), "view_ref": ref["view6"],
    })
    dist.barrier()
    dist.destroy_process_group()


def reshard_source_scenario(rank: int, world: int, port: int, tmp_s: str) -> None:
    """4 ranks = 2 pods x 2 train 4 steps with the memory tier every 2 (each pod's shards also
    replicated to the other pod's node); the step-4 state is the reference."""
    tmp = Path(tmp_s)
    mesh, pg = init(rank, world, port)
    tier_env(tmp, rank // PROCS_PER_POD)
    ctx = build_ctx(mesh, seed=0, job="grow")
    m = build_checkpointer(ckpt_config(memory=2, local=100, shared=100), ctx, process_group=pg)
    for _ in range(4):
        train_step(ctx)
        m.maybe_save(ctx, checks_passed=True)
        m.wait(60)  # millisecond steps: no save is due while one runs
    ref = full_state(ctx)
    m.close()
    if rank == 0:
        torch.save({"ref4": ref, "view4": trainer_view(ctx)}, tmp / "ref4.pt")
    dist.barrier()
    dist.destroy_process_group()


def node_reshard_scenario(rank: int, world: int, port: int, tmp_s: str) -> None:
    """2 ranks, one per pod, restore the 4-rank memory tier (data-parallel 4 -> 2). Pod 1's
    node lost its own shards of old ranks 2 and 3: they come from the replica on pod 0's node."""
    global PROCS_PER_POD
    PROCS_PER_POD = 1
    tmp = Path(tmp_s)
    mesh, pg = init(rank, world, port)
    tier_env(tmp, rank)
    step_dir = tmp / "memory" / "node-1" / "grow" / "step-00000004"
    if rank == 1:
        for old in ("rank-00002", "rank-00003"):
            shutil.rmtree(step_dir / old)
    dist.barrier()
    ctx = build_ctx(mesh, seed=42, job="grow", attempt=1)
    m = build_checkpointer(ckpt_config(memory=2, local=100, shared=100), ctx, process_group=pg)
    res = m.restore(ctx)
    ref = torch.load(tmp / "ref4.pt")
    eq = compare(full_state(ctx), ref["ref4"])
    m.close()
    record(tmp, "node_reshard", {
        "restored": [res.tier, res.step] if res else None, "detail": res.detail if res else "",
        "eq4": eq, "view": trainer_view(ctx), "view_ref": ref["view4"],
        "healed": sorted(p.name for p in step_dir.iterdir() if p.is_dir()) if rank == 1 else [],
    })
    dist.barrier()
    dist.destroy_process_group()


def queue_scenario(rank: int, world: int, port: int, tmp_s: str) -> None:
    """2 pods x 1 rank, memory tier every 2 steps: rank 1's step-2 save is held (a slow node)
    until its step-4 save has been decided, so step 4 falls due while a save is in flight."""
    global PROCS_PER_POD
    PROCS_PER_POD = 1
    tmp = Path(tmp_s)
    mesh, pg = init(rank, world, port)
    tier_env(tmp, rank)
    ctx = build_ctx(mesh, seed=0, job="queue")
    monitor = FakeMonitor()
    ctx.extra["health_monitor"] = monitor
    release = threading.Event()

    def hold(tier: str, step: int, r: int) -> None:
        if tier == "memory" and step == 2 and r == 1 and not release.wait(60):
            raise TimeoutError("the step-2 save was never released: maybe_save(4) waited for it")

    m = build_checkpointer(ckpt_config(memory=2, local=100, shared=100), ctx, process_group=pg,
                           faults={"before_write": hold})
    pending_at_4 = False
    for _ in range(6):
        train_step(ctx)
        m.maybe_save(ctx, checks_passed=True)
        if ctx.step == 4:
            pending_at_4 = m.is_saving()
            release.set()
            m.wait(60)
    m.wait(60)
    m.forward_events(ctx)
    m.close()
    mem = tmp / "memory" / f"node-{rank}" / "queue"
    record(tmp, "queue", {
        "pending_at_4": pending_at_4,
        "history": [[h.step, h.tier, h.ok, h.skipped] for h in m.history],
        "phases": [list(h.phases) for h in m.history],
        "phases_minus_duration": [sum(h.phases.values()) - h.duration_s for h in m.history],
        "snapshot_is_blocked": [h.phases["snapshot"] == h.blocked_s for h in m.history],
        "skipped": m.skipped_saves,
        "committed": sorted(int(p.parent.name.split("-")[1]) for p in mem.glob("step-*/manifest.json")),
        "dirs": sorted(p.name for p in mem.glob("step-*")),
        "events": [[e.step, e.kind, e.ok] for e in monitor.events],
    })
    dist.barrier()
    dist.destroy_process_group()


def _scheduling(tid: int) -> dict[str, Any]:
    try:
        return {"policy": os.sched_getscheduler(tid), "nice": os.getpriority(os.PRIO_PROCESS, tid)}
    except OSError:  # the thread ended
        return {}


def _background(m: CheckpointManager) -> list[dict[str, Any]]:
    """The scheduling of the checkpoint's background threads (writer and group threads)."""
    return [s for s in (_scheduling(t) for t in m.cpu.tids) if s]


def _until(cond: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.01)


def cpu_class_scenario(rank: int, world: int, port: int, tmp_s: str) -> None:
    """One rank builds a checkpointer per CPU class (its own checkpoint group, as the trainer
    does) and records the scheduling of its background threads (writer, and the threads its
    group started) and of the calling (training) thread: at rest; seen from the writer while
    training waits for its save; seen from the writer while a save has overrun its interval
    (a skip); and after the writer is done."""
    tmp = Path(tmp_s)
    mesh, _ = init(rank, world, port)
    tier_env(tmp, 0)
    out: dict[str, Any] = {}
    memory_only = {"checkpoint": {"memory": {"enabled": True, "intervalSteps": 2, "keep": 2},
                                  "local": {"enabled": False}, "shared": {"enabled": False}}}
    for cls in ("", "auto", "nice", "idle"):
        os.environ["RAILYARD_CHECKPOINT_CPU"] = cls
        seen: dict[str, Any] = {}
        box: list[CheckpointManager] = []

        def hold(tier: str, step: int, rank: int, box: list[CheckpointManager] = box,
                 seen: dict[str, Any] = seen) -> None:
            m = box[0]
            if not m.cpu.idle:
                return
            if step == 2:  # training waits for this save (wait): boosted
                _until(lambda: m.cpu.boosted, "training waited, the threads were not boosted")
                seen["while_waited"] = _background(m)
            elif step == 4:  # held until the step-6 save is skipped (overran): boosted
                _until(lambda: m._overdue, "no skip while the step-4 save was held")
                seen["while_overdue"] = _background(m)

        ctx = build_ctx(mesh, seed=0, job=f"cpu-{cls or 'default'}")
        m = build_checkpointer(memory_only, ctx, faults={"before_write": hold})
        box.append(m)
        seen["class"] = m.cpu.cpu_class
        seen["at_rest"] = _background(m)
        seen["training"] = _scheduling(threading.get_native_id())
        for _ in range(2):
            train_step(ctx)
            m.maybe_save(ctx, checks_passed=True)
        seen["waited"] = m.wait(60)
        for _ in range(4):  # step 4 saves and is held; step 6 is skipped
            train_step(ctx)
            m.maybe_save(ctx, checks_passed=True)
        seen["drained"] = m.wait(60)
        seen["after"] = _background(m)
        seen["boosted_after"] = m.cpu.boosted
        seen["saved"] = [h.step for h in m.history if h.ok]
        seen["skipped"] = m.skipped_saves.get("memory", 0)
        out[cls or "default"] = seen
        m.close()
    record(tmp, "cpu", out)
    dist.destroy_process_group()


def cpu_collectives_scenario(rank: int, world: int, port: int, tmp_s: str) -> None:
    """With the idle class: the scheduling of the checkpoint's background threads at each
    collective the calling (training) thread runs on the checkpoint group, while the manager
    starts (learning the pods) and while it restores; and at rest in between."""
    from railyard_trainer.checkpoint.cpuclass import BackgroundCpu

    tmp = Path(tmp_s)
    mesh, _ = init(rank, world, port)
    tier_env(tmp, 0)
    memory_only = {"checkpoint": {"memory": {"enabled": True, "intervalSteps": 2, "keep": 2},
                                  "local": {"enabled": False}, "shared": {"enabled": False}}}
    cpu = BackgroundCpu("idle")
    training = threading.get_native_id()
    seen: dict[str, list[list[dict[str, Any]]]] = {"start": [], "restore": []}
    phase = ["start"]
    gather = dist.all_gather_object

    def spy(*args: Any, **kwargs: Any) -> Any:
        if threading.get_native_id() == training:
            seen[phase[0]].append([_scheduling(t) for t in cpu.tids])
        return gather(*args, **kwargs)

    dist.all_gather_object = spy  # type: ignore[assignment]
    try:
        ctx = build_ctx(mesh, seed=0, job="cpu-collectives")
        m = build_checkpointer(memory_only, ctx, background=cpu)
        phase[0] = "at_rest"
        at_rest = [_scheduling(t) for t in cpu.tids]
        for _ in range(2):
            train_step(ctx)
            m.maybe_save(ctx, checks_passed=True)
        waited = m.wait(60)
        phase[0] = "restore"
        fresh = build_ctx(mesh, seed=1, job="cpu-collectives", attempt=1)
        res = m.restore(fresh)
        phase[0] = "after"
        after = [_scheduling(t) for t in cpu.tids]
        m.close()
    finally:
        dist.all_gather_object = gather  # type: ignore[assignment]
    record(tmp, "cpu-collectives", {
        "start": seen["start"], "restore": seen["restore"], "at_rest": at_rest, "after": after,
        "waited": waited, "restored_step": res.step if res is not None else None,
    })
    dist.destroy_process_group()


def capture_scenario(rank: int, world: int, port: int, tmp_s: str) -> None:
    """The deferred copy of the parameters and optimizer state (snapshot.Capture):
    - held until training has reached its next optimizer step and waits there: the saved state
      is the save step's, training then steps on, the wait is counted (``stall_s``);
    - held until training's wait times out (``timeoutSeconds`` made 1 s here): training goes
      on, and that save is dropped, never committed torn;
    - ``defer_capture=False`` (the SDK's default): no deferred copy."""
    import dataclasses

    tmp = Path(tmp_s)
    mesh, _ = init(rank, world, port)
    tier_env(tmp, 0)
    memory_only = {"checkpoint": {"memory": {"enabled": True, "intervalSteps": 2, "keep": 4},
                                  "local": {"enabled": False}, "shared": {"enabled": False}}}
    box: list[CheckpointManager] = []
    deferred: list[int] = []

    def hold(tier: str, step: int, r: int) -> None:
        m = box[0]
        cap = m._capture
        assert cap is not None and cap.step == step
        deferred.append(len(cap.pairs))
        if step == 2:  # training stepped on to its optimizer step and waits for this copy
            _until(lambda: cap.waiting, "training did not wait for the copy at its optimizer step")
        elif step == 4:  # training's wait timed out: the copy would mix two steps
            _until(lambda: cap.torn, "training's wait for the copy did not time out")

    ctx = build_ctx(mesh, seed=0, job="capture")
    m = build_checkpointer(memory_only, ctx, faults={"before_capture": hold})
    box.append(m)
    for _ in range(2):
        train_step(ctx)
        m.maybe_save(ctx, checks_passed=True)
    # The step-2 save is queued, its copy held; the state as it is at step 2 (full_state reads
    # the parameters, and changes nothing).
    at_save = full_state(ctx)
    train_step(ctx)  # step 3: its optimizer step waits for the copy
    m.maybe_save(ctx, checks_passed=True)
    waited = m.wait(60)
    stepped_on = compare(full_state(ctx), at_save)
    m.settings = dataclasses.replace(m.settings, timeout_s=1.0)
    train_step(ctx)  # step 4: saves, its copy held until step 5's optimizer step gives up
    m.maybe_save(ctx, checks_passed=True)
    train_step(ctx)
    m.maybe_save(ctx, checks_passed=True)
    drained = m.wait(60)
    m.settings = dataclasses.replace(m.settings, timeout_s=60.0)
    history = [{"step": h.step, "ok": h.ok, "stall_s": h.stall_s, "phases": list(h.phases), "detail": h.detail}
               for h in m.history]
    m.close()
    fresh = build_ctx(mesh, seed=1, job="capture", attempt=1)
    m2 = build_checkpointer(memory_only, fresh)
    res = m2.restore(fresh)
    restored = compare(full_state(fresh), at_save)
    m2.close()
    # The SDK's default: everything copied while training waits.
    ctx3 = build_ctx(mesh, seed=2, job="capture-sync")
    m3 = build_checkpointer(memory_only, ctx3, defer_capture=False)
    for _ in range(2):
        train_step(ctx3)
        m3.maybe_save(ctx3, checks_passed=True)
    sync_capture = m3._capture is not None
    m3.wait(60)
    sync_history = [{"step": h.step, "ok": h.ok, "phases": list(h.phases)} for h in m3.history]
    m3.close()
    mem = tmp / "memory" / "node-0" / "capture"
    record(tmp, "capture", {
        "waited": waited, "drained": drained, "history": history, "stepped_on": stepped_on,
        "restored_step": res.step if res is not None else None, "restored": restored,
        "committed": sorted(int(p.parent.name.split("-")[1]) for p in mem.glob("step-*/manifest.json")),
        "sync_capture": sync_capture, "sync_history": sync_history, "deferred": deferred,
        # every parameter and every tensor of the optimizer state (AdamW: exp_avg, exp_avg_sq, step)
        "deferrable": len(list(ctx.model_parts[0].parameters())) + sum(
            isinstance(v, torch.Tensor) for st in ctx.optimizer.state.values() for v in st.values()),
    })
    dist.barrier()
    dist.destroy_process_group()
