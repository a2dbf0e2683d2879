"""Known-answer test and cross-replica checksums across real ranks (3 gloo processes on CPU)."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from railyard.protocol.ports import free_port as _free_port

pytestmark = pytest.mark.torch

WORLD = 3


def _worker(rank: int, port: int, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    os.environ.pop("RAILYARD_HEARTBEAT_URL", None)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, distribute_tensor

        from railyard_trainer.health import build_health_monitor
        from railyard_trainer.health import monitor as monitor_mod
        from railyard_trainer.hooks import SDCDetected, TrainContext

        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp_replicate",))
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 8)
        for name, p in list(model.named_parameters()):
            setattr(model, name, torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Replicate()])))
        ctx = TrainContext(
            rank=rank, local_rank=0, world_size=WORLD, node=f"node-{rank}", pod_index=rank, job="j", attempt=0,
            dims=None, mesh=mesh, model_parts=[model], optimizer=None, lr_scheduler=None, data=None,
        )
        m = build_health_monitor({"health": {"sdc": {"intervalSteps": 5}}}, ctx)
        m.preflight(ctx)  # everyone agrees at the start
        real = monitor_mod.known_answer_checksum
        for scenario in ("kat", "replica"):
            if scenario == "kat" and rank == 2:
                monitor_mod.known_answer_checksum = lambda device, **kw: real(device, **kw) ^ 1  # type: ignore[assignment]
            if scenario == "replica":
                monitor_mod.known_answer_checksum = real  # type: ignore[assignment]
                if rank == 1:
                    local = model.weight.to_local()
                    with torch.no_grad():
                        local.view(-1)[5] = local.view(-1)[5] * -1.0  # a sign flip: no magnitude change
            ctx.step += 5
            try:
                m.verify(ctx)  # the collective checks and the agreement on their verdict
                out.put((scenario, rank, "passed", -1, ""))
            except SDCDetected as exc:
                out.put((scenario, rank, str(exc).split(":")[0], exc.rank, exc.node))
        m.close()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def outcomes() -> dict[tuple[str, int], tuple[str, int, str]]:
    import multiprocessing

    # forked from a server that imported torch and this module once (not once per rank)
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", __name__])
    ctx = mp.get_context("forkserver")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, q)) for r in range(WORLD)]
    for p in procs:
        p.start()
    got = {}
    for _ in range(2 * WORLD):
        scenario, rank, what, suspect, node = q.get(timeout=180)
        got[(scenario, rank)] = (what, suspect, node)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return got


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_known_answer_majority_names_the_odd_rank_on_every_rank(outcomes: dict[tuple[str, int], tuple[str, int, str]]) -> None:
    assert {r: outcomes[("kat", r)][:2] for r in range(WORLD)} == {r: ("kat", 2) for r in range(WORLD)}
    assert outcomes[("kat", 2)][2] == "node-2" and outcomes[("kat", 0)][2] == ""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_sign_flip_in_one_replica_is_caught_by_the_replica_checksum(outcomes: dict[tuple[str, int], tuple[str, int, str]]) -> None:
    assert {r: outcomes[("replica", r)][:2] for r in range(WORLD)} == {r: ("replica_checksum", 1) for r in range(WORLD)}
    assert outcomes[("replica", 1)][2] == "node-1"
