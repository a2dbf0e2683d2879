"""``railyard-train``: the pod's entry point. Starts one worker per local rank and watches them.

Two ways in (see docs/trainer.md, "Pod contract"):

- from the operator: ``RAILYARD_RANK_TABLE`` (rank table JSON) and ``RAILYARD_POD_INDEX`` say
  which global ranks this pod runs and at which (pp, dp, tp) coordinates; ``RAILYARD_CONFIG``
  is the job's config.json; ``MASTER_ADDR``/``MASTER_PORT`` the rendezvous.
- by hand: ``railyard-train --nproc-per-node 4 --tp 2 --preset tiny --steps 20`` builds a
  single-node rank table itself.

Each worker is the bundled trainer (``python -m railyard_trainer.worker``) or, with
``trainer.program`` (or ``railyard-train [flags] SCRIPT ARGS`` / ``-m MODULE`` / ``--no-python
CMD`` as torchrun takes them), the user's program, started with torchrun's environment
(:func:`worker_command`, :func:`worker_environment`).

The launcher never imports torch (it starts in milliseconds and cannot be wedged by a
broken CUDA context). It forwards SIGTERM/SIGINT to the workers, and when one worker fails it
gives the others ``RAILYARD_FAIL_GRACE_S`` (default 5 s) to report their own failure, then
terminates them, and exits with the most specific of its workers' codes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType

from railyard.protocol.envexpand import expand
from railyard.protocol.exitcodes import ExitCode, classify_exit_code
from railyard.protocol.podenv import LIGHTHOUSE_ENV
from railyard.protocol.ranktable import PodEntry, RankEntry, RankTable, RankTableError
from railyard.protocol.trainerconfig import Program, world_parallelism
from railyard_trainer.config import ConfigError, DatasetConfig, TrainerConfig, load_config
from railyard_trainer.events import log_event
from railyard_trainer.parallel_dims import ParallelDims
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
_SPECIFICITY = [ExitCode.SDC_DETECTED, ExitCode.HANG_OR_STRAGGLER, ExitCode.NO_VERIFIED_CHECKPOINT, ExitCode.CONFIG_PERMANENT]


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="railyard-train",
        description="Start the Railyard trainer's worker processes for this pod. Other commands: "
        "`railyard-train prepare` (tokenize text into shards), `railyard-train tokenizer` (train a small "
        "tokenizer.json), `railyard-train export` (a checkpoint as safetensors for Hugging Face transformers).",
    )
    p.add_argument("--config", help="config.json (default: $RAILYARD_CONFIG; none: built-in defaults)")
    p.add_argument("--rank-table", help="rank table JSON (default: $RAILYARD_RANK_TABLE; none: single node)")
    p.add_argument("--pod-index", type=int, help="this pod's index in the rank table (default: $RAILYARD_POD_INDEX)")
    p.add_argument("--nproc-per-node", type=int, help="workers to start without a rank table (default 1)")
    p.add_argument("--tp", type=int, help="tensor-parallel size")
    p.add_argument("--pp", type=int, help="pipeline-parallel size")
    p.add_argument("--dp", type=int, help="data-parallel size (default: derived)")
    p.add_argument("--dp-replicas", type=int, help="HSDP: data-parallel replica groups, each sharding over dp / dp-replicas ranks (default 1)")
    p.add_argument("--schedule", choices=["GPipe", "1F1B", "Interleaved1F1B"], help="pipeline schedule")
    p.add_argument("--microbatches", type=int)
    p.add_argument("--preset", choices=["tiny", "small", "1b", "8b"])
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int, help="global batch in sequences")
    p.add_argument("--seq-len", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--dataset-path", help="train on these shards (a folder with index.json, from `railyard-train prepare`) or on the bytes of these text files, instead of the synthetic language")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--checkpoint-dir", help="plain DCP checkpoint directory")
    p.add_argument("--checkpoint-interval", type=int, help="save every N steps (plain DCP checkpointer)")
    p.add_argument("--job", help="job name (default: $RAILYARD_JOB or the config's)")
    p.add_argument("--attempt", type=int, help="attempt number (default: $RAILYARD_ATTEMPT or the config's)")
    p.add_argument("--master-addr", help="rendezvous host (default: $MASTER_ADDR, the rank table's, or 127.0.0.1)")
    p.add_argument("--master-port", type=int, help="rendezvous port (default: $MASTER_PORT, the rank table's, or a free port)")
    g = p.add_argument_group("your own program (instead of the bundled trainer), as torchrun takes it")
    g.add_argument("-m", "--module", action="store_true", help="the program is a Python module: python -m MODULE ARGS")
    g.add_argument("--no-python", action="store_true", help="the program is an executable, run as is")
    g.add_argument("program", nargs="?", help="a Python script (default), a module with -m, or an executable with --no-python")
    g.add_argument("program_args", nargs=argparse.REMAINDER, help="arguments of the program")
    return p


@dataclass
class LaunchPlan:
    config: TrainerConfig
    table: RankTable
    pod_index: int
    master_addr: str
    master_port: int
    workers: list[WorkerEnv] = field(default_factory=list)


def apply_overrides(cfg: TrainerConfig, args: argparse.Namespace, env: Mapping[str, str]) -> TrainerConfig:
    t, p = cfg.trainer, cfg.parallelism
    t = replace(
        t,
        preset=args.preset or t.preset,
        steps=args.steps if args.steps is not None else t.steps,
        batch_size=args.batch_size if args.batch_size is not None else t.batch_size,
        seq_len=args.seq_len if args.seq_len is not None else t.seq_len,
        learning_rate=args.lr if args.lr is not None else t.learning_rate,
        seed=args.seed if args.seed is not None else t.seed,
        dataset=_dataset_from_flag(args.dataset_path) if args.dataset_path else t.dataset,
        activation_checkpointing=args.activation_checkpointing or t.activation_checkpointing,
    )
    p = replace(
        p,
        tensor=args.tp or p.tensor,
        pipeline=args.pp or p.pipeline,
        data=args.dp if args.dp is not None else p.data,
        data_replicas=args.dp_replicas if args.dp_replicas is not None else p.data_replicas,
        pipeline_schedule=args.schedule or p.pipeline_schedule,
        microbatches=args.microbatches if args.microbatches is not None else p.microbatches,
    )
    if getattr(args, "program", None):
        prog_args = tuple(getattr(args, "program_args", None) or ())
        if args.module:
            t = replace(t, program=Program(module=args.program, args=prog_args))
        elif args.no_python:
            t = replace(t, program=Program(command=(args.program,), args=prog_args))
        else:
            t = replace(t, program=Program(script=args.program, args=prog_args))
    checkpoint = dict(cfg.checkpoint)
    if args.checkpoint_dir:
        checkpoint["path"] = args.checkpoint_dir
    if args.checkpoint_interval is not None:
        checkpoint["intervalSteps"] = args.checkpoint_interval
    attempt = args.attempt if args.attempt is not None else int(env.get("RAILYARD_ATTEMPT", cfg.attempt))
    out = replace(
        cfg,
        job=args.job or env.get("RAILYARD_JOB") or cfg.job,
        namespace=env.get("RAILYARD_NAMESPACE") or cfg.namespace,
        attempt=attempt,
        trainer=t,
        parallelism=p,
        checkpoint=checkpoint,
    )
    # Re-parse: flags get the same validation (and error messages) as config.json.
    return TrainerConfig.from_dict(out.to_dict())


def _dataset_from_flag(path: str) -> DatasetConfig:
    """``--dataset-path``: shards when the folder has an index.json, else byte-level text."""
    kind = "tokens" if (Path(path) / "index.json").is_file() else "files"
    return DatasetConfig(type=kind, path=path)


def single_node_table(cfg: TrainerConfig, nproc: int, *, node: str, master_port: int) -> RankTable:
    p = world_parallelism(cfg.parallelism, cfg.fault_tolerance)
    dims = ParallelDims(pp=p.pipeline, dp=p.data or -1, tp=p.tensor, world_size=nproc, procs_per_node=nproc, dp_replicas=p.data_replicas)
    ranks = tuple(RankEntry(rank=r, node=node, pod_index=0, local_rank=r, rail=r, pp=c[0], dp=c[1], tp=c[2]) for r in range(nproc) for c in [dims.coordinates(r)])
    table = RankTable(job=cfg.job, attempt=cfg.attempt, pp=dims.pp, dp=dims.dp, tp=dims.tp, procs_per_node=nproc, pods=(PodEntry(0, node, "127.0.0.1"),), ranks=ranks, master_addr="127.0.0.1", master_port=master_port)
    table.validate()
    return table


#: How long a pod waits for the rendezvous pod's name to resolve (``RAILYARD_RENDEZVOUS_WAIT_S``):
#: the pods of a gang start at different times (image pulls, a busy kubelet) and a pod's DNS
#: name is served only once it has an address, so a pod may well look before pod 0 is there.
#: torchrun's rendezvous waits 600 s for its peers too.
RENDEZVOUS_WAIT_S = 600.0


def resolve(host: str, port: int) -> str:
    """An IP for ``host``: pod DNS names of the local cluster resolve only through Python."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError([f"MASTER_ADDR: cannot resolve {host!r} ({exc}); the rendezvous pod must exist and have a DNS name"]) from exc
    infos.sort(key=lambda i: i[0] != socket.AF_INET)  # prefer IPv4
    return str(infos[0][4][0])


