"""Runs the user's program in a worker process, as ``python SCRIPT`` or ``python -m MODULE`` would,
and classifies how it ends exactly as the bundled trainer's worker does.

The launcher starts ``python -m railyard_trainer.program script PATH ARGS...`` (or ``module
NAME ARGS...``) once per local rank, with torchrun's environment. The program runs as
``__main__`` with ``sys.argv`` and ``sys.path[0]`` as Python would give them, so an unmodified
torchrun script behaves as under torchrun. What this adds is the end: an exception that escapes
the program gets the exit code of its failure class (a ``torch.distributed`` error, such as a
peer that died: 70; :class:`~railyard_trainer.hooks.SDCDetected`: 75; an exception with an
integer ``exit_code``, such as the SDK's ``NoVerifiedCheckpoint``: that code; anything else: 1)
and leaves its traceback for the pod's termination message, as the bundled worker does
(railyard_trainer/worker.py). ``sys.exit(n)`` keeps ``n``; signals are the program's own.
Torch-free.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys
import traceback
from collections.abc import Sequence

from railyard.protocol.exitcodes import ExitCode, classify_exit_code
from railyard_trainer.config import ConfigError
from railyard_trainer.events import log_event
from railyard_trainer.termination import record_worker_error
from railyard_trainer.worker import exit_code_for

KINDS = ("script", "module")


def run(argv: Sequence[str]) -> int:
    """Run ``script PATH ARGS...`` or ``module NAME ARGS...``; the exit code it should have."""
    if len(argv) < 2 or argv[0] not in KINDS:
        print("usage: python -m railyard_trainer.program {script PATH | module NAME} [ARGS...]", file=sys.stderr)
        return int(ExitCode.CONFIG_PERMANENT)
    kind, target, args = argv[0], argv[1], list(argv[2:])
    rank = os.environ.get("RANK", "?")
    try:
        if kind == "script":
            path = os.path.abspath(target)
            if not os.path.isfile(path):
                raise ConfigError([f"trainer.program.script: {target} is not a file in the image"])
            sys.argv = [path, *args]
            # as `python SCRIPT`: the script's folder first on the path (not the launcher's cwd)
            sys.path[0] = os.path.dirname(path)
            runpy.run_path(path, run_name="__main__")
        else:
            sys.argv = [target, *args]
            if importlib.util.find_spec(target) is None:
                raise ConfigError([f"trainer.program.module: no module named {target!r} in the image"])
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as exc:
        if exc.code is None or exc.code == 0:
            return 0
        if not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
            return int(ExitCode.APPLICATION)
        return exc.code
    except BaseException as exc:
        code = exit_code_for(exc)
        log_event(
            "worker_failed",
            rank=int(rank) if rank.isdigit() else rank,
            code=code,
            failure_class=str(classify_exit_code(code)),
            error=repr(exc)[:2000],
        )
        traceback.print_exc(file=sys.stderr)
        record_worker_error(exc, code)
        _exit(code)
        return code  # pragma: no cover


def _exit(code: int) -> None:
    """Leave at once: a broken process group can block in its destructor at interpreter exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    # an uncaught exception never gets here (run leaves at once); sys.exit(n) and a normal end
    # exit as Python does, atexit handlers included (the SDK's last heartbeat)
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
