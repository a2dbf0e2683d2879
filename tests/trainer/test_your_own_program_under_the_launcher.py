"""Bring your own trainer: the examples (examples/fsdp2_train*.py) under the real launcher, 2 ranks
on gloo, as a TrainingJob's pod runs them (config.json's ``trainer.program``), with the
operator's heartbeat ingest route and store in-process.

- The SDK version reports every step (the store shows both ranks' steps and losses, opted into
  progress), saves through the memory tier on the job's schedule, and when one rank stops dead
  (SIGSTOP: a wedged process, not a clean exit) the other rank's watchdog ends the attempt as
  HANG_OR_STRAGGLER (76), the documented failure behaviour. The next attempt resumes from the
  newest verified memory checkpoint (the store shows the restore) and trains the same losses
  the first attempt did from there: one implementation of exact resume for any program.
- The unmodified script (no Railyard import) gets torchrun's environment, trains, checkpoints
  with DCP into a folder named by ``$(RAILYARD_CHECKPOINT_LOCAL_DIR)`` in its arguments, and a
  second attempt resumes from its own checkpoint, as under torchrun.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.health.ingest import Server
from tests.waiting import wait_until

from railyard.protocol.exitcodes import ExitCode

from .launch import launcher_env, parse_events

pytestmark = [pytest.mark.torch, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
SDK_EXAMPLE = ROOT / "examples" / "fsdp2_train_railyard.py"
PLAIN_EXAMPLE = ROOT / "examples" / "fsdp2_train.py"
MEMORY_INTERVAL = 4
#: the step after which rank 1 is stopped (a memory checkpoint is committed by then)
STOP_AFTER = 9
#: attempt 0's length: far more steps than it trains before the wedge, however slow or fast the
#: machine, so rank 1 is always stopped mid-training (with 14, a loaded machine let both ranks
#: finish before the test's SIGSTOP landed, and nothing was left to detect)
STEPS_0 = 100_000
#: attempt 1 trains this many steps past the last one attempt 0 trained
EXTRA_STEPS = 3
#: long enough for a step and a blocking save on 2 loaded cores; short enough to keep the test fast
WATCHDOG_S = 8.0
#: bounds that only catch hangs
DEADLINE_S = 150.0


def _config(attempt: int, program: dict[str, Any], *, job: str = "byo") -> dict[str, Any]:
    return {
        "job": job, "namespace": "ns", "attempt": attempt,
        "trainer": {"program": program, "watchdogSeconds": WATCHDOG_S, "collectiveTimeoutSeconds": 60},
        "checkpoint": {
            "memory": {"intervalSteps": MEMORY_INTERVAL, "keep": 2},
            "local": {"enabled": False},
            "shared": {"intervalSteps": 1000, "keep": 1},
        },
        "health": {"heartbeatIntervalSeconds": 0.2},
    }


class Launch:
    """One pod's ``railyard-train`` (2 local ranks) in a subprocess, its events read as they come."""

    def __init__(self, workdir: Path, config: dict[str, Any], env: dict[str, str]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        cfg = workdir / f"config-{config['attempt']}.json"
        cfg.write_text(json.dumps(config))
        self.stdout_path = workdir / f"stdout-{config['attempt']}.log"
        self.stderr_path = workdir / f"stderr-{config['attempt']}.log"
        with self.stdout_path.open("w") as out, self.stderr_path.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "railyard_trainer.launcher", "--config", str(cfg), "--nproc-per-node", "2"],
                env=env, cwd=workdir, stdout=out, stderr=err, text=True,
            )

    def events(self, event: str | None = None) -> list[dict[str, Any]]:
        evs = parse_events(self.stdout_path.read_text())
        return evs if event is None else [e for e in evs if e.get("event") == event]

    def wait(self, timeout: float = DEADLINE_S) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the launcher did not end within {timeout} s\n{self.explain()}") from None

    def explain(self) -> str:
        return (f"--- stdout (tail)\n{self.stdout_path.read_text()[-3000:]}\n"
                f"--- stderr (tail)\n{self.stderr_path.read_text()[-4000:]}")

    def worker_pid(self, rank: int) -> int:
        """The worker process of ``rank``, as the launcher's ``workers_started`` names it."""
        started = self.events("workers_started")
        assert started, f"the launcher {self.proc.pid} has not started its workers\n{self.explain()}"
        return int(started[-1]["pids"][str(rank)])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def _until(what: str, cond: Callable[[], Any], launch: Launch, timeout: float = DEADLINE_S) -> Any:
    """Wait for ``cond``, failing at once if the launcher ends first."""
    def check() -> Any:
        got = cond()
        assert got or launch.proc.poll() is None, f"the launcher ended (exit {launch.proc.returncode}) before {what}\n{launch.explain()}"
        return got

    return wait_until(check, timeout=timeout, interval=0.05, message=what, explain=launch.explain)


