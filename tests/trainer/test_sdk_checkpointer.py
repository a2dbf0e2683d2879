"""The SDK's ``Checkpointer`` (the tiers without DCP in the program): a program saves on the
tiers' schedule, a second run restores the newest verified checkpoint (model, optimizer state)
and ends bit for bit where an uninterrupted run ends. One rank, gloo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from railyard.protocol.ports import free_port

from .launch import launcher_env

pytestmark = [pytest.mark.torch, pytest.mark.timeout(240)]

PROGRAM = """if True:
    import json, sys
    import torch, torch.distributed as dist
    from railyard_trainer import sdk as railyard
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    steps = int(sys.argv[1])
    ckpt = railyard.Checkpointer(model, opt, total_steps=steps)
    start = ckpt.restore()
    saved = []
    for step in range((start.step if start else 0) + 1, steps + 1):
        loss = model(torch.full((2, 4), float(step))).pow(2).sum()
        loss.backward(); opt.step(); opt.zero_grad()
        railyard.report_step(step, loss=loss.item())
        if ckpt.maybe_save(step):
            saved.append(step)
    assert ckpt.wait(120)
    print(json.dumps({"start": start and [start.step, start.tier, start.loaded], "saved": saved,
                      "weight": model.weight.flatten().tolist()}))
    railyard.close()
    dist.destroy_process_group()
"""


def _uninterrupted(steps: int) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    for step in range(1, steps + 1):
        model(torch.full((2, 4), float(step))).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    return [float(x) for x in model.weight.flatten().tolist()]


def test_a_program_resumes_from_the_tiers_where_it_would_have_been(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"job": "ck", "checkpoint": {"memory": {"intervalSteps": 3}, "local": {"enabled": False},
                                                           "shared": {"enabled": False}}}))
    env = launcher_env(RAILYARD_CONFIG=str(cfg), RAILYARD_CHECKPOINT_MEMORY_DIR=str(tmp_path / "m"),
                       MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    env.pop("RAILYARD_PLAIN_CHECKPOINT", None)

    def run(steps: int) -> dict[str, object]:
        out = subprocess.run([sys.executable, "-c", PROGRAM, str(steps)], env={**env, "MASTER_PORT": str(free_port())},
                             capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr[-4000:]
        return json.loads(out.stdout.splitlines()[-1])

    first = run(4)
    assert (first["start"], first["saved"]) == (None, [3, 4]), "the memory interval, and the last step (total_steps)"
    assert sorted(p.name for p in (tmp_path / "m" / "ck").iterdir()) == ["step-00000003", "step-00000004"]
    second = run(7)
    assert second["start"] == [4, "memory", True] and second["saved"] == [6, 7]
    assert second["weight"] == _uninterrupted(7), "model and optimizer state restored exactly"
    assert os.path.isfile(tmp_path / "m" / "ck" / "step-00000007" / "manifest.json")


CHECKED = """if True:
    import json, sys
    import torch, torch.distributed as dist
    from railyard_trainer import sdk as railyard
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    steps, corrupt_at = int(sys.argv[1]), int(sys.argv[2])
    ckpt = railyard.Checkpointer(model, opt, total_steps=steps)
    start = ckpt.restore()
    checks = {}
    for step in range((start.step if start else 0) + 1, steps + 1):
        loss = model(torch.full((2, 4), float(step))).pow(2).sum()
        loss.backward(); opt.step(); opt.zero_grad()
        railyard.report_step(step, loss=loss.item())
        if step == corrupt_at:  # what a corrupted gradient squared into Adam's second moment leaves
            next(iter(opt.state.values()))["exp_avg_sq"].view(-1)[0] = float("inf")
        checks[step] = railyard.health_check(step=step, optimizer=opt)
        ckpt.maybe_save(step)
    assert ckpt.wait(120)
    print(json.dumps({"start": start and [start.step, start.tier], "checks": checks}))
    railyard.close()
    dist.destroy_process_group()
"""


def test_a_failed_health_check_leaves_later_checkpoints_unclean_and_the_restore_skips_them(tmp_path: Path) -> None:
    """The SDK's health_check on its failing path: optimizer state turned non-finite at step 4
    fails the check (False, not an exception: no rank is named), the step-6 checkpoint is written
    but not marked SDC-clean, and the next run restores step 3, the newest clean one."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"job": "hc", "checkpoint": {"memory": {"intervalSteps": 3}, "local": {"enabled": False},
                                                           "shared": {"enabled": False}}}))
    env = launcher_env(RAILYARD_CONFIG=str(cfg), RAILYARD_CHECKPOINT_MEMORY_DIR=str(tmp_path / "m"), RAILYARD_DISABLE_HEALTH="0",
                       MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    env.pop("RAILYARD_PLAIN_CHECKPOINT", None)

    def run(steps: int, corrupt_at: int) -> dict[str, object]:
        out = subprocess.run([sys.executable, "-c", CHECKED, str(steps), str(corrupt_at)], env={**env, "MASTER_PORT": str(free_port())},
                             capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr[-4000:]
        return json.loads(out.stdout.splitlines()[-1])

    first = run(6, 4)
    assert first["checks"] == {"1": True, "2": True, "3": True, "4": False, "5": False, "6": False}, first
    manifests = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "m" / "hc").glob("step-*/manifest.json")}
    assert {k: m["sdc_passed"] for k, m in manifests.items()} == {"step-00000003": True, "step-00000006": False}, manifests
    second = run(8, 0)
    assert second["start"] == [3, "memory"], "the unclean step 6 is skipped for the newest clean checkpoint"
    assert all(second["checks"].values()), second  # type: ignore[union-attr]
