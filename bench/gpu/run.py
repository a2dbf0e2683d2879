"""First contact with a GPU: every GPU path of the trainer measured in one prepared run.

One command (``bash bench/gpu/run.sh --out DIR``, which calls this file) runs a list of parts,
each in its own process with its own time budget, inside one overall budget (default 440 s).
A part that fails or runs out of time records its error, and the rest go on. Results go to
``DIR/gpu_h200.json`` (the standard bench format, ``{"bench", "results": [{metric, value, unit,
target, meets}]}``, plus ``env`` at the top and every part's details) and each part's raw
output under ``DIR/parts/``.

Parts, in order (bench/gpu/README.md says what each measures and why):

- ``env``: nvidia-smi, torch / CUDA / Python versions, the GPU's name and dense bf16 peak;
- ``sdc``: the known-answer test on the device, twice, and a bit flip injected into a GPU
  parameter of the real trainer (launcher, health package on): caught, exit SDC_DETECTED;
- ``ours/<preset>/<variant>``: the trainer (launcher, one GPU, bf16 FSDP2): tokens/s, MFU (the
  trainer's own FLOP count, ``ModelArgs.flops_per_token``, over the GPU's dense bf16 peak),
  peak GPU memory; 1b ``eager``, ``ac`` (activation checkpointing) and ``compile``
  (``RAILYARD_COMPILE``: each block compiled); 8b with AC, and with CPU offload + AC (skipped,
  with the sizes, where the host lacks the memory: ``memory_misfit``);
- ``titan/<preset>/<variant>``: TorchTitan's model and ``parallelize_llama`` on the same shape,
  batch and sequence length (bench/gpu/titan.py); ours / theirs as a ratio;
- ``snapshot``: the memory tier's snapshot out of GPU memory: GB/s of the parameter +
  optimizer copy into pinned host memory against a raw ``copy_`` of the same bytes, and
  training's stall per save.

``--dry`` runs every part on the CPU with tiny shapes and a few steps (tests/bench/
test_gpu_run_dry.py), so the script cannot rot between GPU runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: What well-tuned FSDP training reaches on H100-class GPUs (bench/gpu/mfu.py).
TARGET_MFU = 0.30
#: Ours against TorchTitan on the same shape: within 10%.
TARGET_RATIO = 0.9
#: The memory tier's copy against a raw copy_ of the same bytes into pinned memory.
TARGET_COPY_RATIO = 0.8


@dataclass(frozen=True)
class Shape:
    """A model and batch for one size, real or dry."""

    preset: str
    batch: int
    seq: int
    steps: int


@dataclass(frozen=True)
class Part:
    name: str
    budget_s: float
    kind: str
    shape: Shape | None = None
    ac: bool = False
    compile: bool = False
    offload: bool = False


def plan_parts(dry: bool) -> list[Part]:
    """The parts in the order they run: the first-contact checks first, then the figures by
    value. Each budget caps its part; the overall budget (``--budget``) caps them all, so the
    last parts are skipped, with a reason, when the early ones run long (a second run can take
    them with ``--only``). Dry: the same parts, tiny."""
    if dry:
        small = Shape("tiny", batch=2, seq=32, steps=4)
        big_shape = Shape("tiny", batch=2, seq=32, steps=3)
        snap = Shape("tiny", batch=2, seq=32, steps=3)
    else:
        small = Shape("1b", batch=8, seq=2048, steps=12)
        # 8b: fp32 weights, gradients and AdamW state are 16 B x 8.0e9 = 128.5 GB; batch 1
        # keeps the activations (with AC) and the fp32 logits in the rest of the H200.
        big_shape = Shape("8b", batch=1, seq=2048, steps=5)
        # One idle save and one during training: each writes ~18 GB (1b: fp32 weights + AdamW
        # state) to the tier after its copy, which is what bounds the part's time.
        snap = Shape("1b", batch=4, seq=2048, steps=1)
    # The names are the GPU run's; in the dry run each part keeps its name with the tiny shape.
    one, big = "1b", "8b"
    return [
        Part("env", 30, "env"),
        Part("sdc", 60, "sdc"),
        Part(f"ours/{one}/eager", 60, "ours", small),
        Part(f"titan/{one}/eager", 50, "titan", small),
        Part("snapshot", 75, "snapshot", snap),
        Part(f"ours/{big}/ac", 90, "ours", big_shape, ac=True),
        Part(f"ours/{one}/compile", 90, "ours", small, compile=True),
        Part(f"titan/{one}/compile", 90, "titan", small, compile=True),
        Part(f"ours/{big}/offload+ac", 120, "ours", big_shape, ac=True, offload=True),
        Part(f"ours/{one}/ac", 50, "ours", small, ac=True),
        Part(f"titan/{one}/ac", 50, "titan", small, ac=True),
    ]


# ------------------------------------------------------------------------------ orchestration


def run_all(out: Path, *, dry: bool, budget_s: float, only: set[str] | None = None) -> dict[str, Any]:
    """Every part in its own process, each bounded by min(its budget, what is left)."""
    parts_dir = out / "parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget_s
    details: dict[str, Any] = {}
    for part in plan_parts(dry):
        if only is not None and part.name not in only:
            continue
        left = deadline - time.monotonic()
        if left < 10:
            details[part.name] = {"error": f"skipped: {left:.0f}s of the overall {budget_s:.0f}s budget left"}
            continue
        limit = min(part.budget_s, left)
        details[part.name] = run_part(part, out=parts_dir, limit_s=limit, dry=dry)
        print(json.dumps({"part": part.name, **_short(details[part.name])}), flush=True)
        # After every part: if the whole run is stopped from outside, the file has what it did.
        write_report(out, details, dry=dry, budget_s=budget_s)
    return write_report(out, details, dry=dry, budget_s=budget_s)


def write_report(out: Path, details: dict[str, Any], *, dry: bool, budget_s: float) -> dict[str, Any]:
    report = build_report(details, dry=dry, budget_s=budget_s)
    tmp = out / "gpu_h200.json.tmp"
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    tmp.replace(out / "gpu_h200.json")
    return report


def run_part(part: Part, *, out: Path, limit_s: float, dry: bool) -> dict[str, Any]:
    """One part in a child process (a crash, an OOM or a hang there cannot stop the others);
    its result is the JSON file it writes. The child gets ``limit_s`` minus a margin to end its
    own subprocesses and write what it has."""
    safe = part.name.replace("/", "_").replace("+", "_")
    result = out / f"{safe}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--part", part.name, "--part-out", str(result),
           "--part-limit", str(max(5.0, limit_s - 8))]
    if dry:
        cmd.append("--dry")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, start_new_session=True, env=_env(),
                              preexec_fn=die_with_parent)
        code: int | str = proc.returncode
        stderr = proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = "timeout"
        stderr = _text(exc.stderr)
    wall = round(time.monotonic() - t0, 1)
    (out / f"{safe}.stderr.txt").write_text(stderr[-200_000:])
    if result.exists():
        data: dict[str, Any] = json.loads(result.read_text())
    else:
        data = {"error": f"the part's process ended ({code}) without a result after {wall}s: {stderr[-1500:]}"}
    data.update(wall_s=wall, limit_s=round(limit_s, 1))
    return data


def die_with_parent() -> None:
    """In a child, before exec: SIGKILL when the parent dies. A part's process killed at its
    limit takes its launcher along, and the launcher's workers die with it (zygote.py): nothing
    is left holding GPU memory the next part needs."""
    import contextlib
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # both sides alike
    paths = [str(ROOT / "operator"), str(ROOT / "trainer_image")]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _short(d: dict[str, Any]) -> dict[str, Any]:
    keys = ("error", "skipped", "tokens_per_s", "mfu", "peak_memory_gib", "caught", "copy_gb_s", "raw_copy_gb_s", "stall_s", "wall_s")
    return {k: d[k] for k in keys if k in d}


def build_report(details: dict[str, Any], *, dry: bool, budget_s: float) -> dict[str, Any]:
    """The standard bench format: one row per figure, errors as rows with a null value."""
    rows: list[dict[str, Any]] = []

    def add(metric: str, value: Any, unit: str, target: Any = None, meets: bool | None = None) -> None:
        rows.append({"metric": metric, "value": value, "unit": unit, "target": target, "meets": meets})

    for name, d in details.items():
        if "error" in d:  # the figures it has (a partial result) still follow
            add(f"error[{name}]", None, "", None, False)
        if d.get("skipped"):
            add(f"skipped[{name}]", None, "", None, None)
            continue
        if name.startswith(("ours/", "titan/")) and "tokens_per_s" in d:
            add(f"tokens_per_s[{name}]", d["tokens_per_s"], "tokens/s")
            mfu = d.get("mfu")
            add(f"mfu[{name}]", mfu, "fraction", TARGET_MFU if name.startswith("ours/") else None,
                (mfu >= TARGET_MFU) if (mfu is not None and name.startswith("ours/")) else None)
            add(f"peak_memory_gib[{name}]", d.get("peak_memory_gib"), "GiB")
        elif name == "sdc" and "caught" in d:
            add("sdc: known-answer test stable on the device", int(d["kat_stable"]), "bool", 1, bool(d["kat_stable"]))
            add("sdc: bit flip in a device parameter caught (exit SDC_DETECTED)", int(d["caught"]), "bool", 1, bool(d["caught"]))
        elif name == "snapshot" and "copy_gb_s" in d:
            add("snapshot: memory-tier copy of params + optimizer, GPU -> pinned host", d["copy_gb_s"], "GB/s")
            add("snapshot: raw copy_ of the same bytes into pinned host memory", d["raw_copy_gb_s"], "GB/s")
            ratio = d["copy_gb_s"] / d["raw_copy_gb_s"] if d["copy_gb_s"] and d["raw_copy_gb_s"] else None
            add("snapshot: memory-tier copy / raw copy_", None if ratio is None else round(ratio, 3), "ratio", f">= {TARGET_COPY_RATIO}",
                None if ratio is None else ratio >= TARGET_COPY_RATIO)
            if "stall_s" in d:
                add("snapshot: training stall per save (blocking copy + wait at the next optimizer step)", d["stall_s"], "s")
                add("snapshot: stall per save / step time", d["stall_fraction_of_step"], "ratio")
    for name, d in details.items():
        if not name.startswith("ours/"):
            continue
        theirs = details.get("titan/" + name.removeprefix("ours/"))
        if not theirs or "tokens_per_s" not in d or "tokens_per_s" not in theirs:
            continue
        ratio = d["tokens_per_s"] / theirs["tokens_per_s"]
        add(f"tokens_per_s ours / torchtitan[{name.removeprefix('ours/')}]", round(ratio, 3), "ratio", f">= {TARGET_RATIO}", ratio >= TARGET_RATIO)
    return {"bench": "gpu_h200" if not dry else "gpu_h200_dry", "dry": dry, "budget_s": budget_s,
            "env": details.get("env", {}), "results": rows, "parts": details}


# ------------------------------------------------------------------------------ the parts


def part_env(part: Part, limit_s: float, dry: bool) -> dict[str, Any]:
    import platform

    import torch

    from railyard_trainer.train import _peak_flops

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                           "cuda_available": torch.cuda.is_available(), "nccl": None, "cudnn": None}
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=min(10, limit_s))
        out["nvidia_smi"] = smi.stdout or smi.stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        out["nvidia_smi"] = f"unavailable: {exc!r}"
    if torch.cuda.is_available():
        dev = torch.device("cuda", 0)
        nccl = torch.cuda.nccl.version()  # type: ignore[no-untyped-call, unused-ignore]
        out.update(gpu=torch.cuda.get_device_name(dev), nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
                   cudnn=torch.backends.cudnn.version(),  # type: ignore[no-untyped-call, unused-ignore]
                   gpu_memory_gib=round(torch.cuda.get_device_properties(dev).total_memory / 2**30, 1),
                   peak_bf16_flops=_peak_flops(dev))
    from importlib.metadata import PackageNotFoundError, version

    try:  # not imported here: bench/gpu/titan.py stubs what its import needs
        out["torchtitan"] = version("torchtitan")
    except PackageNotFoundError:
        out["torchtitan"] = "not installed"
    return out


def part_sdc(part: Part, limit_s: float, dry: bool) -> dict[str, Any]:
    """The known-answer test on the device (twice: the same kernels give the same bits) and a
    bit flip in a parameter of the real trainer on the device, after the optimizer step at step
    3: the health package must end the attempt with SDC_DETECTED before step 4."""
    import torch

    from railyard.protocol.exitcodes import ExitCode
    from railyard_trainer.health.checks import known_answer_checksum

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    kat = [known_answer_checksum(device), known_answer_checksum(device)]
    flip_step = 3
    trainer = {"preset": "tiny", "steps": 6, "batchSize": 2, "seqLen": 32, "warmupSteps": 1,
               "faults": [{"kind": "bitflip", "rank": 0, "step": flip_step, "target": "param"}]}
    run = launch_trainer(trainer, {"health": {"sdc": {"intervalSteps": 2}}}, limit_s=limit_s - 5,
                         env={"RAILYARD_DISABLE_HEALTH": "0"})
    steps = {e["step"] for e in run["events"] if e.get("event") == "step"}
    flips = [e for e in run["events"] if e.get("event") == "fault" and e.get("kind") == "bitflip"]
    failed = [e.get("error", "") for e in run["events"] if e.get("event") == "worker_failed"]
    caught = run["code"] == ExitCode.SDC_DETECTED and flip_step + 1 not in steps and bool(flips)
    return {"device": str(device), "kat": kat, "kat_stable": kat[0] == kat[1], "caught": caught, "exit_code": run["code"],
            "flip": flips[0] if flips else None, "verdict": failed[:1], "steps_logged": sorted(steps),
            "stderr_tail": "" if caught else run["stderr"][-2000:]}


def part_ours(part: Part, limit_s: float, dry: bool) -> dict[str, Any]:
    """The trainer through its launcher on one device, as a job runs it."""
    assert part.shape is not None
    s = part.shape
    if not dry:
        reason = memory_misfit(s.preset, offload=part.offload)
        if reason:
            return {"skipped": True, "reason": reason}
    trainer = {"preset": s.preset, "steps": s.steps, "batchSize": s.batch, "seqLen": s.seq, "warmupSteps": 2,
               "mixedPrecision": "bf16", "cpuOffload": part.offload, "activationCheckpointing": part.ac,
               "collectiveTimeoutSeconds": 900, "watchdogSeconds": 600}
    env = {"RAILYARD_COMPILE": ("eager" if dry else "1") if part.compile else "0",
           "OMP_NUM_THREADS": "1" if dry else str(os.cpu_count() or 1),
           "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    run = launch_trainer(trainer, {}, limit_s=limit_s - 3, env=env)
    steps = [e for e in run["events"] if e.get("event") == "step"]
    out = throughput(steps, s)
    if not steps or (run["code"] != 0 and not run["timed_out"]):
        out["error"] = f"launcher exit {run['code']} after {len(steps)} steps: {run['stderr'][-2000:]}"
    elif run["timed_out"]:
        out["note"] = f"stopped by the part's time limit after {len(steps)} of {s.steps} steps"
    return out


def memory_misfit(preset: str, *, offload: bool, gpu_total: float | None = None, host_available: float | None = None) -> str:
    """Why this preset's training state cannot fit, or "" (then it is tried). The state is
    16 bytes per parameter: fp32 weights, gradients and two AdamW moments. On the GPU it needs
    room for activations too; offloaded, it lives in host memory, where the optimizer step
    (foreach on the CPU) needs one more fp32 copy of the weights as a temporary."""
    from railyard_trainer.model_args import PRESETS

    params = PRESETS[preset].num_params()
    state = 16 * params
    if offload:
        host = host_available if host_available is not None else _host_available()
        need = state + 4 * params
        if host and need > host:
            return (f"{preset} with CPU offload needs ~{need / 1e9:.0f} GB of host memory (weights, gradients and AdamW state "
                    f"in fp32, and the CPU optimizer's temporaries); {host / 1e9:.0f} GB are available")
        return ""
    gpu = gpu_total if gpu_total is not None else _gpu_total()
    need = state + 8 * 10**9
    if gpu and need > gpu:
        return (f"{preset} on the GPU needs ~{need / 1e9:.0f} GB (weights, gradients and AdamW state in fp32 and ~8 GB "
                f"for activations with AC); the GPU has {gpu / 1e9:.0f} GB")
    return ""


def _host_available() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 0.0


def _gpu_total() -> float:
    """Without torch: a CUDA context in this process would hold GPU memory the run needs."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
        return float(out.stdout.split()[0]) * 2**20
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return 0.0


