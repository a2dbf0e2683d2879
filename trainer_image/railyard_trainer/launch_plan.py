"""What this pod launches (``LaunchPlan``): the job's config with the command line's overrides,
the rank table (the operator's, or a single-node one built here) and this pod's workers, with
the rendezvous address resolved. Torch-free; used by the launcher (launcher.py) and by in-place
restarts (inplace.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from railyard.protocol import podenv
from railyard.protocol.envexpand import expand
from railyard.protocol.ports import free_port as _free_port
from railyard.protocol.ranktable import PodEntry, RankEntry, RankTable
from railyard.protocol.trainerconfig import Program, world_parallelism
from railyard_trainer.config import ConfigError, DatasetConfig, TrainerConfig, load_config
from railyard_trainer.events import log_event
from railyard_trainer.parallel_dims import ParallelDims
from railyard_trainer.worker_env import WorkerEnv


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
    env_attempt = _env_int(env, podenv.ATTEMPT)
    attempt = args.attempt if args.attempt is not None else env_attempt if env_attempt is not None else cfg.attempt
    out = replace(
        cfg,
        job=args.job or podenv.JOB.get(env) or cfg.job,
        namespace=podenv.NAMESPACE.get(env) or cfg.namespace,
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
    dims = ParallelDims(
        pp=p.pipeline, dp=p.data or -1, tp=p.tensor, world_size=nproc, procs_per_node=nproc, dp_replicas=p.data_replicas
    )
    ranks = tuple(
        RankEntry(rank=r, node=node, pod_index=0, local_rank=r, rail=r, pp=c[0], dp=c[1], tp=c[2])
        for r in range(nproc)
        for c in [dims.coordinates(r)]
    )
    table = RankTable(
        job=cfg.job,
        attempt=cfg.attempt,
        pp=dims.pp,
        dp=dims.dp,
        tp=dims.tp,
        procs_per_node=nproc,
        pods=(PodEntry(0, node, "127.0.0.1"),),
        ranks=ranks,
        master_addr="127.0.0.1",
        master_port=master_port,
    )
    table.validate()
    return table


#: How long a pod waits for the rendezvous pod's name to resolve (``RAILYARD_RENDEZVOUS_WAIT_S``):
#: the pods of a gang start at different times (image pulls, a busy kubelet) and a pod's DNS
#: name is served only once it has an address, so a pod may well look before pod 0 is there.
#: torchrun's rendezvous waits 600 s for its peers too.
RENDEZVOUS_WAIT_S = podenv.RENDEZVOUS_WAIT_S.default


def resolve(host: str, port: int) -> str:
    """An IP for ``host``: pod DNS names of the local cluster resolve only through Python."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(
            [f"MASTER_ADDR: cannot resolve {host!r} ({exc}); the rendezvous pod must exist and have a DNS name"]
        ) from exc
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
                raise ConfigError(
                    [f"{exc.problems[0]} (waited {time.monotonic() - start:.0f} s, RAILYARD_RENDEZVOUS_WAIT_S)"]
                ) from exc
            if not waited:
                log_event("waiting_for_rendezvous", host=host, wait_s=round(deadline - start, 1))
                waited = True
            time.sleep(0.2)


def resolved_lighthouse(env: Mapping[str, str], deadline: float) -> dict[str, str]:
    """``TORCHFT_LIGHTHOUSE`` for the workers with its host resolved here, waiting for it like
    the rendezvous (empty when unset). torchft's client resolves names through the system
    resolver, which does not know the local cluster's pod names; this process does. A new
    attempt resolves it again (a Lighthouse the operator recreated may have a new address)."""
    url = podenv.LIGHTHOUSE.get(env)
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or parts.port is None:
        return {}
    try:
        ip = resolve_until(parts.hostname, parts.port, deadline)
    except ConfigError as exc:
        raise ConfigError([f"{podenv.LIGHTHOUSE.name}: {p.split(': ', 1)[-1]}" for p in exc.problems]) from exc
    host = f"[{ip}]" if ":" in ip else ip
    return {podenv.LIGHTHOUSE.name: urllib.parse.urlunsplit(parts._replace(netloc=f"{host}:{parts.port}"))}


