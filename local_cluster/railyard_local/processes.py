"""A pod's processes on this machine: started so that they die with the agent, found as a
tree, signalled.

A pod's processes may start new sessions (the trainer's launcher does, to manage its workers), so
a process group is not the pod; on a real node the container's cgroup is. The tree under the
container's process (/proc/<pid>/task/<tid>/children) stands in for it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal


def set_parent_death_signal(sig: int) -> None:
    """Runs in a child before exec: the kernel sends it ``sig`` when its parent dies
    (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)


def die_with_agent() -> None:
    """Runs in a pod's process before exec: die with the agent."""
    set_parent_death_signal(signal.SIGKILL)


def process_tree(roots: list[int]) -> list[int]:
    """The roots and all their descendants. A pod's processes may start new sessions (the
    trainer's launcher does, to manage its workers), so a process group is not the pod; on a
    real node the container's cgroup is. This walks /proc/<pid>/task/<tid>/children instead."""
    seen: dict[int, None] = {}  # insertion-ordered set
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen[pid] = None
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as fh:
                    stack.extend(int(c) for c in fh.read().split())
            except (OSError, ValueError):
                continue
    return list(seen)


def signal_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
