"""The reconcile state machine, table-driven and in-process: a start state, one event, and the
decisions that must follow (phase, headline reason, what was written to the cluster). Every
phase transition of docs/operator.md has a row. No cluster: the cycle's I/O seam is
tests/operator/fake_cluster.py, the clock is the test's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from tests.operator.builders import make_node
from tests.operator.fake_cluster import Harness, make_job

from railyard.logic.conditions import find_condition, format_time
from railyard.logic.manifests import CLEANUP_FINALIZER

Step = Callable[[Harness], Awaitable[None]]


def cluster(n: int = 4, *, gpus: int = 2) -> list[dict[str, Any]]:
    return [make_node(f"node-{i}", gpus=gpus, leaf=f"leaf-{i // 2}") for i in range(n)]


# --------------------------------------------------------------------------- start states


async def fresh(h: Harness) -> None:
    return None


async def starting(h: Harness) -> None:
    await h.cycle()
    assert h.status.phase == "Starting", h.cluster.events


async def starting_unbound(h: Harness) -> None:
    """Starting, the scheduler not having bound any pod yet."""
    h.cluster.scheduler_binds = False
    await starting(h)
    assert not any(p["spec"].get("nodeName") for p in h.cluster.pods_of(0))


async def running(h: Harness) -> None:
    await starting(h)
    h.run_pods()
    await h.cycle(1.0)
    assert h.status.phase == "Running", h.cluster.events


async def restarting(h: Harness) -> None:
    await running(h)
    h.exit_pod(0, 1)
    await h.cycle(1.0)
    assert h.status.phase == "Restarting", h.cluster.events


async def suspended(h: Harness) -> None:
    await running(h)
    h.edit_spec(suspend=True)
    await h.cycle(1.0)
    h.cluster.finish_deletions()
    await h.cycle(1.0)
    assert h.status.phase == "Suspended"


async def invalid(h: Harness) -> None:
    h.edit_spec(nodes=0)
    await h.cycle()
    assert h.status.phase == "Failed"


# --------------------------------------------------------------------------- events


def cycle(after: float = 1.0) -> Step:
    async def go(h: Harness) -> None:
        await h.cycle(after)

    return go


def then(*steps: Step) -> Step:
    async def go(h: Harness) -> None:
        for s in steps:
            await s(h)

    return go


def do(fn: Callable[[Harness], Any]) -> Step:
    async def go(h: Harness) -> None:
        fn(h)

    return go


def all_running() -> Step:
    return then(do(lambda h: h.run_pods()), cycle())


def pod_exits(index: int, code: int, **kw: Any) -> Step:
    return then(do(lambda h: h.exit_pod(index, code, **kw)), cycle())


def all_exit_0() -> Step:
    return then(do(lambda h: [h.exit_pod(i, 0) for i in range(len(h.cluster.pods_of(h.status.attempt)))]), cycle())


def node_of_pod_down(index: int, after: float = 5.0) -> Step:
    return then(do(lambda h: h.node_down(h.pod_nodes()[index])), cycle(after))


def taint_planned_node(index: int, effect: str = "NoSchedule") -> Step:
    """An administrator taints the node the placement chose for pod ``index`` (after it placed)."""

    def go(h: Harness) -> None:
        node = h.pod_nodes()[index]
        h.cluster.nodes[node]["spec"]["taints"] = [{"key": "maintenance", "value": "now", "effect": effect}]

    return then(do(go), cycle())


def old_pods_gone_then(after: float) -> Step:
    return then(do(lambda h: h.cluster.finish_deletions()), cycle(after))


def edit(**spec: Any) -> Step:
    return then(do(lambda h: h.edit_spec(**spec)), cycle())


# --------------------------------------------------------------------------- checks


def pods_created(n: int, attempt: int) -> Callable[[Harness], None]:
    def check(h: Harness) -> None:
        pods = h.cluster.pods_of(attempt)
        assert len(pods) == n and len(set(h.pod_nodes(attempt))) == n
        assert all(not p["spec"].get("schedulingGates") for p in pods), "every gate lifted"
        kinds = {k for k, _ in h.cluster.objects}
        assert {"ConfigMap", "Service", "Secret"} <= kinds
        assert h.status.placement is not None and h.status.placement.attempt == attempt
        assert h.status.placement.nodes == h.pod_nodes(attempt)

    return check


def live_pods(h: Harness, attempt: int) -> list[dict[str, Any]]:
    return [p for p in h.cluster.pods_of(attempt) if not p["metadata"].get("deletionTimestamp")]


def no_pods_of(attempt: int) -> Callable[[Harness], None]:
    def check(h: Harness) -> None:
        assert not live_pods(h, attempt)

    return check


def keeps_pods(attempt: int, n: int) -> Callable[[Harness], None]:
    """A finished job keeps its pods (logs, exit codes; a running peer gets time to exit)."""
    def check(h: Harness) -> None:
        assert len(live_pods(h, attempt)) == n

    return check


def refuse_pods(status: int, reason: str, message: str, *, after: int = 1) -> Step:
    """The API server refuses the gang's pods from the ``after``-th on."""
    return do(lambda h: setattr(h.cluster, "pod_create_error", (status, {"kind": "Status", "reason": reason, "message": message, "code": status}, after)))