def throughput(steps: list[dict[str, Any]], s: Shape) -> dict[str, Any]:
    """tokens/s over the steps after warm-up (the first steps allocate and compile), MFU from
    the trainer's own FLOP count and the device's dense bf16 peak, peak memory."""
    from railyard_trainer.model_args import PRESETS

    if not steps:
        return {"steps_done": 0}
    warm = steps[2:] if len(steps) > 3 else steps[-1:]
    tps = statistics.median(e["tokens_per_s"] for e in warm)
    peak = _device_peak()
    flops = PRESETS[s.preset].flops_per_token(s.seq)
    return {
        "preset": s.preset, "batch": s.batch, "seq": s.seq, "steps_done": len(steps), "steps_measured": len(warm),
        "tokens_per_s": round(tps, 1), "step_time_s": round(statistics.median(e["step_time_s"] for e in warm), 5),
        "first_step_s": round(steps[0]["step_time_s"], 3), "flops_per_token": flops,
        "mfu": round(tps * flops / peak, 4) if peak else None,
        "peak_memory_gib": round(max(e.get("memory_bytes", 0) for e in steps) / 2**30, 2),
        "loss_first_last": [steps[0].get("loss"), steps[-1].get("loss")],
        # The trainer logs its own MFU on a GPU (same count, same peak): a cross-check.
        "trainer_logged_mfu": statistics.median(e["mfu"] for e in warm) if all("mfu" in e for e in warm) else None,
    }


