"""The just-in-time save before a planned move (issue 47), launcher and trainer end to end: two
real launchers (two "pods" of one rank each, each its own memory tier) against the operator's real
control endpoint, the test playing the reconcile. The board orders a save at step 3; each
launcher hands the order to its worker, the ranks agree on one step, save it to the memory tier
and hold still; the test then publishes the restart (attempt 1) restoring that step, as the
operator does once the save is committed. Both ranks saved the same step, attempt 0 trained no
step past it, attempt 1 starts right after it: no step trained twice."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.waiting import wait_until

from railyard.logic.jitsave import SaveOrder
from railyard.protocol.control import LauncherState
from railyard.protocol.ports import free_port
from railyard.protocol.ranktable import RankTable

from .launch import BASE_TRAINER, launcher_env, start_launcher
from .test_restarting_in_place import JOB, NS, TOKEN, Operator, finish, operator, table

pytestmark = pytest.mark.torch

__all__ = ["operator"]  # the fixture, shared with the in-place restart tests

#: The save is ordered as soon as both launchers run attempt 0, while their workers still start:
#: it lands within a few steps of ORDERED. Attempt 1 trains every step after the save to STEPS,
#: so every step here is trained once more (400 cost 4 times the CPU for the same assertions).
STEPS = 60
ORDERED = 3


def start_pod(tmp: Path, pod: int, t: RankTable, op: Operator, *, trainer: dict[str, Any]) -> subprocess.Popen[str]:
    name = f"pod-{pod}"
    folder = tmp / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ranktable.json").write_text(t.to_json())
    env = launcher_env(RAILYARD_RANK_TABLE=str(folder / "ranktable.json"), RAILYARD_POD_INDEX=str(pod), RAILYARD_NODE_NAME=t.pods[pod].node,
                       RAILYARD_POD_NAME=name, RAILYARD_HEARTBEAT_TOKEN=TOKEN, RAILYARD_ATTEMPT=str(t.attempt),
                       RAILYARD_CONTROL_URL=op.url, RAILYARD_CHECKPOINT_MEMORY_DIR=str(tmp / "memory" / name))
    env.pop("RAILYARD_PLAIN_CHECKPOINT")  # the tiered checkpointer: its memory tier
    config = {"job": JOB, "namespace": NS, "attempt": t.attempt, "trainer": trainer, "restartWaitSeconds": 90,
              "checkpoint": {"memory": {"intervalSteps": 1000, "keep": 2, "replicate": False},
                             "local": {"enabled": False}, "shared": {"enabled": False}}}
    return start_launcher(folder, [], config, env)


def committed(tmp: Path, pod: int) -> list[int]:
    return sorted(int(p.parent.name[5:]) for p in (tmp / "memory" / f"pod-{pod}" / JOB).glob("step-*/manifest.json"))


def test_an_ordered_save_is_one_step_on_every_rank_and_the_restart_resumes_right_after_it(
    tmp_path: Path, operator: Operator,
) -> None:
    t0, t1 = table(0, free_port()), table(1, free_port())
    trainer = {**BASE_TRAINER, "steps": STEPS, "collectiveTimeoutSeconds": 60, "watchdogSeconds": 45}
    members = {0: "pod-0", 1: "pod-1"}
    operator.call(operator.board.publish, NS, JOB, attempt=0, members=members, table=t0)
    pods = [start_pod(tmp_path, i, t0, operator, trainer=trainer) for i in (0, 1)]
    try:
        wait_until(lambda: (r := operator.reports()) and all(i in r and r[i].state is LauncherState.RUNNING for i in (0, 1)),
                   timeout=120, message="both launchers to run attempt 0",
                   explain=lambda: f"launcher exit codes {[p.poll() for p in pods]}; board {operator.call(operator.board.get, NS, JOB)}")
        operator.call(operator.board.order_save, NS, JOB, SaveOrder(attempt=0, step=ORDERED, requested_at=0.0, nodes=("node-b",)))
        # each launcher passed it on (and is not told again)
        wait_until(lambda: all(r.save_step == ORDERED for r in operator.reports().values()), timeout=60,
                   message="both launchers to acknowledge the save order")
        saved = wait_until(lambda: committed(tmp_path, 0), timeout=180, message="the memory-tier save to commit")
        assert len(saved) == 1 and ORDERED <= saved[0] < STEPS, saved
        step = saved[0]
        operator.call(operator.board.publish, NS, JOB, attempt=1, members=members, table=t1,
                      restore={"tier": "memory", "step": step, "lastStep": step})
        results = [finish(p) for p in pods]
    finally:
        for p in pods:
            if p.poll() is None:
                p.kill()
    for i, (code, _, err) in enumerate(results):
        assert code == 0, f"pod {i}: {err[-3000:]}"
    events = [e for _, evs, _ in results for e in evs]
    jit = [(e["rank"], e["step"], e["attempt"]) for e in events if e["event"] == "jit_save"]
    assert sorted(jit) == [(0, step, 0), (1, step, 0)], jit  # every rank the same step, once
    assert step in committed(tmp_path, 1), "rank 1's pod (its own memory tier) has the save committed too"
    launches = [e["attempt"] for e in results[0][1] if e["event"] == "launch"]
    assert launches == [0, 1]
    steps_by_attempt: dict[int, list[int]] = {0: [], 1: []}
    attempt = -1
    for e in results[0][1]:  # pod 0's stream: its launches, then its rank 0's steps
        if e["event"] == "launch":
            attempt = e["attempt"]
        elif e["event"] == "step" and e.get("rank") == 0:
            steps_by_attempt[attempt].append(e["step"])
    assert max(steps_by_attempt[0]) == step, "attempt 0 held still after the save"
    assert steps_by_attempt[1] == list(range(step + 1, STEPS + 1)), "attempt 1 resumed right after the save"
    restored = [e for e in results[0][1] if e["event"] == "restored"]
    assert restored and (restored[-1]["tier"], restored[-1]["step"]) == ("memory", step), restored[-1:]