def resolve_until(host: str, port: int, deadline: float) -> str:
    """:func:`resolve`, retried until ``deadline`` (``time.monotonic()``): the rendezvous pod may
    not be served yet (a gang's pods start apart; after a restart it may be a replacement).
    The ConfigError after the deadline says how long it waited."""
    waited = False
    start = time.monotonic()
    while True:
        try:
            return resolve(host, port)
        except ConfigError as exc:
            if time.monotonic() >= deadline:
                if not waited:
                    raise
                raise ConfigError([f"{exc.problems[0]} (waited {time.monotonic() - start:.0f} s, RAILYARD_RENDEZVOUS_WAIT_S)"]) from exc
            if not waited:
                log_event("waiting_for_rendezvous", host=host, wait_s=round(deadline - start, 1))
                waited = True
            time.sleep(0.2)


def resolved_lighthouse(env: Mapping[str, str], deadline: float) -> dict[str, str]:
    """``TORCHFT_LIGHTHOUSE`` for the workers with its host resolved here, waiting for it like
    the rendezvous (empty when unset). torchft's client resolves names through the system
    resolver, which does not know the local cluster's pod names; this process does. A new
    attempt resolves it again (a Lighthouse the operator recreated may have a new address)."""
    url = env.get(LIGHTHOUSE_ENV, "")
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or parts.port is None:
        return {}
    try:
        ip = resolve_until(parts.hostname, parts.port, deadline)
    except ConfigError as exc:
        raise ConfigError([f"{LIGHTHOUSE_ENV}: {p.split(': ', 1)[-1]}" for p in exc.problems]) from exc
    host = f"[{ip}]" if ":" in ip else ip
    return {LIGHTHOUSE_ENV: urllib.parse.urlunsplit(parts._replace(netloc=f"{host}:{parts.port}"))}


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    """An integer environment variable (None when unset or empty); ConfigError naming it otherwise."""
    raw = env.get(name)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError([f"{name}: expected an integer, got {raw!r}"]) from exc


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    """A non-negative number of seconds from the environment (``default`` when unset or empty)."""
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ConfigError([f"{name}: expected a number of seconds >= 0, got {raw!r}"])
    return value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plan_launch(args: argparse.Namespace, env: Mapping[str, str]) -> LaunchPlan:
    config_path = args.config or env.get("RAILYARD_CONFIG")
    cfg = load_config(config_path) if config_path else TrainerConfig()
    cfg = apply_overrides(cfg, args, env)
    table_path = args.rank_table or env.get("RAILYARD_RANK_TABLE")
    env_port = _env_int(env, "MASTER_PORT")
    if table_path:
        try:
            table = RankTable.from_json(Path(table_path).read_text())
        except OSError as exc:
            raise ConfigError([f"RAILYARD_RANK_TABLE: cannot read {table_path} ({exc.strerror})"]) from exc
        pod = args.pod_index if args.pod_index is not None else _env_int(env, "RAILYARD_POD_INDEX")
        if pod is None:
            raise ConfigError(["RAILYARD_POD_INDEX: required with a rank table (which pod am I?)"])
        pod_index = pod
        # The rank table is authoritative; a config that names other (non-default) sizes is
        # refused rather than silently overridden.
        p = world_parallelism(cfg.parallelism, cfg.fault_tolerance)
        problems = [
            f"parallelism.{name}: config says {want} but the rank table has {have}"
            for name, want, have, default in (("tensor", p.tensor, table.tp, 1), ("pipeline", p.pipeline, table.pp, 1), ("data", p.data or -1, table.dp, -1))
            if want > 0 and want != default and want != have
        ]
        if table.dp % p.data_replicas:
            problems.append(f"parallelism.dataReplicas: {p.data_replicas} does not divide the rank table's data-parallel size {table.dp}")
        if problems:
            raise ConfigError(problems)
    else:
        pod_index = 0
        port = args.master_port or (env_port if env_port is not None else _free_port())
        table = single_node_table(cfg, args.nproc_per_node or 1, node=env.get("RAILYARD_NODE_NAME") or socket.gethostname(), master_port=port)
    if cfg.trainer.program is not None:
        cfg = replace(cfg, trainer=replace(cfg.trainer, program=expand_program(cfg.trainer.program, env)))
    problems = check_program(cfg.trainer.program, cwd=os.getcwd())
    if problems:
        raise ConfigError(problems)
    mine = table.ranks_of_pod(pod_index)
    if not mine:
        raise ConfigError([f"RAILYARD_POD_INDEX: pod {pod_index} has no ranks in the rank table"])
    master = args.master_addr or env.get("MASTER_ADDR") or table.master_addr or "127.0.0.1"
    port = args.master_port or (env_port if env_port is not None else table.master_port)
    node = env.get("RAILYARD_NODE_NAME") or mine[0].node
    wait_s = _env_float(env, "RAILYARD_RENDEZVOUS_WAIT_S", RENDEZVOUS_WAIT_S)
    plan = LaunchPlan(cfg, table, pod_index, resolve_until(master, port, time.monotonic() + wait_s), port)
    # TP groups stay inside a node, so a pod's own rank count is the per-node process count.
    dims = ParallelDims(pp=table.pp, dp=table.dp, tp=table.tp, world_size=table.world_size, procs_per_node=table.procs_per_node)
    for e in mine:
        plan.workers.append(WorkerEnv(rank=e.rank, local_rank=e.local_rank, world_size=dims.world_size, procs_per_node=table.procs_per_node, mesh_shape=(dims.pp, dims.dp, dims.tp), coords=(e.pp, e.dp, e.tp), config_path="", node=node, pod_index=pod_index))
    return plan


