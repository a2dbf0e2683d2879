"""Run the real launcher (``python -m railyard_trainer.launcher``) as a subprocess and read its
JSON-lines events. Runs are cached per session so several tests share one training job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Small but real: tiny preset, 10 steps, global batch 8 of 32 tokens.
BASE_TRAINER: dict[str, Any] = {
    "preset": "tiny", "steps": 10, "batchSize": 8, "seqLen": 32, "learningRate": 3e-3, "warmupSteps": 2,
    "seed": 1234, "collectiveTimeoutSeconds": 60, "watchdogSeconds": 45,
}


@dataclass
class Run:
    code: int
    events: list[dict[str, Any]]
    stderr: str
    workdir: Path
    grads: dict[str, Any] = field(default_factory=dict)

    def of(self, event: str, **match: Any) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event and all(e.get(k) == v for k, v in match.items())]

    def losses(self) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in self.of("step", rank=0)}

    def explain(self) -> str:
        return f"exit {self.code}\n--- events\n" + "\n".join(json.dumps(e) for e in self.events[-30:]) + f"\n--- stderr (tail)\n{self.stderr[-4000:]}"


def launcher_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAILYARD_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update({
        "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "RAILYARD_PLAIN_CHECKPOINT": "1",
        "RAILYARD_DISABLE_HEALTH": "1", "RAILYARD_FAIL_GRACE_S": "3", "RAILYARD_KILL_GRACE_S": "5",
    })
    env.update(extra)
    return env


def parse_events(stdout: str) -> list[dict[str, Any]]:
    out = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def start_launcher(workdir: Path, args: list[str], config: dict[str, Any], env: dict[str, str]) -> subprocess.Popen[str]:
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / "config.json"
    cfg_path.write_text(json.dumps(config))
    return subprocess.Popen([sys.executable, "-m", "railyard_trainer.launcher", "--config", str(cfg_path), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_launcher(workdir: Path, args: list[str], *, trainer: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
                 dump_grads: bool = False, timeout: float = 150, **env_extra: str) -> Run:
    cfg = {"job": "t", **(config or {}), "trainer": {**BASE_TRAINER, **(trainer or {})}}
    extra = dict(env_extra)
    if dump_grads:
        extra["RAILYARD_DUMP_GRADS"] = str(workdir / "grads")
    proc = start_launcher(workdir, args, cfg, launcher_env(**extra))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    run = Run(proc.returncode, parse_events(out), err, workdir)
    if dump_grads and run.code == 0:
        import torch

        for f in sorted((workdir / "grads").glob("grads-pp*.pt")):
            run.grads.update(torch.load(f))
    return run
