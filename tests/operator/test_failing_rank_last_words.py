"""The first failing rank's exit code, pod, node and last words survive any restart: they go into
status.lastFailure, the Restarting/Failed condition and the Event. Pure builders table-driven;
the cycle in-process (fake cluster)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.operator.builders import make_node, make_pod
from tests.operator.fake_cluster import Harness, make_job

from railyard.logic.conditions import find_condition, format_time
from railyard.logic.failure_report import (
    MAX_MESSAGE_CHARS,
    MAX_QUOTE_CHARS,
    describe_failure,
    explain_failure,
    quote_last_words,
    tail_of,
)
from railyard.logic.failures import classify_pod, decide_root_failure

TRACEBACK = """Traceback (most recent call last):
  File "/app/train.py", line 12, in <module>
    load("/data/shard-7")
  File "/app/data.py", line 3, in load
    open(path)
FileNotFoundError: [Errno 2] No such file or directory: '/data/shard-7'
"""
CRASH = "loading data from /data/shard-7 ... FileNotFoundError"


@pytest.mark.parametrize(("message", "quoted"), [
    ("", ""),
    (CRASH + "\n", CRASH),
    (TRACEBACK, "load(\"/data/shard-7\") | File \"/app/data.py\", line 3, in load | open(path) | FileNotFoundError: [Errno 2] No such file or directory: '/data/shard-7'"),
    ("a\n\n\nb\n", "a | b"),
    ("x" * 1000, "..." + "x" * (MAX_QUOTE_CHARS - 3)),
    ("first line\n" + "y" * 290 + "\nlast line", "y" * 290),
], ids=["empty", "one line", "traceback", "blank lines", "one long line", "only what fits"])
def test_last_words_quoted_on_one_line(message: str, quoted: str) -> None:
    got = quote_last_words(message, max_lines=4)
    if quoted == "y" * 290:
        assert got.endswith("last line") and len(got) <= MAX_QUOTE_CHARS
    else:
        assert got == quoted
    assert "\n" not in got and len(got) <= MAX_QUOTE_CHARS


def test_the_tail_of_a_long_message_starts_at_a_line() -> None:
    text = "\n".join(f"line {i:04d}" for i in range(500))
    tail = tail_of(text)
    assert len(tail) <= MAX_MESSAGE_CHARS and tail.endswith("line 0499") and tail.startswith("line ")
    assert tail_of("short\n") == "short"


def _failed(index: int, code: int, *, at: float, message: str = "", node: str = "") -> dict[str, Any]:
    pod = make_pod(attempt=2, index=index, node=node or f"node-{index}").exited(code).obj()
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    term["finishedAt"] = format_time(at)
    if message:
        term["message"] = message
    return pod


NODES = {f"node-{i}": make_node(f"node-{i}") for i in range(4)}


def test_the_report_names_the_pod_that_failed_first_not_its_echoes() -> None:
    pods = [
        _failed(0, 70, at=100.0, message="gloo: connection reset by peer"),  # an echo, first to exit
        _failed(1, 1, at=103.0, message=TRACEBACK),
        _failed(2, 1, at=101.0, message=CRASH),  # the same crash, a little earlier
        make_pod(attempt=2, index=3, node="node-3").obj(),  # still running
    ]
    root = decide_root_failure(f for p in pods if (f := classify_pod(p, NODES)) is not None)
    assert root is not None and root.kind == "ApplicationExitCode"
    f, report = explain_failure(root, pods, NODES, attempt=2, time="t")
    assert (report.pod, report.pod_index, report.node, report.exit_code, report.attempt) == ("j-a2-2", 2, "node-2", 1, 2)
    assert report.message == CRASH and report.reason == "ApplicationExitCode" and report.time == "t"
    assert f.pod == "j-a2-2" and f.message == "trainer exited with code 1 in j-a2-2"
    said = describe_failure(f, report)
    assert said == f'trainer exited with code 1 in j-a2-2 on node node-2: "{CRASH}"'


def test_a_failure_no_pod_shows_keeps_its_own_words() -> None:
    from railyard.logic.failures import build_verdict_failure

    hang = build_verdict_failure("Hang", "rank 3 made no progress for 31s", ["node-1"])
    assert hang is not None
    f, report = explain_failure(hang, [make_pod(attempt=0).obj()], NODES, attempt=0, time="t")
    assert f == hang and report.pod == "" and report.node == "node-1" and report.exit_code is None
    assert describe_failure(f, report) == hang.message + " on node node-1"


def cluster() -> list[dict[str, Any]]:
    return [make_node(f"node-{i}", gpus=2, leaf=f"leaf-{i // 2}") for i in range(4)]


async def _running(h: Harness) -> None:
    await h.cycle()
    h.run_pods()
    await h.cycle(1.0)
    assert h.status.phase == "Running"


async def test_a_crash_is_explained_in_the_restart_and_the_failure_after_its_pods_are_gone() -> None:
    h = Harness(cluster(), make_job(restartPolicy={"application": {"limit": 1, "backoffSeconds": 0}}))
    await _running(h)
    node0 = h.pod_nodes()[0]
    h.exit_pod(0, 1, message=CRASH + "\n")
    await h.cycle(1.0)
    st = h.status
    assert st.phase == "Restarting"
    restarting = find_condition(st.conditions, "Restarting")
    assert restarting is not None and CRASH in restarting.message and node0 in restarting.message and "j-a0-0" in restarting.message
    assert st.last_failure is not None and (st.last_failure.pod, st.last_failure.exit_code, st.last_failure.attempt) == ("j-a0-0", 1, 0)
    (event,) = [m for _, r, m in h.cluster.events if r == "ApplicationExitCode"]
    assert CRASH in event
    # the restart deletes attempt 0's pods; what they said stays
    h.cluster.finish_deletions()
    await h.cycle(1.0)
    assert not h.cluster.pods_of(0) and h.status.phase == "Starting"
    assert h.status.last_failure is not None and h.status.last_failure.message == CRASH
    # attempt 1 fails the same way on its other pod: the budget is spent
    h.run_pods()
    await h.cycle(1.0)
    h.exit_pod(1, 1, message="boom on attempt 1")
    await h.cycle(1.0)
    st = h.status
    failed = find_condition(st.conditions, "Failed")
    assert st.phase == "Failed" and failed is not None and failed.reason == "RestartBudgetSpent"
    assert "boom on attempt 1" in failed.message and "j-a1-1" in failed.message
    assert st.last_failure is not None and (st.last_failure.pod, st.last_failure.attempt) == ("j-a1-1", 1)
    assert any(r == "RestartBudgetSpent" and "boom on attempt 1" in m for _, r, m in h.cluster.events)


async def test_a_gang_found_starting_says_so_not_gang_created() -> None:
    h = Harness(cluster(), make_job())
    await h.cycle()
    # an operator that lost the job's status finds a gang with one pod Running of two
    h.cluster.pods_of(0)[0]["status"] = {"phase": "Running"}
    h.worker.status_wire = None
    h.worker.body["status"] = {**h.cluster.status, "phase": "Placing"}
    h.cluster.status = dict(h.worker.body["status"])
    await h.cycle(1.0)
    head = find_condition(h.status.conditions, "Placed")
    assert h.status.phase == "Starting" and head is not None and head.reason == "GangStarting"
    assert [m for _, r, m in h.cluster.events if r == "GangStarting"] == [h.status.message]
    assert "1/2 pods Running" in h.status.message
    assert all("pods created" in m for _, r, m in h.cluster.events if r == "GangCreated"), "GangCreated means the gang was created"