def _device_peak() -> float:
    import torch

    from railyard_trainer.train import _peak_flops

    return _peak_flops(torch.device("cuda", 0)) if torch.cuda.is_available() else 0.0


def launch_trainer(trainer: dict[str, Any], config: dict[str, Any], *, limit_s: float, env: dict[str, str]) -> dict[str, Any]:
    """``python -m railyard_trainer.launcher`` on one process; the JSON events it printed, even
    when the time limit stops it (its process group is killed: the launcher and its worker)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("RAILYARD_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    full.update({"RAILYARD_PLAIN_CHECKPOINT": "1", "RAILYARD_DISABLE_HEALTH": "1", "RAILYARD_FAIL_GRACE_S": "3",
                 "RAILYARD_KILL_GRACE_S": "5", "GLOO_SOCKET_IFNAME": "lo"})
    full.update(env)
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "config.json"
        cfg.write_text(json.dumps({"job": "gpu-run", **config, "trainer": trainer}))
        proc = subprocess.Popen([sys.executable, "-m", "railyard_trainer.launcher", "--config", str(cfg), "--nproc-per-node", "1"],
                                env=full, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                preexec_fn=die_with_parent)
        timed_out = False
        try:
            out, err = proc.communicate(timeout=max(1.0, limit_s))
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
    events = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return {"code": proc.returncode, "timed_out": timed_out, "events": events, "stderr": err}


def part_titan(part: Part, limit_s: float, dry: bool) -> dict[str, Any]:
    """TorchTitan on the same shape (bench/gpu/titan.py, its own process: its imports and
    stubs stay out of ours)."""
    assert part.shape is not None
    s = part.shape
    cmd = [sys.executable, str(HERE / "titan.py"), "--preset", s.preset, "--batch", str(s.batch), "--seq", str(s.seq),
           "--steps", str(s.steps)]
    if part.ac:
        cmd.append("--ac")
    if part.compile:
        cmd += ["--compile", "eager" if dry else "inductor"]
    timed_out = False
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1.0, limit_s - 3), env=_env(), preexec_fn=die_with_parent)
        stdout, stderr, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:  # the steps it printed still count
        timed_out = True
        stdout, stderr, code = _text(exc.stdout), _text(exc.stderr), -1
    lines = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
    head = next((x for x in lines if x.get("event") == "titan"), None)
    if head is not None and head.get("skipped"):
        return {"skipped": True, "reason": head["reason"]}
    steps = [x for x in lines if x.get("event") == "step"]
    out = throughput(steps, s)
    if head is not None:
        out.update(torchtitan=head.get("version"), titan_flops_per_token=head.get("flops_per_token"), mixed_precision=head.get("mixed_precision"),
                   stubbed=head.get("stubbed"))
    if not steps or (code != 0 and not timed_out):
        out["error"] = f"torchtitan exit {code} after {len(steps)} steps: {stderr[-2000:]}"
    elif timed_out:
        out["note"] = f"stopped by the part's time limit after {len(steps)} of {s.steps} steps"
    return out


def _text(x: str | bytes | None) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")


def part_snapshot(part: Part, limit_s: float, dry: bool) -> dict[str, Any]:
    """The memory tier's snapshot of the trainer's model and optimizer (bf16 FSDP2 on the
    device, fp32 master weights and AdamW state) into pinned host memory, as the checkpoint
    manager takes it, against a raw ``copy_`` of the same tensors into pinned buffers.

    - idle saves (save, then wait; nothing else on the device): the manager's blocking copy +
      deferred capture (``SaveRecord.phases``) against the raw copy -> GB/s of each;
    - saves during training (save, the next step, then wait): training's stall per save, the
      blocking copy plus the wait at the next optimizer step for the deferred copy
      (``SaveRecord.blocked_s + stall_s``), against the step time."""
    import socket
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

    from railyard_trainer.checkpoint import build_checkpointer
    from railyard_trainer.checkpoint.cpuclass import (
        BackgroundCpu,
        checkpoint_group,
        resolve_cpu_class,
    )
    from railyard_trainer.checkpoint.statedict import _tensors, tensor_state
    from railyard_trainer.config import DatasetConfig
    from railyard_trainer.data import ShardedBatches, build_source
    from railyard_trainer.hooks import TrainContext
    from railyard_trainer.model import Transformer, cross_entropy_loss
    from railyard_trainer.model_args import PRESETS
    from railyard_trainer.parallel_dims import ParallelDims
    from railyard_trainer.parallelize import parallelize_llama, param_dtype_for
    from railyard_trainer.train_state import Optimizers, WarmupCosine

    assert part.shape is not None
    s = part.shape
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=0, world_size=1, timeout=timedelta(seconds=300), device_id=device)
    else:
        dist.init_process_group("gloo", rank=0, world_size=1, timeout=timedelta(seconds=300))
    cpu = BackgroundCpu(resolve_cpu_class("auto"))
    pg = checkpoint_group(300, cpu)
    dims = ParallelDims(pp=1, dp=1, tp=1, world_size=1, procs_per_node=1)
    mesh = dims.build_mesh(device.type)
    margs = PRESETS[s.preset]
    torch.manual_seed(0)
    with torch.device(device):
        model = Transformer(margs)
    model = parallelize_llama(model, mesh=mesh, dims=dims, param_dtype=param_dtype_for("bf16", device), activation_checkpointing=False, cpu_offload=False)
    opt = Optimizers([model], lr=3e-4, weight_decay=0.1, fused=on_gpu)  # as the trainer on a GPU
    sched = WarmupCosine(opt, peak_lr=3e-4, warmup_steps=2, total_steps=1000)
    data = ShardedBatches(build_source(DatasetConfig(), vocab_size=margs.vocab_size, seed=0, seq_len=s.seq), batch_size=s.batch,
                          seq_len=s.seq, dp_rank=0, dp_size=1, device=device)
    ctx = TrainContext(rank=0, local_rank=0, world_size=1, node="node-0", pod_index=0, job="gpu-run", attempt=0, dims=dims,
                       mesh=mesh, model_parts=[model], optimizer=opt, lr_scheduler=sched, data=data)

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize(device)

    def step() -> float:
        sync()
        t0 = time.perf_counter()
        x, y = data.next_batch()
        cross_entropy_loss(model(x), y).backward()  # type: ignore[no-untyped-call, unused-ignore]
        opt.step()
        sched.step()
        opt.zero_grad()
        ctx.step += 1
        sync()
        return time.perf_counter() - t0

    step()  # the optimizer state exists from here on
    step_times = [step() for _ in range(2)]
    state = tensor_state(ctx)
    tensors = [t for t in _tensors({"model": state["model"], "optim": state.get("optim", {})}) if isinstance(t, torch.Tensor)]
    nbytes = sum((t.to_local() if hasattr(t, "to_local") else t).nbytes for t in tensors)
    raw_buffers = _create_cpu_state_dict(state, pin_memory=on_gpu)
    raw_s = []
    for _ in range(3):
        sync()
        t0 = time.perf_counter()
        _copy_state_dict(state, raw_buffers, non_blocking=on_gpu)
        sync()
        raw_s.append(time.perf_counter() - t0)
    del raw_buffers
    out: dict[str, Any] = {"preset": s.preset, "device": str(device), "bytes": nbytes,
                           "raw_copy_s": [round(x, 5) for x in raw_s], "raw_copy_gb_s": round(nbytes / min(raw_s) / 1e9, 2),
                           "copy_gb_s": None}
    record_partial(out)

    shm = Path("/dev/shm")
    room = shm.is_dir() and os.access(shm, os.W_OK) and _free_bytes(shm) > 3 * nbytes
    with tempfile.TemporaryDirectory(dir=str(shm) if room else None) as tier_dir:
        # One pod: no replica peer to stream to (the copy out of the GPU is what is measured).
        tiers = {"memory": {"intervalSteps": 1, "keep": 1, "dir": f"{tier_dir}/memory", "replicate": False},
                 "local": {"enabled": False, "dir": f"{tier_dir}/local"}, "shared": {"enabled": False, "dir": f"{tier_dir}/shared"}}
        ckpt = build_checkpointer({"checkpoint": tiers},
                                  ctx, process_group=pg, background=cpu, defer_capture=True)
        memory = [t for t in ckpt.tiers if t.name == "memory"]
        ckpt.prepare(ctx)
        ckpt.wait(limit_s)
        idle, training = [], []
        for _ in range(s.steps):
            step()
            ckpt.save(ctx, tiers=memory, checks_passed=True)
            ckpt.wait(limit_s)
            idle.append(ckpt.history[-1])
        out.update(_copy_figures(idle, nbytes), tier_dir="/dev/shm" if room else "tmp")
        record_partial(out)
        for _ in range(s.steps):
            step()
            ckpt.save(ctx, tiers=memory, checks_passed=True)
            step_times.append(step())
            ckpt.wait(limit_s)
            training.append(ckpt.history[-1])
        ckpt.close(30)
    failed = [r.detail for r in idle + training if not r.ok]
    stall = statistics.median(r.blocked_s + r.stall_s for r in training)
    step_s = statistics.median(step_times)
    dist.destroy_process_group()
    out.update(
        stall_s=round(stall, 5), step_time_s=round(step_s, 5), stall_fraction_of_step=round(stall / step_s, 4),
        saves=[{"step": r.step, "ok": r.ok, "blocked_s": round(r.blocked_s, 5), "stall_s": round(r.stall_s, 5),
                "phases": {k: round(v, 5) for k, v in r.phases.items()}, "bytes": r.bytes} for r in idle + training],
    )
    if failed:
        out["error"] = f"saves failed: {failed[:2]}"
    return out


def _copy_figures(idle: list[Any], nbytes: int) -> dict[str, Any]:
    """The manager's copy with the device idle: its blocking part plus the deferred capture."""
    copy_s = statistics.median(r.phases.get("snapshot", 0.0) + r.phases.get("capture", 0.0) for r in idle)
    return {"copy_s_idle": round(copy_s, 5), "copy_gb_s": round(nbytes / copy_s / 1e9, 2) if copy_s else None}


