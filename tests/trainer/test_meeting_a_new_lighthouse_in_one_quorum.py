"""The defect behind tests/system/test_losing_the_lighthouse.py's false SDC verdicts, on torchft's
own Lighthouse and Manager servers (no training, no process groups): a Lighthouse recreated under
the same address hands the first group to reach it a quorum of its own. With
railyard_trainer/replicas.py's RejoiningClient that group refuses it and asks again until the
other group of its last quorum is back, and both take part in one quorum under one id."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from datetime import timedelta
from typing import Any

import pytest
from tests.waiting import wait_until

from railyard.protocol.ports import free_port as _free_port
from railyard.protocol.quorum import group_of
from railyard_trainer.replicas import RejoiningClient

pytestmark = pytest.mark.torch

TIMEOUT = timedelta(seconds=20)


def _lighthouse(port: int, *, min_replicas: int = 1) -> subprocess.Popen[str]:
    """``railyard-train lighthouse`` in a process of its own: killing it closes its connections,
    as losing its node does (an in-process server's shutdown keeps serving them)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from railyard_trainer.replicas import lighthouse_main; "
         f"sys.exit(lighthouse_main(['--min-replicas', '{min_replicas}', '--bind', '127.0.0.1:{port}', "
         "'--join-timeout-ms', '10000']))"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the ``lighthouse`` event, once it listens
    assert json.loads(line)["event"] == "lighthouse", line
    return proc


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(30)


class Group:
    """One replica group's torchft Manager server, and the client its rank 0 asks through."""

    def __init__(self, index: int, lighthouse: str, *, heartbeat: timedelta) -> None:
        from torchft._torchft import ManagerClient, ManagerServer

        self.server = ManagerServer(replica_id=f"job-group-{index}:u{index}", lighthouse_addr=lighthouse,
                                    hostname="127.0.0.1", bind="[::]:0", store_addr=f"127.0.0.1:{2000 + index}",
                                    world_size=1, heartbeat_interval=heartbeat, connect_timeout=TIMEOUT,
                                    quorum_retries=40)
        # asks again for long enough that only a hang would make it give up
        self.client = RejoiningClient(ManagerClient(self.server.address(), connect_timeout=TIMEOUT), group=index,
                                      rank=0, rejoin_rounds=600)
        self.answers: list[Any] = []

    def ask(self, step: int) -> threading.Thread:
        def run() -> None:
            self.answers.append(self.client._quorum(group_rank=0, step=step, checkpoint_metadata="", shrink_only=False,
                                                    timeout=TIMEOUT, commit_failures=0, init_sync=False))

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t


def _members(answer: Any) -> list[str]:
    return sorted(group_of(m) for m in answer.replica_ids)


def test_the_first_group_to_reach_a_new_lighthouse_waits_for_the_other_instead_of_training_alone() -> None:
    port = _free_port()
    address = f"http://127.0.0.1:{port}"
    # the first Lighthouse forms its first quorum only with both groups: with one it could hand
    # the first to ask a quorum of its own, and its next quorums (torchft's fast quorum: every
    # member of the last one asking) then kept the groups apart
    old = _lighthouse(port, min_replicas=2)
    # group 1 beats once an hour, so the new Lighthouse does not know it is alive before it asks:
    # what happens when its Manager is still backing off from reconnecting (torchft)
    groups = [Group(0, address, heartbeat=timedelta(milliseconds=100)),
              Group(1, address, heartbeat=timedelta(hours=1))]
    try:
        def together() -> bool:
            for t in [g.ask(13) for g in groups]:
                t.join(30)
            return all(_members(g.answers[-1]) == ["job-group-0", "job-group-1"] for g in groups)

        assert together(), "both groups in one quorum on the first Lighthouse"
        before = [g.answers[-1].quorum_id for g in groups]
        assert before[0] == before[1]

        _kill(old)
        new = _lighthouse(port)  # the same address, as the operator recreates it
        try:
            asking = groups[0].ask(14)
            wait_until(lambda: groups[0].client.memory.rejoining, timeout=30,
                       message="group 0 refused the new Lighthouse's quorum of one")
            assert asking.is_alive(), "and still waits, instead of training step 14 alone"
            for t in (groups[1].ask(14), asking):
                t.join(30)
                assert not t.is_alive()
            got = [g.answers[-1] for g in groups]
            assert [_members(a) for a in got] == [["job-group-0", "job-group-1"]] * 2, "one quorum of both groups"
            assert got[0].quorum_id == got[1].quorum_id, "under one id"
            assert got[0].max_step == 14 and not got[0].heal and not got[1].heal, "at the step both stood at"
        finally:
            _kill(new)
    finally:
        _kill(old)
        for g in groups:
            g.server.shutdown()
