"""Exit codes of the trainer's launcher (``railyard-train``), one per failure class.

The operator reads a pod's container exit code and maps it to a failure class with
:func:`classify_exit_code`; each class has its own restart budget. Codes avoid 1/2 (generic
Python errors), 126-165 (shell and signal range: 128+N is "killed by signal N").
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    SUCCESS = 0
    #: Generic crash of user/trainer code: an application failure, restartable.
    APPLICATION = 1
    #: Bad configuration (invalid parallel dims, missing files): retrying cannot help.
    CONFIG_PERMANENT = 64
    #: A collective timed out, rendezvous failed, peer vanished: infrastructure, restartable.
    INFRASTRUCTURE = 70
    #: A health check confirmed silent data corruption on this pod's GPU(s).
    SDC_DETECTED = 75
    #: The trainer found itself hung (watchdog) or throttled far below its peers.
    HANG_OR_STRAGGLER = 76
    #: Restore found no verified checkpoint although one was required.
    NO_VERIFIED_CHECKPOINT = 77


class FailureClass(enum.StrEnum):
    INFRASTRUCTURE = "Infrastructure"
    APPLICATION = "Application"
    SDC = "SDC"
    STRAGGLER = "Straggler"
    PERMANENT = "Permanent"
    #: Not a failure: a node announced to go (cordoned, tainted, maintenance), the gang moved
    #: off it ahead of time (logic/planned.py). No exit code maps here; it spends no budget.
    PLANNED = "Planned"


_BY_CODE: dict[int, FailureClass] = {
    ExitCode.APPLICATION: FailureClass.APPLICATION,
    ExitCode.CONFIG_PERMANENT: FailureClass.PERMANENT,
    ExitCode.INFRASTRUCTURE: FailureClass.INFRASTRUCTURE,
    ExitCode.SDC_DETECTED: FailureClass.SDC,
    ExitCode.HANG_OR_STRAGGLER: FailureClass.STRAGGLER,
    ExitCode.NO_VERIFIED_CHECKPOINT: FailureClass.PERMANENT,
    # Killed by SIGKILL/SIGTERM from outside (node shutdown, eviction): infrastructure.
    128 + 9: FailureClass.INFRASTRUCTURE,
    128 + 15: FailureClass.INFRASTRUCTURE,
}


def classify_exit_code(code: int) -> FailureClass:
    """Failure class of a non-zero container exit code; unknown codes are application errors."""
    return _BY_CODE.get(code, FailureClass.APPLICATION)