def _free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


PARTS: dict[str, Callable[[Part, float, bool], dict[str, Any]]] = {
    "env": part_env, "sdc": part_sdc, "ours": part_ours, "titan": part_titan, "snapshot": part_snapshot,
}


#: Where the running part writes its result (set in the part's process).
_RESULT: Path | None = None


def record_partial(result: dict[str, Any]) -> None:
    """What a long part has so far: the result if the part's time runs out before its end."""
    if _RESULT is not None:
        _RESULT.write_text(json.dumps({**result, "error": "partial: the part ran out of time after this"}, indent=1, default=str))


def run_one(name: str, out: Path, limit_s: float, dry: bool) -> None:
    global _RESULT
    _RESULT = out
    part = next(p for p in plan_parts(dry) if p.name == name)
    try:
        result = PARTS[part.kind](part, limit_s, dry)
    except Exception as exc:
        result = {"error": f"{exc!r}", "traceback": traceback.format_exc()[-4000:]}
    out.write_text(json.dumps(result, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, help="folder for gpu_h200.json and the parts' output")
    ap.add_argument("--dry", action="store_true", help="tiny shapes, a few steps, on whatever device there is (the CPU test)")
    ap.add_argument("--budget", type=float, default=440.0, help="overall seconds for all parts (default 440)")
    ap.add_argument("--only", default="", help="comma list of part names to run (default all)")
    ap.add_argument("--part", help=argparse.SUPPRESS)
    ap.add_argument("--part-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--part-limit", type=float, default=60.0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.part:
        run_one(a.part, a.part_out, a.part_limit, a.dry)
        return 0
    if a.out is None:
        ap.error("--out: give the folder to write the results into")
    a.out.mkdir(parents=True, exist_ok=True)
    only = {x for x in a.only.split(",") if x} or None
    known = [p.name for p in plan_parts(a.dry)]
    if only and not only <= set(known):
        ap.error(f"--only: unknown {sorted(only - set(known))}; the parts are {', '.join(known)}")
    report = run_all(a.out, dry=a.dry, budget_s=a.budget, only=only)
    width = max((len(r["metric"]) for r in report["results"]), default=10)
    for r in report["results"]:
        meets = "" if r["meets"] is None else ("yes" if r["meets"] else "NO")
        print(f"{r['metric']:<{width}}  {r['value']!s:>12} {r['unit']:<9} {r['target'] or '':<8} {meets}")
    print(f"wrote {a.out / 'gpu_h200.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
