"""A container's termination message, as the kubelet makes it (``state.terminated.message``).

The kubelet reads the container's ``terminationMessagePath`` file (at most 4096 bytes) when it
exits; with ``terminationMessagePolicy: FallbackToLogsOnError`` and an empty file, a container
that exited non-zero gets the end of its log instead: the last 80 lines, at most 2048 bytes.
The local node agent gives each container such a file (its ``terminationMessagePath`` maps to
it, like a volume mount) and calls :func:`build_termination_message` when it exits.
"""

from __future__ import annotations

import os
from pathlib import Path

from railyard.protocol.termination import MAX_TERMINATION_MESSAGE_BYTES, TERMINATION_LOG

#: The kubelet's fallback: at most this many lines and bytes of the end of the log.
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048


def termination_message_path(container: dict[str, object]) -> str:
    """The container's ``terminationMessagePath`` (the API server defaults it)."""
    return str(container.get("terminationMessagePath") or TERMINATION_LOG)


def read_tail(path: Path, max_bytes: int) -> bytes:
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(size - max_bytes, 0))
            return fh.read(max_bytes)
    except OSError:
        return b""


def build_termination_message(message_file: Path, log_file: Path, *, policy: str, exit_code: int) -> str:
    """What the kubelet would report: the message file, else (FallbackToLogsOnError, exit code
    non-zero) the last lines of the log; "" when there is neither."""
    try:
        with message_file.open("rb") as fh:
            text = fh.read(MAX_TERMINATION_MESSAGE_BYTES)
    except OSError:
        text = b""
    if not text.strip() and policy == "FallbackToLogsOnError" and exit_code != 0:
        # the kubelet: the last 80 lines, of which the last 2048 bytes (a long first line is cut)
        tail = read_tail(log_file, FALLBACK_LOG_BYTES)
        text = b"".join(tail.splitlines(keepends=True)[-FALLBACK_LOG_LINES:])
    return text.decode("utf-8", "replace")
