"""One training process (started by the launcher, one per local rank); maps failures to exit codes.

Exit codes (railyard.protocol.exitcodes):

- ``ConfigError`` / ``RankTableError`` -> CONFIG_PERMANENT (64): retrying cannot help.
- ``hooks.SDCDetected`` -> SDC_DETECTED (75).
- ``hooks.HangDetected`` and the rank's own watchdog -> HANG_OR_STRAGGLER (76). Every rank stuck
  in a hung gang reports 76, the hung one and the ones waiting for it.
- a ``torch.distributed`` error (peer died, connection reset, store failure) and a collective that
  timed out (reached only where the watchdog is paused, e.g. during a checkpoint save)
  -> INFRASTRUCTURE (70).
- an exception with an integer ``exit_code`` attribute (the checkpoint package's "no verified
  checkpoint", injected exits) -> that code.
- SIGTERM -> 143 (128 + 15); anything else -> APPLICATION (1).
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from types import FrameType

from railyard.protocol.exitcodes import ExitCode, classify_exit_code
from railyard.protocol.ranktable import RankTableError
from railyard_trainer.config import ConfigError
from railyard_trainer.events import log_event
from railyard_trainer.hooks import HangDetected, SDCDetected
from railyard_trainer.termination import record_worker_error

_INFRA_PATTERNS = (
    "gloo",
    "nccl",
    "connection closed",
    "connection reset",
    "broken pipe",
    "timed out",
    "timeout",
    "c10d",
    "processgroup",
    "socket",
)


def exit_code_for(exc: BaseException) -> int:
    code = getattr(exc, "exit_code", None)
    if isinstance(code, int) and not isinstance(code, bool):
        return code
    if isinstance(exc, ConfigError | RankTableError):
        return int(ExitCode.CONFIG_PERMANENT)
    if isinstance(exc, SDCDetected):
        return int(ExitCode.SDC_DETECTED)
    if isinstance(exc, HangDetected):
        return int(ExitCode.HANG_OR_STRAGGLER)
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else int(ExitCode.APPLICATION)
    if isinstance(exc, KeyboardInterrupt):
        return 128 + int(signal.SIGINT)
    if _is_infrastructure(exc):
        return int(ExitCode.INFRASTRUCTURE)
    return int(ExitCode.APPLICATION)


def _is_infrastructure(exc: BaseException) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        # a torch.distributed error exists only where torch.distributed was imported (a program
        # that never imported it must not pay seconds for the import at its end)
        dist_error = getattr(sys.modules.get("torch.distributed"), "DistError", None)
        if isinstance(dist_error, type) and isinstance(cur, dist_error):
            return True
        text = str(cur).lower()
        if any(p in text for p in _INFRA_PATTERNS):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def run() -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    rank = os.environ.get("RANK", "?")
    trainer = None
    try:
        from railyard_trainer.config import load_config
        from railyard_trainer.worker_env import WorkerEnv

        env = WorkerEnv.from_env()
        cfg = load_config(env.config_path)
        from railyard_trainer.train import Trainer

        trainer = Trainer(cfg, env)
        trainer.train()
        trainer.close()
        return 0
    except BaseException as exc:
        code = exit_code_for(exc)
        log_event(
            "worker_failed",
            rank=int(rank) if rank.isdigit() else rank,
            code=code,
            failure_class=str(classify_exit_code(code)) if code else "",
            error=repr(exc)[:2000],
        )
        traceback.print_exc(file=sys.stderr)
        record_worker_error(exc, code)  # the launcher's termination message quotes it
        if trainer is not None:
            trainer.watchdog.stop()
            if code == int(ExitCode.SDC_DETECTED):
                trainer.finish_after_sdc()
        return code


def main() -> None:
    code = run()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a broken process group can block in its destructor.
    os._exit(code)


if __name__ == "__main__":
    main()