def _committed_memory_dirs(mem: Path, job: str) -> dict[int, Path]:
    """Step -> directory of every committed memory checkpoint."""
    return {int(p.parent.name.removeprefix("step-")): p.parent for p in (mem / job).glob("step-*/manifest.json")}


def _committed_memory_steps(mem: Path, job: str) -> list[int]:
    return sorted(_committed_memory_dirs(mem, job))


@pytest.fixture(scope="module")
def ingest() -> Iterator[Server]:
    s = Server(namespace="ns", job="byo", token="t0ken")
    yield s
    s.close()


def _env(tmp: Path, server: Server | None) -> dict[str, str]:
    env = launcher_env(
        RAILYARD_CHECKPOINT_MEMORY_DIR=str(tmp / "memory"), RAILYARD_CHECKPOINT_LOCAL_DIR=str(tmp / "local"),
        RAILYARD_CHECKPOINT_SHARED_DIR=str(tmp / "shared"), RAILYARD_NODE_NAME="node-a",
    )
    env.pop("RAILYARD_PLAIN_CHECKPOINT", None)  # the tiers, as in a TrainingJob
    if server is not None:
        env.update(RAILYARD_HEARTBEAT_URL=server.url, RAILYARD_HEARTBEAT_TOKEN=server.token)
    return env


def _losses(launch: Launch) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in launch.events("step")}


def _sdk_program(steps: int) -> dict[str, Any]:
    return {"script": str(SDK_EXAMPLE), "args": ["--steps", str(steps), "--check-every", "5"]}