def check_program(program: Program | None, *, cwd: str) -> list[str]:
    """What can be checked of the user's program before any worker starts (exit 64 when wrong:
    an image without the script cannot get better by restarting)."""
    if program is None:
        return []
    if program.script is not None and not os.path.isfile(os.path.join(cwd, program.script)):
        return [f"trainer.program.script: {program.script} is not a file in the image (working directory {cwd})"]
    if program.module is not None and not all(part.isidentifier() for part in program.module.split(".")):
        return [f"trainer.program.module: {program.module!r} is not a dotted Python module name"]
    if program.command is not None:
        exe = program.command[0]
        found = os.access(os.path.join(cwd, exe), os.X_OK) if os.sep in exe else shutil.which(exe) is not None
        if not found:
            return [f"trainer.program.command: {exe} is not an executable in the image (PATH or a path)"]
    return []


def expand_program(program: Program, env: Mapping[str, str]) -> Program:
    """``$(VAR)`` in the program's fields expanded from the pod's environment, as the kubelet
    expands a container's args (they travel in config.json, where no kubelet sees them)."""
    def x(v: str | None) -> str | None:
        return None if v is None else expand(v, env)

    return replace(
        program, script=x(program.script), module=x(program.module),
        command=None if program.command is None else tuple(expand(c, env) for c in program.command),
        args=tuple(expand(a, env) for a in program.args),
    )


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