def _env_int(env: Mapping[str, str], var: podenv.Whole) -> int | None:
    """A whole-number pod variable (its default when unset or empty); ConfigError naming it otherwise."""
    try:
        return var.get(env)
    except podenv.PodEnvError as exc:
        raise ConfigError([str(exc)]) from exc


def env_float(env: Mapping[str, str], var: podenv.Seconds) -> float:
    """A number of seconds >= 0 from the pod environment (its default when unset or empty);
    ConfigError naming it otherwise."""
    try:
        return var.get(env)
    except podenv.PodEnvError as exc:
        raise ConfigError([str(exc)]) from exc


def plan_launch(args: argparse.Namespace, env: Mapping[str, str]) -> LaunchPlan:
    config_path = args.config or podenv.CONFIG.get(env)
    cfg = load_config(config_path) if config_path else TrainerConfig()
    cfg = apply_overrides(cfg, args, env)
    table_path = args.rank_table or podenv.RANK_TABLE.get(env)
    env_port = _env_int(env, podenv.MASTER_PORT)
    if table_path:
        try:
            table = RankTable.from_json(Path(table_path).read_text())
        except OSError as exc:
            raise ConfigError([f"{podenv.RANK_TABLE.name}: cannot read {table_path} ({exc.strerror})"]) from exc
        pod = args.pod_index if args.pod_index is not None else _env_int(env, podenv.POD_INDEX)
        if pod is None:
            raise ConfigError([f"{podenv.POD_INDEX.name}: required with a rank table (which pod am I?)"])
        pod_index = pod
        # The rank table is authoritative; a config that names other (non-default) sizes is
        # refused rather than silently overridden.
        p = world_parallelism(cfg.parallelism, cfg.fault_tolerance)
        problems = [
            f"parallelism.{name}: config says {want} but the rank table has {have}"
            for name, want, have, default in (
                ("tensor", p.tensor, table.tp, 1),
                ("pipeline", p.pipeline, table.pp, 1),
                ("data", p.data or -1, table.dp, -1),
            )
            if want > 0 and want != default and want != have
        ]
        if p.data_replicas == 0:
            problems.append(
                "parallelism.dataReplicas: 0 asks the operator to choose the number of replica groups; a config.json "
                "names it (the operator writes the chosen one)"
            )
        elif table.dp % p.data_replicas:
            problems.append(
                f"parallelism.dataReplicas: {p.data_replicas} does not divide the rank table's data-parallel size "
                f"{table.dp}"
            )
        if problems:
            raise ConfigError(problems)
    else:
        pod_index = 0
        port = args.master_port or (env_port if env_port is not None else _free_port())
        table = single_node_table(
            cfg, args.nproc_per_node or 1, node=podenv.NODE_NAME.get(env) or socket.gethostname(), master_port=port
        )
    if cfg.trainer.program is not None:
        cfg = replace(cfg, trainer=replace(cfg.trainer, program=expand_program(cfg.trainer.program, env)))
    problems = check_program(cfg.trainer.program, cwd=os.getcwd())
    if problems:
        raise ConfigError(problems)
    mine = table.ranks_of_pod(pod_index)
    if not mine:
        raise ConfigError([f"{podenv.POD_INDEX.name}: pod {pod_index} has no ranks in the rank table"])
    master = args.master_addr or podenv.MASTER_ADDR.get(env) or table.master_addr or "127.0.0.1"
    port = args.master_port or (env_port if env_port is not None else table.master_port)
    node = podenv.NODE_NAME.get(env) or mine[0].node
    wait_s = env_float(env, podenv.RENDEZVOUS_WAIT_S)
    plan = LaunchPlan(cfg, table, pod_index, resolve_until(master, port, time.monotonic() + wait_s), port)
    # TP groups stay inside a node, so a pod's own rank count is the per-node process count.
    dims = ParallelDims(
        pp=table.pp, dp=table.dp, tp=table.tp, world_size=table.world_size, procs_per_node=table.procs_per_node
    )
    for e in mine:
        plan.workers.append(
            WorkerEnv(
                rank=e.rank,
                local_rank=e.local_rank,
                world_size=dims.world_size,
                procs_per_node=table.procs_per_node,
                mesh_shape=(dims.pp, dims.dp, dims.tp),
                coords=(e.pp, e.dp, e.tp),
                config_path="",
                node=node,
                pod_index=pod_index,
            )
        )
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
