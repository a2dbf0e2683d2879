"""``railyard logs``: which pods it reads and how it labels their lines (pure helpers; the
command against a cluster runs in test_debugging_a_failed_job_on_local_cluster.py)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.operator.builders import make_pod

from railyard.commands.logs import (
    Source,
    build_sources,
    choose_attempt,
    describe_last_failure,
    describe_no_pods,
    format_ranks,
    gang_pods,
    prefixed,
)
from railyard.protocol.ranktable import PodEntry, RankEntry, RankTable


def table(attempt: int, ranks_per_pod: int, pods: int) -> RankTable:
    return RankTable(
        job="j", attempt=attempt, pp=1, dp=pods * ranks_per_pod, tp=1, procs_per_node=ranks_per_pod,
        pods=tuple(PodEntry(i, f"node-{i}", f"j-{i}.j.ns.svc") for i in range(pods)),
        ranks=tuple(RankEntry(rank=i * ranks_per_pod + r, node=f"node-{i}", pod_index=i, local_rank=r, rail=r, pp=0, dp=i * ranks_per_pod + r, tp=0)
                    for i in range(pods) for r in range(ranks_per_pod)),
        master_addr="j-0.j.ns.svc", master_port=29500,
    )


def pods(attempts: dict[int, int]) -> list[dict[str, Any]]:
    return [make_pod(attempt=a, index=i).obj() for a, n in attempts.items() for i in range(n)]


@pytest.mark.parametrize(("ranks", "text"), [((3,), "rank 3"), ((0, 1, 2, 3), "ranks 0-3"), ((4, 0, 2), "ranks 0,2,4")])
def test_ranks_are_named_compactly(ranks: tuple[int, ...], text: str) -> None:
    assert format_ranks(ranks) == text


def test_every_line_gets_the_prefix() -> None:
    s = Source("j-a1-0", 0, (0, 1))
    assert prefixed(s.prefix, "a\nb") == "[j-a1-0 ranks 0-1] a\n[j-a1-0 ranks 0-1] b\n"
    assert prefixed(Source("j-a1-0", 0, ()).prefix, "x\n") == "[j-a1-0] x\n", "without a rank table: the pod only"
    assert prefixed("[p] ", "") == ""


def test_the_newest_attempt_with_pods_is_shown_by_default() -> None:
    ps = pods({1: 2, 2: 2})
    assert choose_attempt(ps, None) == 2 and choose_attempt(ps, 1) == 1 and choose_attempt([], None) is None


def test_sources_by_pod_index_with_their_ranks_narrowed_to_a_rank_or_a_pod() -> None:
    ps = pods({2: 3})[::-1]
    t = table(2, 2, 3)
    assert [(s.pod, s.ranks) for s in build_sources(ps, 2, t)] == [("j-a2-0", (0, 1)), ("j-a2-1", (2, 3)), ("j-a2-2", (4, 5))]
    assert [s.pod for s in build_sources(ps, 2, t, rank=3)] == ["j-a2-1"]
    assert [s.pod for s in build_sources(ps, 2, t, pod="2")] == ["j-a2-2"]
    assert [s.pod for s in build_sources(ps, 2, t, pod="j-a2-0")] == ["j-a2-0"]
    with pytest.raises(ValueError, match="--rank 9: no pod"):
        build_sources(ps, 2, t, rank=9)
    with pytest.raises(ValueError, match="--rank 1: the rank table of attempt 2 is gone"):
        build_sources(ps, 2, None, rank=1)
    with pytest.raises(ValueError, match=r"--pod x: no such pod in attempt 2 \(its pods: j-a2-0, j-a2-1, j-a2-2\)"):
        build_sources(ps, 2, t, pod="x")


def test_checkpoint_cleanup_pods_are_not_the_gang() -> None:
    cleaner = make_pod(attempt=0).obj()
    cleaner["metadata"]["labels"]["railyard.dev/cleanup"] = "true"
    assert gang_pods([cleaner, *pods({0: 1})]) == pods({0: 1})


def test_with_no_pod_left_the_last_failure_is_told() -> None:
    told = describe_last_failure({"lastFailure": {"attempt": 1, "reason": "ApplicationExitCode", "pod": "j-a1-0", "node": "node-1",
                                                  "exitCode": 1, "message": "Traceback ...\nFileNotFoundError: /data/shard-7"}})
    assert told == ("last failure (attempt 1): ApplicationExitCode, exit code 1 (pod j-a1-0, node node-1)\n"
                    "  Traceback ...\n  FileNotFoundError: /data/shard-7\n")
    assert describe_last_failure({}) == ""


NOT_ENOUGH = "need 2 nodes with 2 free GPUs, 1 have them"


@pytest.mark.parametrize(("status", "attempt", "said"), [
    # a job that has not started says what it is doing, not that its pods are gone (issue 35)
    ({"phase": "Placing", "message": NOT_ENOUGH, "conditions": [{"type": "Placed", "status": "False", "reason": "NotEnoughNodes"}]}, None,
     f"default/tiny has no pods yet: it is Placing (NotEnoughNodes: {NOT_ENOUGH}); its logs appear once its pods start\n"),
    ({}, None, "default/tiny has no pods yet: it is Pending; its logs appear once its pods start\n"),
    ({"phase": "Suspended", "message": "spec.suspend is true", "conditions": [{"type": "Suspended", "status": "True", "reason": "Suspended"}]}, None,
     "default/tiny has no pods yet: it is Suspended (Suspended: spec.suspend is true); its logs appear once it is resumed and its pods start\n"),
    ({"phase": "Restarting", "attempt": 2}, None, "default/tiny has no pods now: it is Restarting; its logs appear once its pods start\n"),
    ({"phase": "Running", "attempt": 2}, 0, "no pods of attempt 0 of default/tiny are left (the job is Running, at attempt 2)\n"),
    ({"phase": "Succeeded"}, None,
     "no pods of default/tiny are left (a finished job keeps its pods for spec.cleanup.ttlSecondsAfterFinished)\n"),
])
def test_without_pods_it_says_what_is_true_of_the_job(status: dict[str, Any], attempt: int | None, said: str) -> None:
    assert describe_no_pods(status, "default/tiny", attempt=attempt) == said
