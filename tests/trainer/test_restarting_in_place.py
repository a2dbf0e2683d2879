"""The launcher restarts its workers in place when the operator says so, and the attempt fences
the rendezvous: real launchers (two "pods" of one rank each) against the operator's real control
endpoint (railyard.observe.control on aiohttp, in a thread), the test playing the reconcile.

- a crash on rank 1 in attempt 0: both launchers report their workers' exit codes and stay up;
  the operator publishes attempt 1; each launcher (the same process) starts its workers again
  on attempt 1's port and rank table, restoring from the checkpoint the order names; both end 0.
- a stale pod 1 of attempt 0 that cannot hear the operator (a partition) reaches attempt 1's
  rendezvous before the replacement: it never joins; attempt 1 forms with the real pod 1.
- a launcher of a pod that is no longer a member is told to stop, and stops.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from tests.waiting import wait_until

from railyard.observe.control import ControlBoard, add_control_routes
from railyard.protocol.control import LauncherState
from railyard.protocol.ports import free_port
from railyard.protocol.ranktable import PodEntry, RankEntry, RankTable

from .launch import BASE_TRAINER, launcher_env, parse_events, start_launcher

pytestmark = pytest.mark.torch

TOKEN = "t0ken"
NS, JOB = "ns", "t"


class Operator:
    """The control endpoint on a loop in a thread; ``call`` runs board methods on that loop."""

    def __init__(self) -> None:
        self.board = ControlBoard()
        self.loop = asyncio.new_event_loop()
        self.port = free_port()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(30), "control endpoint did not start"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        add_control_routes(app, self.board, lambda ns, job: TOKEN if (ns, job) == (NS, JOB) else None)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self.runner = runner
        ready.set()
        self.loop.run_forever()

    def call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        async def go() -> Any:
            return fn(*args, **kw)

        return asyncio.run_coroutine_threadsafe(go(), self.loop).result(10)

    def reports(self) -> dict[int, Any]:
        return {i: r for i, (r, _) in self.call(self.board.reports, NS, JOB).items()}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/control/{NS}/{JOB}"

    def close(self) -> None:
        self.call(self.board.close)
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def operator() -> Iterator[Operator]:
    op = Operator()
    try:
        yield op
    finally:
        op.close()


def table(attempt: int, port: int) -> RankTable:
    t = RankTable(job=JOB, attempt=attempt, pp=1, dp=2, tp=1, procs_per_node=1,
                  pods=(PodEntry(0, "node-a", "127.0.0.1", 1), PodEntry(1, "node-b", "127.0.0.1", 0)),
                  ranks=(RankEntry(0, "node-a", 0, 0, 0, 0, 0, 0), RankEntry(1, "node-b", 1, 0, 0, 0, 1, 0)),
                  master_addr="127.0.0.1", master_port=port)
    t.validate()
    return t


def start_pod(tmp: Path, pod: int, t: RankTable, op: Operator, *, name: str, trainer: dict[str, Any], control: bool = True,
              shared: Path) -> subprocess.Popen[str]:
    folder = tmp / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ranktable.json").write_text(t.to_json())
    env = launcher_env(RAILYARD_RANK_TABLE=str(folder / "ranktable.json"), RAILYARD_POD_INDEX=str(pod), RAILYARD_NODE_NAME=t.pods[pod].node,
                       RAILYARD_POD_NAME=name, RAILYARD_HEARTBEAT_TOKEN=TOKEN,
                       RAILYARD_ATTEMPT=str(t.attempt), RAILYARD_CHECKPOINT_SHARED_DIR=str(shared))
    if control:
        env["RAILYARD_CONTROL_URL"] = op.url
    config = {"job": JOB, "namespace": NS, "attempt": t.attempt, "trainer": trainer, "checkpoint": {"path": str(shared), "intervalSteps": 2},
              "restartWaitSeconds": 90}
    return start_launcher(folder, [], config, env)


def finish(p: subprocess.Popen[str], timeout: float = 240) -> tuple[int, list[dict[str, Any]], str]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    return p.returncode, parse_events(out), err


def test_workers_restart_in_place_for_the_new_attempt(tmp_path: Path, operator: Operator) -> None:
    t0, t1 = table(0, free_port()), table(1, free_port())
    trainer = {**BASE_TRAINER, "steps": 12, "collectiveTimeoutSeconds": 20, "watchdogSeconds": 15,
               "faults": [{"kind": "crash", "rank": 1, "step": 5, "attempt": 0}]}
    shared = tmp_path / "shared"
    operator.call(operator.board.publish, NS, JOB, attempt=0, members={0: "pod-0", 1: "pod-1"}, table=t0)
    pods = [start_pod(tmp_path, i, t0, operator, name=f"pod-{i}", trainer=trainer, shared=shared) for i in (0, 1)]
    try:
        # both launchers stay up and report their workers' exit: the crash (1) and its echo
        got = wait_until(lambda: (r := operator.reports()) and all(i in r and r[i].state is LauncherState.FAILED for i in (0, 1)) and r,
                         timeout=120, message="both launchers to report failed workers")
        assert got[1].code == 1 and got[1].attempt == 0, got[1]
        # its last words travel with the report (the pod keeps running: no termination message yet)
        assert "rank 1 exited with code 1" in got[1].message and "injected crash on rank 1" in got[1].message, got[1].message
        assert got[0].code != 0, got[0]
        assert all(p.poll() is None for p in pods), "launchers wait for the operator instead of exiting"
        operator.call(operator.board.publish, NS, JOB, attempt=1, members={0: "pod-0", 1: "pod-1"}, table=t1,
                      restore={"step": 4, "tier": "shared"})
        results = [finish(p) for p in pods]
    finally:
        for p in pods:
            if p.poll() is None:
                p.kill()
    for i, (code, events, err) in enumerate(results):
        assert code == 0, f"pod {i}: {err[-3000:]}\n{json.dumps(events[-12:])}"
        restarts = [e for e in events if e["event"] == "restart_in_place"]
        assert [(e["from_attempt"], e["attempt"]) for e in restarts] == [(0, 1)], restarts
        launches = [e for e in events if e["event"] == "launch"]
        assert [e["attempt"] for e in launches] == [0, 1], "one launcher process ran both attempts"
        assert [e["master"].rsplit(":", 1)[1] for e in launches] == [str(t0.master_port), str(t1.master_port)], "each attempt on its own port"
    assert max(e["step"] for e in results[0][1] if e["event"] == "step") == 12
    restored = [e for e in results[0][1] if e["event"] == "restored"]
    assert restored and restored[-1].get("step") == 4, "restored the step the order named"
    assert {r.attempt for r in operator.reports().values()} == {1}


def test_a_stale_rank_of_an_older_attempt_cannot_join_the_new_rendezvous(tmp_path: Path, operator: Operator) -> None:
    """Pod 1 was replaced in attempt 1; the old pod 1 (attempt 0), cut off from the operator so
    it cannot be told to stop, reaches attempt 1's rendezvous before the replacement does (the
    same port on purpose: only the attempt fences). Unfenced, it would complete attempt 1's gang
    with the new rank 0; fenced, rank 0 waits for the real pod 1, and the stale rank fails."""
    port = free_port()
    t0, t1 = table(0, port), table(1, port)
    operator.call(operator.board.publish, NS, JOB, attempt=1, members={0: "pod-0", 1: "pod-1-new"}, table=t1)
    trainer = {**BASE_TRAINER, "steps": 6, "collectiveTimeoutSeconds": 90, "watchdogSeconds": 80}
    pod0 = start_pod(tmp_path, 0, t1, operator, name="pod-0", trainer=trainer, shared=tmp_path / "s")
    stale = start_pod(tmp_path, 1, t0, operator, name="pod-1", control=False, shared=tmp_path / "stale",
                      trainer={**trainer, "collectiveTimeoutSeconds": 12, "watchdogSeconds": 10})
    try:
        stale_code, stale_events, _ = finish(stale, 120)
        assert pod0.poll() is None, "rank 0 of attempt 1 still waits for its pod 1"
        new = start_pod(tmp_path, 1, t1, operator, name="pod-1-new", trainer=trainer, shared=tmp_path / "s")
        (code0, events0, err0), (code1, events1, err1) = finish(pod0), finish(new)
    finally:
        for p in (pod0, stale):
            if p.poll() is None:
                p.kill()
    assert not [e for e in stale_events if e["event"] == "start"], f"the stale rank joined a gang: {stale_events[-5:]}"
    assert stale_code != 0
    assert code0 == 0 and code1 == 0, f"{err0[-2000:]}\n{err1[-2000:]}"
    started = [e for e in events0 if e["event"] == "start"]
    launched_new = next(e for e in events1 if e["event"] == "launch")
    assert started and started[0]["time"] >= launched_new["time"], "rank 0's gang formed only with the real pod 1"


def test_a_pod_that_is_no_longer_a_member_is_told_to_stop(tmp_path: Path, operator: Operator) -> None:
    port = free_port()
    t0 = table(0, port)
    trainer = {**BASE_TRAINER, "steps": 1000, "collectiveTimeoutSeconds": 30, "watchdogSeconds": 25}
    operator.call(operator.board.publish, NS, JOB, attempt=0, members={0: "pod-0", 1: "pod-1"}, table=t0)
    pods = [start_pod(tmp_path, i, t0, operator, name=f"pod-{i}", trainer=trainer, shared=tmp_path / "s") for i in (0, 1)]
    try:
        wait_until(lambda: (r := operator.reports()) and len(r) == 2 and all(x.state is LauncherState.RUNNING for x in r.values()),
                   timeout=60, message="both launchers running")
        # pod 1 was replaced (a partition healed late): the new attempt names another pod for index 1
        operator.call(operator.board.publish, NS, JOB, attempt=1, members={0: "pod-0", 1: "pod-1-new"}, table=replace(t0, attempt=1), open_=False)
        code, events, _ = finish(pods[1], 120)
    finally:
        for p in pods:
            if p.poll() is None:
                p.kill()
                p.wait()
    stops = [e for e in events if e["event"] == "stop_ordered"]
    assert stops and "was replaced" in stops[0]["reason"], events[-6:]
    assert code != 0 and [e for e in events if e["event"] == "launcher_exit"][-1]["reason"] == "stopped"
