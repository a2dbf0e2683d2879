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
(:func:`railyard_trainer.workers.worker_command`, :func:`railyard_trainer.workers.worker_environment`).

This module parses the command line and dispatches: the plan (config, rank table, this pod's
workers) is :mod:`railyard_trainer.launch_plan`'s, running the workers is
:func:`railyard_trainer.workers.supervise` (or :mod:`railyard_trainer.inplace` under the
operator's restart control channel). The launcher never imports torch (it starts in
milliseconds and cannot be wedged by a broken CUDA context). It forwards SIGTERM/SIGINT to the
workers, and when one worker fails it gives the others ``RAILYARD_FAIL_GRACE_S`` (default 5 s)
to report their own failure, then terminates them, and exits with the most specific of its
workers' codes.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from railyard.protocol import podenv
from railyard.protocol.exitcodes import ExitCode
from railyard.protocol.ranktable import RankTableError
from railyard_trainer.config import ConfigError
from railyard_trainer.events import log_event
from railyard_trainer.launch_plan import env_float, plan_launch
from railyard_trainer.termination import write_termination_message
from railyard_trainer.workers import supervise


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
    p.add_argument(
        "--dp-replicas",
        type=int,
        help="HSDP: data-parallel replica groups, each sharding over dp / dp-replicas ranks (default 1)",
    )
    p.add_argument("--schedule", choices=["GPipe", "1F1B", "Interleaved1F1B"], help="pipeline schedule")
    p.add_argument("--microbatches", type=int)
    p.add_argument("--preset", choices=["tiny", "small", "1b", "8b"])
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int, help="global batch in sequences")
    p.add_argument("--seq-len", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--dataset-path",
        help="train on these shards (a folder with index.json, from `railyard-train prepare`) or on the bytes of "
             "these text files, instead of the synthetic language",
    )
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--checkpoint-dir", help="plain DCP checkpoint directory")
    p.add_argument("--checkpoint-interval", type=int, help="save every N steps (plain DCP checkpointer)")
    p.add_argument("--job", help="job name (default: $RAILYARD_JOB or the config's)")
    p.add_argument("--attempt", type=int, help="attempt number (default: $RAILYARD_ATTEMPT or the config's)")
    p.add_argument("--master-addr", help="rendezvous host (default: $MASTER_ADDR, the rank table's, or 127.0.0.1)")
    p.add_argument(
        "--master-port", type=int, help="rendezvous port (default: $MASTER_PORT, the rank table's, or a free port)"
    )
    g = p.add_argument_group("your own program (instead of the bundled trainer), as torchrun takes it")
    g.add_argument("-m", "--module", action="store_true", help="the program is a Python module: python -m MODULE ARGS")
    g.add_argument("--no-python", action="store_true", help="the program is an executable, run as is")
    g.add_argument(
        "program", nargs="?", help="a Python script (default), a module with -m, or an executable with --no-python"
    )
    g.add_argument("program_args", nargs=argparse.REMAINDER, help="arguments of the program")
    return p


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
        fail_grace_s = env_float(os.environ, podenv.FAIL_GRACE_S)
        kill_grace_s = env_float(os.environ, podenv.KILL_GRACE_S)
        restart_kill_grace_s = env_float(os.environ, podenv.RESTART_KILL_GRACE_S)
    except (ConfigError, RankTableError, ValueError) as exc:
        log_event("launcher_exit", code=int(ExitCode.CONFIG_PERMANENT), failure_class="Permanent", error=str(exc))
        write_termination_message(f"configuration error (exit code {int(ExitCode.CONFIG_PERMANENT)}): {exc}")
        return int(ExitCode.CONFIG_PERMANENT)
    # under the operator's restart control channel the launcher outlives failed workers and
    # restarts them in place when told (railyard_trainer.inplace); otherwise as always
    from railyard_trainer.inplace import launch_in_place

    code = launch_in_place(plan, os.environ, fail_grace_s=fail_grace_s, kill_grace_s=kill_grace_s,
                           restart_wait_s=plan.config.restart_wait_seconds, restart_kill_grace_s=restart_kill_grace_s)
    if code is not None:
        return code
    return supervise(plan, fail_grace_s=fail_grace_s, kill_grace_s=kill_grace_s)


def main() -> None:
    sys.exit(launch())


if __name__ == "__main__":
    main()
