"""Rendezvous fenced by the attempt: a rank can only ever meet ranks of its own attempt.

Each attempt already rendezvouses on its own port (the operator derives ``MASTER_PORT`` from the
job and the attempt). On top of that the process group is built on a store whose keys are
prefixed with the attempt (``RAILYARD_ATTEMPT``, set by the launcher for every generation of
workers), so even a rank that reaches another attempt's store (a port reused, a stale address)
waits among its own attempt's keys and times out: it never joins a gang of another attempt.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

import torch.distributed as dist

from railyard.protocol import podenv


def attempt_prefix(attempt: str) -> str:
    return f"railyard/attempt-{attempt}"


def build_attempt_store(timeout_s: float, env: Mapping[str, str] | None = None) -> dist.Store | None:
    """The store of this attempt's rendezvous (None without ``RAILYARD_ATTEMPT``: env://).

    ``wait_for_workers`` is off: the store server does not count raw connections (a stray one
    would count); the process group's own barrier, under the prefix, counts only this attempt's
    ranks."""
    e = os.environ if env is None else env
    attempt, addr, port = podenv.ATTEMPT.get(e), podenv.MASTER_ADDR.get(e), podenv.MASTER_PORT.get(e)
    if attempt is None or not addr or port is None:
        return None
    rank, world = int(e["RANK"]), int(e["WORLD_SIZE"])
    store = dist.TCPStore(addr, port, world, is_master=rank == 0,
                          timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
    return dist.PrefixStore(attempt_prefix(str(attempt)), store)