def worker_environment(plan: LaunchPlan, w: WorkerEnv, *, base: Mapping[str, str], config_path: Path, run_dir: Path) -> dict[str, str]:
    """One worker's environment: the pod's (``base``), torchrun's variables for its rank and
    this attempt, its place in the rank table, config.json and where it leaves its last words."""
    cfg = plan.config
    return {
        **base,
        **torchrun_env(pods=len(plan.table.pods), attempt=cfg.attempt, run_id=cfg.job),
        **replace(w, config_path=str(config_path)).to_env(),
        WORKER_ERROR_FILE_ENV: str(worker_error_file(run_dir, w.rank)),
    }


def start_workers(spawner: Spawner, command: Sequence[str], envs: Mapping[int, Mapping[str, str]], *, attempt: int) -> dict[int, WorkerProcess]:
    """Start one worker per rank (``envs``: rank -> its environment), forked from the pod's
    zygote where the command allows (railyard_trainer.zygote); logs ``workers_started`` with
    each rank's pid (what ``kill -STOP`` or ``py-spy dump`` wants)."""
    procs = {rank: spawner.spawn(command, env) for rank, env in envs.items()}
    log_event("workers_started", attempt=attempt, pids={str(r): p.pid for r, p in procs.items()},
              zygote=spawner.zygote_pid is not None and any(not isinstance(p, subprocess.Popen) for p in procs.values()))
    return procs


