"""The pod's last words: which of its ranks failed first, and that rank's error.

When a worker fails it writes its error (exit code, exception, the end of the traceback) to the
file its launcher named in ``RAILYARD_WORKER_ERROR_FILE`` (as torchrun's ``TORCHELASTIC_ERROR_FILE``
does). When the launcher exits non-zero it writes, to the container's termination message file
(``RAILYARD_TERMINATION_LOG``, railyard.protocol.termination), the rank whose exit code is the
pod's and that rank's error. Kubernetes puts it in the container's ``state.terminated.message``,
and the operator copies it into the job's status and Events, so it outlives the pod. The pod's
log alone cannot say this: after the first failure its other ranks, and the launcher, keep
writing for seconds, and the kubelet's fallback keeps only the log's last 2 KiB.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

from railyard.protocol import podenv
from railyard.protocol.exitcodes import classify_exit_code
from railyard.protocol.termination import MAX_TERMINATION_MESSAGE_BYTES, TERMINATION_LOG_ENV

WORKER_ERROR_FILE_ENV = podenv.WORKER_ERROR_FILE.name
#: How much of a traceback a worker keeps (its end: the exception is the last line).
MAX_TRACEBACK_CHARS = 3000


def worker_error_file(run_dir: Path, rank: int) -> Path:
    return run_dir / f"error-{rank}.json"


def record_worker_error(exc: BaseException, code: int, env: Mapping[str, str] = os.environ) -> None:
    """In a failing worker: write its error where the launcher reads it (nothing without the
    launcher's variable; never raises)."""
    path = env.get(WORKER_ERROR_FILE_ENV)
    if not path:
        return
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    record = {"code": code, "time": time.time(), "error": repr(exc)[:500], "traceback": tb[-MAX_TRACEBACK_CHARS:]}
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps(record))


def read_worker_errors(run_dir: Path, ranks: list[int]) -> dict[int, dict[str, object]]:
    """The errors the workers recorded (rank -> record); unreadable files are skipped."""
    out: dict[int, dict[str, object]] = {}
    for r in ranks:
        try:
            data = json.loads(worker_error_file(run_dir, r).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            out[r] = data
    return out


def build_termination_message(
    codes: Mapping[int, int], errors: Mapping[int, Mapping[str, object]], *, code: int
) -> str:
    """The pod's termination message for exit ``code``: the rank that explains it (the first
    to fail among those that exited with it) and that rank's traceback tail, at most the
    kubelet's 4096 bytes (the start of the traceback goes first)."""
    blamed = [r for r, c in codes.items() if c == code] or [r for r, c in codes.items() if c != 0] or sorted(codes)
    if not blamed:
        return f"exited with code {code} ({classify_exit_code(code)})"

    def when(r: int) -> float:
        t = (errors.get(r) or {}).get("time")
        return float(t) if isinstance(t, int | float) else float("inf")

    rank = min(blamed, key=lambda r: (when(r), r))
    others = sorted(r for r, c in codes.items() if c not in (0, None) and r != rank)
    head = f"rank {rank} exited with code {codes.get(rank, code)} ({classify_exit_code(codes.get(rank, code))}) first"
    if others:
        head += f"; then ranks {others}"
    err = errors.get(rank) or {}
    body = str(err.get("traceback") or err.get("error") or "").strip()
    return fit_termination_message(f"{head}\n{body}" if body else head)


def fit_termination_message(text: str, limit: int = MAX_TERMINATION_MESSAGE_BYTES) -> str:
    """``text`` within ``limit`` UTF-8 bytes: its first line, then as much of its end as fits."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    first, _, rest = text.partition("\n")
    room = limit - len(first.encode()) - len("\n...\n")
    tail = rest.encode()[-max(room, 0):].decode("utf-8", "ignore")
    return f"{first}\n...\n{tail}"[:limit]


def write_termination_message(text: str, env: Mapping[str, str] = os.environ) -> None:
    """Write the container's termination message (nothing without ``RAILYARD_TERMINATION_LOG``:
    outside a pod there is no such file; never raises)."""
    path = env.get(TERMINATION_LOG_ENV)
    if not path:
        return
    with contextlib.suppress(OSError):
        Path(path).write_text(fit_termination_message(text))