def test_the_sdk_example_reports_steps_survives_a_wedged_rank_and_resumes_exactly(ingest: Server, tmp_path: Path) -> None:
    env = _env(tmp_path, ingest)

    # attempt 0: train until a memory checkpoint is committed and the step is past it, then wedge rank 1
    first = Launch(tmp_path, _config(0, _sdk_program(STEPS_0)), env)
    try:
        def both_ranks_past(step: int) -> Any:
            def check(s: Any) -> Any:
                jw = s.job("ns", "byo")
                return jw is not None and len(jw.ranks) == 2 and all(r.step >= step for r in jw.ranks.values())
            return ingest.read(check)

        _until(f"heartbeats of both ranks past step {STOP_AFTER}", lambda: both_ranks_past(STOP_AFTER), first)
        _until("a committed memory checkpoint", lambda: _committed_memory_steps(tmp_path / "memory", "byo"), first)
        # and the operator heard of one (a rank's checkpoint report rides its next beats): wait for it
        # before wedging rank 1, whose missing beat could otherwise hold the pod's report back
        _until("the operator told of a committed memory checkpoint",
               lambda: ingest.read(lambda s: s.job("ns", "byo") is not None
                                   and "memory" in s.job("ns", "byo").last_checkpoints()), first)
        beats = ingest.read(lambda s: {r.rank: (r.progress, r.step, r.pod_index, r.last_beat) for r in s.job("ns", "byo").ranks.values()})
        for rank, (progress, step, pod, last) in beats.items():
            assert progress and step >= STOP_AFTER and pod == 0, (rank, beats)
            assert last is not None and last.loss is not None and last.loss > 0 and last.tokens_per_s > 0, last
        os.kill(first.worker_pid(1), signal.SIGSTOP)
        committed = _committed_memory_steps(tmp_path / "memory", "byo")
        code = first.wait()
    finally:
        first.kill()
    # rank 0 waits in a collective for the wedged rank 1; its watchdog names the hang
    assert code == ExitCode.HANG_OR_STRAGGLER, f"exit {code}\n{first.explain()}"
    assert [e["rank"] for e in first.events("hang_detected")] == [0], first.explain()
    assert first.events("launcher_exit")[-1]["failure_class"] == "Straggler", first.explain()
    losses_0 = _losses(first)
    # the operator heard of the committed checkpoints, and no health check the program ran failed
    told = ingest.read(lambda s: s.job("ns", "byo").last_checkpoints())
    assert told["memory"].ok and told["memory"].step % MEMORY_INTERVAL == 0, told
    assert not ingest.read(lambda s: list(s.job("ns", "byo").health_events()))
    # Exact resume shows in the steps both attempts train. When the newest checkpoint is at the
    # last step attempt 0 trained (the wedge came just after that step's save was committed),
    # attempt 1 would retrain none: drop it, as a node that lost its memory would, so that
    # attempt 1 resumes from the one before and retrains the steps in between.
    dropped = {s: d for s, d in _committed_memory_dirs(tmp_path / "memory", "byo").items() if s >= max(losses_0)}
    for saved in dropped.values():
        shutil.rmtree(saved)
    committed = [s for s in committed if s not in dropped]
    assert committed, (sorted(dropped), losses_0)  # keep=2 and both ranks were past step STOP_AFTER
    assert max(losses_0) < STEPS_0, "attempt 0 ended before the wedge"

    # attempt 1: resume from the newest verified memory checkpoint, train a few steps past attempt 0
    steps_1 = max(losses_0) + EXTRA_STEPS
    ingest.read(lambda s: s.begin_attempt("ns", "byo", 1))
    second = Launch(tmp_path, _config(1, _sdk_program(steps_1)), env)
    try:
        code = second.wait()
    finally:
        second.kill()
    assert code == 0, second.explain()
    restored = second.events("restored")
    assert sorted(e["rank"] for e in restored) == [0, 1], second.explain()
    step = restored[0]["step"]
    assert {(e["tier"], e["step"]) for e in restored} == {("memory", step)}
    # at most one interval lost: the newest checkpoint committed when the rank wedged (or one
    # committed after it, while rank 0 still wrote it in the background), of those kept above
    assert step >= max(committed) and step % MEMORY_INTERVAL == 0, (step, committed)
    start = second.events("start")[0]
    assert start["resumed_from"] == step and start["attempt"] == "1", start
    losses_1 = _losses(second)
    assert sorted(losses_1) == list(range(step + 1, steps_1 + 1))
    # exact resume: the steps both attempts trained have the same loss
    again = sorted(set(losses_0) & set(losses_1))
    assert again, (losses_0, losses_1)
    assert [losses_1[s] for s in again] == [losses_0[s] for s in again]
    # the operator learnt the restore point and the new attempt's steps from the heartbeats
    jw = ingest.read(lambda s: s.job("ns", "byo"))
    assert (jw.attempt, jw.restored_tier, jw.restored_step) == (1, "memory", step)
    assert ingest.read(lambda s: sorted(r.step for r in s.job("ns", "byo").ranks.values())) == [steps_1, steps_1]


def test_the_unmodified_script_trains_and_resumes_from_its_own_checkpoints(tmp_path: Path) -> None:
    # no heartbeat URL: a plain program never talks to the operator
    program = {
        "script": str(PLAIN_EXAMPLE),
        "args": ["--steps", "6", "--checkpoint-every", "3", "--checkpoint-dir", "$(RAILYARD_CHECKPOINT_LOCAL_DIR)/plain"],
    }
    env = _env(tmp_path, None)
    first = Launch(tmp_path, _config(0, program, job="plain"), env)
    try:
        assert first.wait() == 0, first.explain()
    finally:
        first.kill()
    # torchrun's environment reached the script: a 2-rank gang, restart count 0
    assert first.events("start") == [{"event": "start", "world_size": 2, "resumed_from": 0, "attempt": "0"}]
    assert sorted(p.name for p in (tmp_path / "local" / "plain").iterdir()) == ["step-00000003", "step-00000006"]
    # a restarted gang (attempt 1: TORCHELASTIC_RESTART_COUNT=1) resumes from the script's own newest checkpoint
    program["args"][1] = "8"
    second = Launch(tmp_path, _config(1, program, job="plain"), env)
    try:
        assert second.wait() == 0, second.explain()
    finally:
        second.kill()
    assert second.events("start") == [{"event": "start", "world_size": 2, "resumed_from": 6, "attempt": "1"}]
    assert sorted(_losses(second)) == [7, 8]
    assert not second.events("restored"), "the SDK was not used, so Railyard restored nothing"