def supervise(plan: LaunchPlan, *, fail_grace_s: float, kill_grace_s: float) -> int:
    run_dir = Path(tempfile.mkdtemp(prefix="railyard-"))
    config_path = run_dir / "config.json"
    config_path.write_text(json.dumps(plan.config.to_dict()))
    base = dict(os.environ)
    base.update({"MASTER_ADDR": plan.master_addr, "MASTER_PORT": str(plan.master_port), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"})
    base.update(resolved_lighthouse(base, time.monotonic() + _env_float(base, "RAILYARD_RENDEZVOUS_WAIT_S", RENDEZVOUS_WAIT_S)))
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
    log_event("launch", pod_index=plan.pod_index, ranks=[w.rank for w in plan.workers], world_size=plan.table.world_size, mesh=[plan.table.pp, plan.table.dp, plan.table.tp], master=f"{plan.master_addr}:{plan.master_port}", attempt=plan.config.attempt)
    try:
        envs = {w.rank: worker_environment(plan, w, base=base, config_path=config_path, run_dir=run_dir) for w in plan.workers}
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
    log_event("launcher_exit", code=code, failure_class=str(classify_exit_code(code)) if code else "", workers={str(r): c for r, c in sorted(codes.items())})
    if code != 0:
        write_termination_message(build_termination_message(codes, errors, code=code))
    return code


def _subcommand(name: str, argv: Sequence[str]) -> int:
    """``railyard-train prepare|tokenizer|export|lighthouse ...`` (each imports only what it needs)."""
    if name == "prepare":
        from railyard_trainer.prepare import main as prepare_main

        return prepare_main(argv)
    if name == "tokenizer":
        from railyard_trainer.prepare import tokenizer_main

        return tokenizer_main(argv)
    if name == "lighthouse":
        from railyard_trainer.replicas import lighthouse_main

        return lighthouse_main(argv)
    from railyard_trainer.export import main as export_main

    return export_main(argv)


SUBCOMMANDS = ("prepare", "tokenizer", "export", "lighthouse")


def launch(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return _subcommand(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    try:
        plan = plan_launch(args, os.environ)
        fail_grace_s = _env_float(os.environ, "RAILYARD_FAIL_GRACE_S", 5.0)
        kill_grace_s = _env_float(os.environ, "RAILYARD_KILL_GRACE_S", 10.0)
        restart_wait_s = _env_float(os.environ, "RAILYARD_RESTART_WAIT_S", 60.0)
        restart_kill_grace_s = _env_float(os.environ, "RAILYARD_RESTART_KILL_GRACE_S", 2.0)
    except (ConfigError, RankTableError, ValueError) as exc:
        log_event("launcher_exit", code=int(ExitCode.CONFIG_PERMANENT), failure_class="Permanent", error=str(exc))
        write_termination_message(f"configuration error (exit code {int(ExitCode.CONFIG_PERMANENT)}): {exc}")
        return int(ExitCode.CONFIG_PERMANENT)
    # under the operator's restart control channel the launcher outlives failed workers and
    # restarts them in place when told (railyard_trainer.inplace); otherwise as always
    from railyard_trainer.inplace import launch_in_place

    code = launch_in_place(plan, os.environ, fail_grace_s=fail_grace_s, kill_grace_s=kill_grace_s,
                           restart_wait_s=restart_wait_s, restart_kill_grace_s=restart_kill_grace_s)
    if code is not None:
        return code
    return supervise(plan, fail_grace_s=fail_grace_s, kill_grace_s=kill_grace_s)


def main() -> None:
    sys.exit(launch())


if __name__ == "__main__":
    main()