INVALID_POD = 'Pod "j-a0-1" is invalid: spec.containers[0].resources.requests[memory]: Invalid value: "lots": quantities must match the regular expression'
QUOTA = 'pods "j-a0-1" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=2, used: requests.nvidia.com/gpu=6, limited: requests.nvidia.com/gpu=8'


def rolled_back(h: Harness) -> None:
    """No half gang: the refused attempt's pods and its ConfigMap are gone."""
    assert not h.cluster.pods_of(0), "the pods created before the refusal are deleted"
    assert ("ConfigMap", "j-a0") not in h.cluster.objects


def quarantined(index_of_failed: int = 0) -> Callable[[Harness], None]:
    def check(h: Harness) -> None:
        q = [n for verb, n in h.cluster.calls if verb == "quarantine"]
        assert len(q) == 1 and h.status.quarantined_nodes[0].node == q[0]
        assert "NodeQuarantined" in h.reasons()

    return check


def delay_is(expected: float) -> Callable[[Harness], None]:
    def check(h: Harness) -> None:
        assert h.delays[-1] == pytest.approx(expected)

    return check


def then_all(*checks: Callable[[Harness], None]) -> Callable[[Harness], None]:
    def check(h: Harness) -> None:
        for c in checks:
            c(h)

    return check


def warned(reason: str) -> Callable[[Harness], None]:
    """The Event for ``reason`` is a Warning."""
    def check(h: Harness) -> None:
        assert any(t == "Warning" and r == reason for t, r, _ in h.cluster.events), h.cluster.events

    return check


def condition_is(kind: str, status: str) -> Callable[[Harness], None]:
    def check(h: Harness) -> None:
        c = find_condition(h.status.conditions, kind)
        assert c is not None and c.status == status, c

    return check


def nothing(h: Harness) -> None:
    return None


def expect(pred: Callable[[Harness], bool]) -> Callable[[Harness], None]:
    def check(h: Harness) -> None:
        assert pred(h), h.cluster.events

    return check


@dataclass(frozen=True)
class Row:
    name: str
    given: Step
    when: Step
    phase: str
    reason: str
    check: Callable[[Harness], None] = nothing
    spec: tuple[tuple[str, Any], ...] = ()
    nodes: int = 4


