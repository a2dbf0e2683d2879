"""Starting and watching this pod's workers (torch-free): each worker's command line and
environment, :func:`start_workers`, and :func:`supervise`, which runs them to the end.

``supervise`` forwards SIGTERM/SIGINT to the workers, and when one worker fails it gives the
others ``RAILYARD_FAIL_GRACE_S`` (default 5 s) to report their own failure, then terminates
them, and returns the most specific of its workers' exit codes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType

from railyard.protocol import podenv
from railyard.protocol.exitcodes import ExitCode, classify_exit_code
from railyard_trainer.config import TrainerConfig
from railyard_trainer.events import log_event
from railyard_trainer.launch_plan import (
    LaunchPlan,
    env_float,
    resolved_lighthouse,
)
from railyard_trainer.termination import (
    WORKER_ERROR_FILE_ENV,
    build_termination_message,
    read_worker_errors,
    worker_error_file,
    write_termination_message,
)
from railyard_trainer.worker_env import WorkerEnv, torchrun_env
from railyard_trainer.zygote import Spawner, WorkerProcess

#: Most specific first: the root cause beats its consequences (a crash makes peers see a
#: broken connection; the launcher's own SIGTERM makes them exit 143).
_SPECIFICITY = [
    ExitCode.SDC_DETECTED,
    ExitCode.HANG_OR_STRAGGLER,
    ExitCode.NO_VERIFIED_CHECKPOINT,
    ExitCode.CONFIG_PERMANENT,
]


def most_specific(codes: Sequence[int]) -> int:
    def key(c: int) -> int:
        if c in _SPECIFICITY:
            return _SPECIFICITY.index(c)
        if c == 0:
            return 9
        if c >= 128:
            return 8
        if c == ExitCode.INFRASTRUCTURE:
            return 7
        if c == ExitCode.APPLICATION:
            return 6
        return 5  # a code chosen on purpose (e.g. an injected exit)

    return min(codes, key=key) if codes else 0


def worker_command(cfg: TrainerConfig, *, cwd: str | None = None) -> list[str]:
    """The command line of every worker of this pod: the bundled trainer's, or the program's
    (``trainer.program``, ``$(VAR)`` already expanded) as ``python SCRIPT ARGS``, ``python -m
    MODULE ARGS`` (through :mod:`railyard_trainer.program`, which classifies how it ends) or the
    command as is."""
    prog = cfg.trainer.program
    if prog is None:
        return [sys.executable, "-m", "railyard_trainer.worker"]
    if prog.script is not None:
        script = os.path.abspath(os.path.join(cwd or os.getcwd(), prog.script))
        return [sys.executable, "-u", "-m", "railyard_trainer.program", "script", script, *prog.args]
    if prog.module is not None:
        return [sys.executable, "-u", "-m", "railyard_trainer.program", "module", prog.module, *prog.args]
    assert prog.command is not None
    return [*prog.command, *prog.args]


def worker_environment(
    plan: LaunchPlan, w: WorkerEnv, *, base: Mapping[str, str], config_path: Path, run_dir: Path
) -> dict[str, str]:
    """One worker's environment: the pod's (``base``), torchrun's variables for its rank and
    this attempt, its place in the rank table, config.json and where it leaves its last words."""
    cfg = plan.config
    return {
        **base,
        **torchrun_env(pods=len(plan.table.pods), attempt=cfg.attempt, run_id=cfg.job),
        **replace(w, config_path=str(config_path)).to_env(),
        WORKER_ERROR_FILE_ENV: str(worker_error_file(run_dir, w.rank)),
    }


def start_workers(
    spawner: Spawner, command: Sequence[str], envs: Mapping[int, Mapping[str, str]], *, attempt: int
) -> dict[int, WorkerProcess]:
    """Start one worker per rank (``envs``: rank -> its environment), forked from the pod's
    zygote where the command allows (railyard_trainer.zygote); logs ``workers_started`` with
    each rank's pid (what ``kill -STOP`` or ``py-spy dump`` wants)."""
    procs = {rank: spawner.spawn(command, env) for rank, env in envs.items()}
    log_event(
        "workers_started",
        attempt=attempt,
        pids={str(r): p.pid for r, p in procs.items()},
        zygote=spawner.zygote_pid is not None and any(not isinstance(p, subprocess.Popen) for p in procs.values()),
    )
    return procs


def supervise(plan: LaunchPlan, *, fail_grace_s: float, kill_grace_s: float) -> int:
    run_dir = Path(tempfile.mkdtemp(prefix="railyard-"))
    config_path = run_dir / "config.json"
    config_path.write_text(json.dumps(plan.config.to_dict()))
    base = dict(os.environ)
    base.update(
        {
            podenv.MASTER_ADDR.name: plan.master_addr,
            podenv.MASTER_PORT.name: podenv.MASTER_PORT.render(plan.master_port),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    base.update(resolved_lighthouse(base, time.monotonic() + env_float(base, podenv.RENDEZVOUS_WAIT_S)))
    if plan.master_addr.startswith("127.") and len(plan.table.pods) == 1:
        base.setdefault("GLOO_SOCKET_IFNAME", "lo")
    procs: dict[int, WorkerProcess] = {}
    received: list[int] = []
    spawner = Spawner(base)

    def forward(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        for p in procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    log_event(
        "launch",
        pod_index=plan.pod_index,
        ranks=[w.rank for w in plan.workers],
        world_size=plan.table.world_size,
        mesh=[plan.table.pp, plan.table.dp, plan.table.tp],
        master=f"{plan.master_addr}:{plan.master_port}",
        attempt=plan.config.attempt,
    )
    try:
        envs = {
            w.rank: worker_environment(plan, w, base=base, config_path=config_path, run_dir=run_dir)
            for w in plan.workers
        }
        procs.update(start_workers(spawner, worker_command(plan.config), envs, attempt=plan.config.attempt))
        failed_at: float | None = None
        term_at: float | None = None
        while True:
            rcs = {r: p.poll() for r, p in procs.items()}
            if all(rc is not None for rc in rcs.values()):
                break
            now = time.monotonic()
            if failed_at is None and any(rc not in (None, 0) for rc in rcs.values()):
                failed_at = now
                log_event("worker_exited", failed={r: rc for r, rc in rcs.items() if rc not in (None, 0)})
            if term_at is None and received:
                term_at = now
            if term_at is None and failed_at is not None and now - failed_at >= fail_grace_s:
                term_at = now
                for p in procs.values():
                    if p.poll() is None:
                        p.terminate()
            if term_at is not None and now - term_at >= kill_grace_s:
                for p in procs.values():
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.05)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        spawner.close()
        errors = read_worker_errors(run_dir, list(procs))
        shutil.rmtree(run_dir, ignore_errors=True)
    codes = {r: (128 - rc if rc < 0 else rc) for r, p in procs.items() for rc in [p.wait()]}
    code = most_specific(list(codes.values()))
    if code == 0 and received:
        code = 128 + received[0]
    log_event(
        "launcher_exit",
        code=code,
        failure_class=str(classify_exit_code(code)) if code else "",
        workers={str(r): c for r, c in sorted(codes.items())},
    )
    if code != 0:
        write_termination_message(build_termination_message(codes, errors, code=code))
    return code
