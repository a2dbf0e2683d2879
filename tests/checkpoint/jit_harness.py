"""The just-in-time save's agreement on gloo ranks (imported by spawned ranks): each rank reads its
own launcher's order file (railyard_trainer.jitsave), the step's all-reduce carries the two numbers
as the train loop's loss all-reduce does, and the ranks save to the memory tier through the
CheckpointManager's own save path at the step they agreed on."""

from __future__ import annotations

from pathlib import Path

import harness
import torch
import torch.distributed as dist

from railyard_trainer.checkpoint import build_checkpointer
from railyard_trainer.inplace import write_save_order
from railyard_trainer.jitsave import SaveOrderWatch


def jit_scenario(rank: int, world: int, port: int, tmp_s: str, order_step: int, hear_after: str) -> None:
    """``hear_after``: comma-separated, per rank, the step after which its launcher writes the order."""
    tmp = Path(tmp_s)
    mesh, pg = harness.init(rank, world, port)
    harness.tier_env(tmp, rank)  # one pod per rank: each its own memory tier
    ctx = harness.build_ctx(mesh, seed=0, job="jit")
    manager = build_checkpointer(harness.ckpt_config(memory=5, local=100, shared=100), ctx, process_group=pg)
    order = tmp / f"save-a0-rank{rank}.json"
    watch = SaveOrderWatch(str(order), attempt=0)
    hear_at = int(hear_after.split(",")[rank])
    saved_at: list[int] = []
    for _ in range(8):  # (memory keeps 2: the save and the periodic step 5)
        if ctx.step == hear_at:
            write_save_order(order, attempt=0, step=order_step)
        harness.train_step(ctx)
        heard = watch.heard()
        buf = torch.tensor([0.0, heard.heard, heard.step], dtype=torch.float64)
        dist.all_reduce(buf)
        manager.maybe_save(ctx, checks_passed=True)
        if watch.save_now(ctx.step, heard=float(buf[1]), step_sum=float(buf[2]), world=world):
            memory = [t for t in manager.tiers if t.name == "memory"]
            if not memory[0].due(ctx.step):
                manager.save(ctx, tiers=memory, checks_passed=True)
            saved_at.append(ctx.step)
        manager.wait(60)
    events = manager.drain_events()
    manager.close()
    mine = tmp / "memory" / f"node-{rank}" / "jit"
    # the manifest (the commit) is written once, beside rank 0's shard; each rank's shard in its own tier
    committed = sorted(int(p.parent.name[5:]) for p in (tmp / "memory" / "node-0" / "jit").glob("step-*/manifest.json"))
    shards = sorted(int(p.parent.name[5:]) for p in mine.glob(f"step-*/rank-{rank:05d}") if any(p.iterdir()))
    harness.record(tmp, "jit", {
        "saved_at": saved_at, "committed": committed, "shards": shards,
        "events": [[e.tier, e.step, e.ok, e.sdc_passed] for e in events if e.kind == "save"],
    })