ROWS = [
    # Pending -> Starting: placed whole and created gated, gates lifted together
    Row("absent gang is placed and created", fresh, cycle(0), "Starting", "GangCreated", pods_created(2, 0)),
    # Pending -> Placing: not enough nodes, retried with backoff
    Row("too few nodes", fresh, cycle(0), "Placing", "NotEnoughNodes", then_all(delay_is(2.0), no_pods_of(0), warned("NotEnoughNodes")), nodes=1),
    # Pending -> Failed: a shape placement can never satisfy
    Row("impossible shape", fresh, cycle(0), "Failed", "InvalidShape", no_pods_of(0), spec=(("parallelism", {"tensor": 1, "data": 3}),)),
    # Pending -> Failed: a spec the models refuse
    Row("invalid spec", fresh, edit(nodes=0), "Failed", "InvalidSpec", no_pods_of(0)),
    # Failed/InvalidSpec -> Starting: the spec was fixed (a new generation)
    Row("fixed spec starts over", invalid, edit(nodes=2), "Starting", "GangCreated", expect(lambda h: h.status.attempt == 1)),
    # Pending -> Placing: the scheduler's PodGroup CRD is missing
    Row("podgroup kind missing", fresh, then(do(lambda h: setattr(h.cluster, "podgroup_error", 404)), cycle(0)), "Placing", "PodGroupUnavailable",
        no_pods_of(0), spec=(("gang", {"schedulerName": "volcano"}),)),
    # Starting -> Running
    Row("all pods running", starting, all_running(), "Running", "AllPodsRunning", expect(lambda h: h.status.time_to_all_ready_seconds is not None)),
    # Starting -> Placing: the schedule timeout passed (tear down, attempt + 1)
    Row("gang timeout", starting, cycle(301.0), "Placing", "GangTimeout",
        then_all(expect(lambda h: h.status.attempt == 1 and not live_pods(h, 0) and h.status.restarts.total == 0), warned("GangTimeout"))),
    # Starting -> Placing at once: a pod's planned node was tainted before the scheduler bound it
    Row("planned node tainted", starting_unbound, taint_planned_node(1), "Placing", "NodeUnusable",
        expect(lambda h: h.status.attempt == 1 and not live_pods(h, 0) and "maintenance" not in h.status.message
               and "Tainted" in h.status.message)),
    # Running -> Restarting: an application crash spends the application budget, backs off
    Row("application crash", running, pod_exits(0, 1), "Restarting", "ApplicationExitCode",
        expect(lambda h: h.status.restarts.application == 1 and h.status.next_attempt_time is not None and h.status.attempt == 1
               and not h.status.quarantined_nodes)),
    # Running -> Restarting: a node NotReady past the grace: quarantined, the gang deleted by force
    Row("node lost", running, node_of_pod_down(1), "Restarting", "NodeNotReady", quarantined()),
    # Running -> Failed: a permanent exit code is not retried
    Row("permanent exit", running, pod_exits(0, 64), "Failed", "PermanentExitCode",
        then_all(keeps_pods(0, 2), expect(lambda h: h.status.restarts.total == 0 and h.status.attempt == 0))),
    # Running -> Failed: the class's budget is spent; the failed pod stays, its running peer goes
    Row("budget spent", running, pod_exits(0, 1), "Failed", "RestartBudgetSpent",
        then_all(keeps_pods(0, 2), expect(lambda h: "(0/0)" in h.status.message and "spec.restartPolicy.application.limit" in h.status.message
                                          and h.status.last_failure is not None and (h.status.last_failure.pod, h.status.last_failure.exit_code) == ("j-a0-0", 1))),
        spec=(("restartPolicy", {"application": {"limit": 0}}),)),
    # Running -> Succeeded: every pod exited 0; they stay (spec.cleanup.pods Keep) until the TTL
    Row("all succeeded", running, all_exit_0(), "Succeeded", "AllRanksSucceeded",
        then_all(expect(lambda h: h.status.completion_time is not None), keeps_pods(0, 2), delay_is(86400.0))),
    # Running -> Succeeded with spec.cleanup.pods Delete: every pod goes at once
    Row("succeeded, pods deleted", running, all_exit_0(), "Succeeded", "AllRanksSucceeded", no_pods_of(0),
        spec=(("cleanup", {"pods": "Delete"}),)),
    # Running -> Succeeded with spec.cleanup.pods KeepFailed: a success keeps nothing
    Row("succeeded, KeepFailed", running, all_exit_0(), "Succeeded", "AllRanksSucceeded", no_pods_of(0),
        spec=(("cleanup", {"pods": "KeepFailed"}),)),
    # Pending -> Failed: the API server refuses the gang's pods for good (400/422/policy)
    Row("pods invalid", fresh, then(refuse_pods(422, "Invalid", INVALID_POD), cycle(0)), "Failed", "ObjectInvalid",
        then_all(rolled_back, expect(lambda h: INVALID_POD in h.status.message))),
    # Pending -> Placing: the API server refuses the pods for now (quota): waits, creates again later
    Row("quota exceeded", fresh, then(refuse_pods(403, "Forbidden", QUOTA), cycle(0)), "Placing", "QuotaExceeded",
        then_all(rolled_back, delay_is(30.0), expect(lambda h: QUOTA in h.status.message and h.status.next_attempt_time is not None))),
    # Running: exit 70 while peers run is an echo; wait for the cause (Settling), no decision
    Row("echo settles", running, pod_exits(0, 70), "Running", "AllPodsRunning", expect(lambda h: h.delays[-1] is not None and h.delays[-1] <= 8.0)),
    # Restarting: the old pods are still terminating: no new gang yet, look again in a second
    Row("waits for old pods", restarting, cycle(30.0), "Restarting", "ApplicationExitCode",
        then_all(delay_is(1.0), expect(lambda h: not h.cluster.pods_of(1)))),
    # Restarting -> Starting: old pods gone and the backoff passed: placed sticky, attempt 1
    Row("restart re-places", restarting, old_pods_gone_then(30.0), "Starting", "GangCreated", pods_created(2, 1)),
    # Running -> Suspended
    Row("suspend", running, then(edit(suspend=True)), "Suspended", "Suspended", expect(lambda h: h.status.gang_created_time is None)),
    # Suspended -> Starting (via Placing/Resumed, not a restart)
    Row("resume", suspended, edit(suspend=False), "Starting", "GangCreated",
        then_all(expect(lambda h: h.status.attempt == 1 and h.status.restarts.total == 0 and len(h.cluster.pods_of(1)) == 2),
                 condition_is("Suspended", "False"))),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
async def test_transition(row: Row) -> None:
    h = Harness(cluster(row.nodes), make_job(**dict(row.spec)))
    await row.given(h)
    await row.when(h)
    st = h.status
    assert st.phase == row.phase, (st.phase, st.message, h.cluster.events)
    head = find_condition(st.conditions, _HEADLINE[row.phase])
    assert head is not None and head.reason == row.reason, (head, st.message)
    row.check(h)
    # one Event per phase transition: the last one says what the status says
    if row.phase != "Running":
        assert any(r == row.reason for r in h.reasons()), h.cluster.events


_HEADLINE = {"Placing": "Placed", "Starting": "Placed", "Running": "Running", "Restarting": "Restarting",
             "Suspended": "Suspended", "Succeeded": "Succeeded", "Failed": "Failed"}


#: The phase transitions docs/operator.md describes (How a job runs, Failures, Lifecycle).
DOCUMENTED = {
    ("Pending", "Starting"), ("Pending", "Placing"), ("Pending", "Failed"), ("Failed", "Starting"),
    ("Starting", "Running"), ("Starting", "Placing"), ("Running", "Restarting"), ("Running", "Failed"),
    ("Running", "Succeeded"), ("Restarting", "Restarting"), ("Restarting", "Starting"),
    ("Running", "Suspended"), ("Suspended", "Starting"), ("Running", "Running"),
}
_START = {fresh: "Pending", starting: "Starting", starting_unbound: "Starting", running: "Running", restarting: "Restarting", suspended: "Suspended", invalid: "Failed"}


def test_every_documented_transition_has_a_row() -> None:
    assert {(_START[r.given], r.phase) for r in ROWS} == DOCUMENTED


# --------------------------------------------------------------------------- beyond single steps


async def test_sticky_restart_keeps_healthy_pods_and_moves_the_failed_one_to_the_spare() -> None:
    h = Harness(cluster(4), make_job(gang={"hotSpares": 1}))
    await running(h)
    first = h.pod_nodes(0)
    spare = h.status.placement.spares[0]  # type: ignore[union-attr]
    await node_of_pod_down(1)(h)
    assert h.status.phase == "Restarting"
    h.cluster.finish_deletions()
    await h.cycle(1.0)
    second = h.pod_nodes(1)
    assert second[0] == first[0] and second[1] == spare
    assert h.status.placement.moved == [1] and h.status.placement.attempt == 1  # type: ignore[union-attr]
    assert any("moved pod indices [1]" in m for _, r, m in h.cluster.events if r == "GangCreated")


async def test_a_starting_gang_waits_when_its_planned_nodes_can_still_take_it() -> None:
    # A tolerated taint and a node that went NotReady (it may come back; the schedule timeout
    # covers it) do not tear the gang down; a bound pod's node is the kubelet's business.
    h = Harness(cluster(4), make_job(tolerations=[{"key": "maintenance", "operator": "Exists"}]))
    await starting_unbound(h)
    await taint_planned_node(0)(h)
    down = h.pod_nodes()[1]
    ready = h.cluster.nodes[down]["status"]["conditions"]
    h.node_down(down)
    await h.cycle(1.0)
    assert (h.status.phase, h.status.attempt) == ("Starting", 0), h.status.message
    assert len(live_pods(h, 0)) == 2 and "NodeUnusable" not in h.reasons()
    h.cluster.nodes[down]["status"]["conditions"] = ready  # back, and the scheduler binds both
    for p in h.cluster.pods_of(0):
        p["spec"]["nodeName"] = p["metadata"]["annotations"]["railyard.dev/node"]
    h.cluster.nodes[h.pod_nodes()[0]]["spec"]["unschedulable"] = True
    await h.cycle(1.0)
    assert (h.status.phase, h.status.attempt) == ("Starting", 0), h.status.message


async def test_an_operator_killed_mid_creation_finishes_the_same_gang() -> None:
    h = Harness(cluster(4), make_job())
    await starting(h)
    # a restart that lost one pod and left the gates on the rest
    names = sorted(h.cluster.pods)
    del h.cluster.pods[names[1]]
    h.cluster.pods[names[0]]["spec"]["schedulingGates"] = [{"name": "railyard.dev/gang"}]
    h.worker.status_wire = None
    h.worker.body["status"] = {**h.cluster.status, "phase": "Placing"}
    h.cluster.status = dict(h.worker.body["status"])
    await h.cycle(1.0)
    assert h.status.phase == "Starting" and "GangResumed" in h.reasons()
    assert sorted(h.cluster.pods) == names and h.pod_nodes(0) == h.status.placement.nodes  # type: ignore[union-attr]


async def test_a_spec_edit_while_running_waits_for_the_next_restart() -> None:
    h = Harness(cluster(4), make_job())
    await running(h)
    h.edit_spec(trainer={"steps": 500})
    await h.cycle(1.0)
    assert h.status.phase == "Running" and "next restart" in h.status.pending_spec_changes


async def test_an_unplaceable_job_starts_once_enough_nodes_match() -> None:
    h = Harness(cluster(1), make_job())
    await h.cycle()
    assert h.status.phase == "Placing" and not h.cluster.pods
    h.cluster.nodes["node-1"] = make_node("node-1", gpus=2, leaf="leaf-0")
    await h.cycle(2.0)
    placed = find_condition(h.status.conditions, "Placed")
    assert h.status.phase == "Starting" and placed is not None and placed.status == "True", h.status.message
    assert sorted(h.status.placement.nodes) == ["node-0", "node-1"] and len(h.cluster.pods_of(0)) == 2  # type: ignore[union-attr]


async def test_a_resume_applies_the_spec_edit_made_while_running() -> None:
    h = Harness(cluster(4), make_job())
    await running(h)
    h.edit_spec(trainer={"steps": 7})
    await h.cycle(1.0)
    assert "next restart" in h.status.pending_spec_changes and len(live_pods(h, 0)) == 2, "an edit does not restart the gang"
    h.edit_spec(suspend=True)
    await h.cycle(1.0)
    h.cluster.finish_deletions()
    await h.cycle(1.0)
    assert h.status.phase == "Suspended" and not live_pods(h, 0)
    h.edit_spec(suspend=False)
    await h.cycle(1.0)
    st = h.status
    assert st.phase == "Starting" and st.restarts.total == 0, "a resume is not a restart"
    assert st.pending_spec_changes == "" and st.observed_generation == h.job["metadata"]["generation"]


async def test_a_name_too_long_for_pod_hostnames_fails_the_job_not_the_operator() -> None:
    h = Harness(cluster(4), make_job("j" + "x" * 62))
    assert await h.cycle() is None
    failed = find_condition(h.status.conditions, "Failed")
    assert h.status.phase == "Failed" and failed is not None and failed.reason == "InvalidSpec" and "metadata.name" in failed.message
    assert not h.cluster.pods


async def test_missing_hot_spares_mark_the_job_degraded_and_the_gauge_counts_phases() -> None:
    h = Harness(cluster(3), make_job(gang={"hotSpares": 2}))
    await h.cycle()
    assert h.status.phase == "Placing"  # a fresh placement needs its spares
    h2 = Harness(cluster(4), make_job(gang={"hotSpares": 2}))
    await running(h2)
    h2.node_down(h2.status.placement.spares[0])  # type: ignore[union-attr]
    await node_of_pod_down(0)(h2)
    h2.cluster.finish_deletions()
    await h2.cycle(1.0)
    degraded = find_condition(h2.status.conditions, "Degraded")
    assert h2.status.phase == "Starting" and degraded is not None and degraded.status == "True" and "hot spares" in degraded.message


async def test_deleting_a_job_without_our_finalizer_deletes_what_it_owns() -> None:
    h = Harness(cluster(4), make_job())
    await running(h)
    h.worker.body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert await h.cycle(1.0) is None
    assert ("delete", "owned by j") in h.cluster.calls and not h.cluster.pods


async def test_cleanup_on_delete_runs_one_cleanup_pod_per_node_then_drops_the_finalizer() -> None:
    h = Harness(cluster(4), make_job(checkpoint={"cleanupOnDelete": True}))
    await running(h)
    assert CLEANUP_FINALIZER in h.cluster.finalizers
    h.worker.body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    await h.cycle(1.0)  # the gang goes
    h.cluster.finish_deletions()
    await h.cycle(1.0)  # cleanup pods on the nodes that held the job
    cleaners = h.cluster.pods_of(cleanup=True)
    assert len(cleaners) == 2
    for p in cleaners:
        p["status"] = {"phase": "Succeeded"}
    assert await h.cycle(1.0) is None
    assert CLEANUP_FINALIZER not in h.cluster.finalizers and "CheckpointsDeleted" in h.reasons()


# --------------------------------------------------------------------------- heartbeats, nodes, the worker loop


def _beat(h: Harness, pod: int, step: int, *, ranks: tuple[int, ...], checkpoints: tuple[Any, ...] = ()) -> None:
    from railyard.protocol.heartbeat import HeartbeatBatch, RankBeat

    batch = HeartbeatBatch(job="j", attempt=h.status.attempt, pod_index=pod, node=h.pod_nodes()[pod], sent_at=h.now,
                           ranks=tuple(RankBeat(rank=r, step=step, step_time_s=1.0, compute_s=0.9, loss=2.5, tokens_per_s=100.0) for r in ranks),
                           checkpoints=checkpoints)
    h.runtime.store.ingest("ns", "j", batch, h.now)


async def test_heartbeats_put_progress_in_the_status_and_a_silent_rank_restarts_the_gang() -> None:
    from railyard.protocol.heartbeat import CheckpointEvent

    h = Harness(cluster(4), make_job())
    await running(h)
    saved = (CheckpointEvent(step=5, tier="memory", ok=True),)
    for step in range(1, 6):
        _beat(h, 0, step, ranks=(0, 1), checkpoints=saved if step == 5 else ())
        _beat(h, 1, step, ranks=(2, 3))
        await h.cycle(1.0)
    st = h.status
    assert st.phase == "Running" and st.step == 5 and st.loss == 2.5
    assert st.last_checkpoint is not None and (st.last_checkpoint.tier, st.last_checkpoint.step) == ("memory", 5)
    # pod 1's ranks go silent past the heartbeat timeout while its pod still runs: dead ranks
    for _ in range(8):
        _beat(h, 0, st.step, ranks=(0, 1))
        await h.cycle(2.0)
        if h.status.phase != "Running":
            break
    assert h.status.phase == "Restarting", h.cluster.events
    head = find_condition(h.status.conditions, "Restarting")
    assert h.status.restarts.infrastructure == 1 and head is not None and head.reason == "DeadRankVerdict"


async def test_node_events_release_what_a_person_released_and_wake_only_on_changes() -> None:
    from railyard.handlers.nodes import on_node_change
    from railyard.logic.quarantine import REASON_ANNOTATION, RELEASE_ANNOTATION

    h = Harness(cluster(2), make_job())
    w = h.runtime.upsert_job("ns", "j", h.job)
    try:
        node = make_node("node-0", labels={"railyard.dev/quarantined": "true"}, annotations={REASON_ANNOTATION: "x", RELEASE_ANNOTATION: "true"},
                         taints=[{"key": "railyard.dev/quarantined", "effect": "NoSchedule"}])
        w.wake.clear()
        await on_node_change(h.runtime, h.cluster, deleted=False, name="node-0", body=node)
        assert ("release", "node-0") in h.cluster.calls and w.wake.is_set()
        w.wake.clear()
        await on_node_change(h.runtime, h.cluster, deleted=False, name="node-0", body=node)
        assert not w.wake.is_set(), "nothing placement reads changed"
        await on_node_change(h.runtime, h.cluster, deleted=True, name="node-0", body=node)
        assert w.wake.is_set() and "node-0" not in h.runtime.node_signatures
    finally:
        await h.runtime.close()


async def test_the_worker_loop_runs_cycles_counts_errors_and_stops_with_the_job() -> None:
    import asyncio

    from prometheus_client import CollectorRegistry

    from railyard.handlers.runtime import OperatorSettings, Runtime

    calls: list[str] = []
    done = asyncio.Event()

    async def reconcile(rt: Runtime, w: Any) -> float | None:
        calls.append(w.name)
        if len(calls) == 1:
            raise RuntimeError("boom")  # counted, retried with backoff
        done.set()
        return None

    rt = Runtime(OperatorSettings(metrics_port=0, registry=CollectorRegistry(), coalesce_s=0), reconcile)
    rt.upsert_job("ns", "a", make_job("a"))
    await asyncio.wait_for(done.wait(), timeout=30)
    assert calls[:2] == ["a", "a"]
    errors = rt.metrics.registry.get_sample_value("railyard_reconcile_errors_total", {"kind": "RuntimeError"})
    assert errors == 1
    await rt.remove_job("ns", "a")
    assert ("ns", "a") not in rt.workers
    await rt.close()


# --------------------------------------------------------------------------- issue 35


async def test_a_running_gang_that_loses_a_pod_stays_running_until_the_loss_is_classified() -> None:
    # its node goes NotReady (classified once the grace has passed) and its pod is being deleted
    h = Harness(cluster(4), make_job())
    await running(h)
    lost = h.cluster.pods_of(0)[1]
    h.node_down(h.pod_nodes()[1])
    lost["metadata"]["deletionTimestamp"] = format_time(h.now)
    await h.cycle(0.5)
    assert h.status.phase == "Running" and "GangStarting" not in h.reasons(), h.cluster.events
    assert h.delays[-1] is not None and h.delays[-1] <= 2.0, "it looks again once the grace has passed"
    await h.cycle(5.0)
    head = find_condition(h.status.conditions, "Restarting")
    assert h.status.phase == "Restarting" and head is not None and head.reason == "NodeNotReady", h.cluster.events
    assert "GangStarting" not in h.reasons()


async def test_observed_generation_is_the_generation_acted_on_from_the_first_cycle() -> None:
    h = Harness(cluster(1), make_job(generation=3))
    await h.cycle()
    assert h.status.phase == "Placing" and h.status.observed_generation == 3
    placed = find_condition(h.status.conditions, "Placed")
    assert placed is not None and placed.observed_generation == 3
    h.edit_spec(procsPerNode=2)  # edited while still waiting for room: the next try uses it
    await h.cycle(5.0)
    assert h.status.phase == "Placing" and h.status.observed_generation == 4
