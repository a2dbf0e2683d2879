"""In-place restarts in the reconcile cycle, in-process on the fake cluster (fake_cluster.py),
with the pods' launchers played by the test on the control board: which pods stay, which move
where and why, what every launcher is told, and when it falls back to a full restart."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from tests.operator.builders import make_node
from tests.operator.fake_cluster import Harness, make_job

from railyard.logic.conditions import find_condition, parse_time
from railyard.protocol.control import Action, apply_rank_table_delta

Setup = Callable[[Harness], None]


def cluster(n: int = 4, *, gpus: int = 2) -> list[dict[str, Any]]:
    return [make_node(f"node-{i}", gpus=gpus, leaf=f"leaf-{i // 2}") for i in range(n)]


async def running(h: Harness, *, capable: bool = True) -> None:
    """A Running gang whose launchers have reported (spoken the control protocol), spares held."""
    await h.cycle()
    h.run_pods()
    for p in h.cluster.pods_of(spare=True):
        p["status"] = {"phase": "Running"}
    await h.cycle(1.0)
    for p in h.cluster.pods_of(spare=True):
        p["status"] = {"phase": "Running"}
    if capable:
        assert all(o.action is Action.CONTINUE for o in h.all_report())
    await h.cycle(1.0)
    assert h.status.phase == "Running", h.cluster.events


def gang_writes(h: Harness, since: int) -> tuple[list[str], list[str]]:
    """Gang pods deleted and created since call ``since`` (placeholders apart)."""
    calls = h.cluster.calls[since:]
    deleted = [w for v, w in calls if v == "delete" and w.startswith("Pod/") and "-spare-" not in w]
    created = [w for v, w in calls if v == "create" and w.startswith("Pod/") and "-spare-" not in w]
    return deleted, created


def node_down(index: int) -> Setup:
    return lambda h: h.node_down(h.pod_nodes()[index])


def launcher_crash(index: int, others: int = 70) -> Setup:
    def go(h: Harness) -> None:
        for p in h.members():
            i = int(p["metadata"]["labels"]["railyard.dev/pod-index"])
            h.report(i, "failed", code=1 if i == index else others)

    return go


def container_exit(index: int, code: int = 1) -> Setup:
    def go(h: Harness) -> None:
        h.exit_pod(index, code)
        for p in h.members():
            i = int(p["metadata"]["labels"]["railyard.dev/pod-index"])
            if i != index:
                h.report(i, "failed", code=70)

    return go


@dataclass(frozen=True)
class Row:
    name: str
    event: Setup
    mode: str
    reason: str = ""
    replaced: tuple[int, ...] = ()
    spec: tuple[tuple[str, Any], ...] = (("gang", {"hotSpares": 1}), ("restartPolicy", {"application": {"limit": 3, "backoffSeconds": 0}}))
    nodes: int = 4
    capable: bool = True
    before: Setup | None = None


ROWS = [
    Row("a lost node moves its pod only", node_down(1), "InPlace", replaced=(1,)),
    Row("a crashed rank restarts every pod in place", launcher_crash(1), "InPlace"),
    Row("an exited container is replaced on its own node", container_exit(1), "InPlace", replaced=(1,)),
    Row("launchers that never spoke: full", node_down(1), "Full", "NoControlChannel", capable=False),
    Row("in place disabled: full", node_down(1), "Full", "InPlaceDisabled",
        spec=(("gang", {"hotSpares": 1}), ("restartPolicy", {"inPlace": False}))),
    Row("a spec edit waits for a full restart", launcher_crash(1), "Full", "SpecChanged",
        before=lambda h: h.edit_spec(trainer={"steps": 500})),
    Row("no room for the replacement: full", node_down(1), "Full", "NotPlaceable", spec=(), nodes=2),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
async def test_how_a_failure_restarts(row: Row) -> None:
    h = Harness(cluster(row.nodes), make_job(**dict(row.spec)))
    await running(h, capable=row.capable)
    if row.before is not None:
        row.before(h)
    before = {p["metadata"]["name"]: p["metadata"].get("uid") for p in h.members()}
    first = h.pod_nodes()
    mark = len(h.cluster.calls)
    row.event(h)
    await h.cycle(5.0)
    st = h.status
    assert st.last_restart is not None and st.last_restart.mode == row.mode, (st.last_restart, h.cluster.events)
    assert st.last_restart.reason == row.reason
    assert st.restarts.total == 1 and st.attempt == 1
    deleted, created = gang_writes(h, mark)
    if row.mode == "InPlace":
        assert st.phase == "Starting" and find_condition(st.conditions, "Placed").reason == "RestartedInPlace"  # type: ignore[union-attr]
        assert st.last_restart.replaced == list(row.replaced)
        assert len(deleted) == len(row.replaced) and len(created) == len(row.replaced), (deleted, created)
        kept = [n for n in before if not any(n in d for d in deleted)]
        assert len(kept) == 2 - len(row.replaced) and all(n in h.cluster.pods for n in kept), "the same pod objects stay"
        for i in row.replaced:
            new = h.cluster.pods[f"j-a1-{i}"]
            assert new["metadata"]["labels"]["railyard.dev/attempt"] == "1"
        # the kept launchers are told to restart, with the new attempt's rank table
        for p in h.members():
            i = int(p["metadata"]["labels"]["railyard.dev/pod-index"])
            if i in row.replaced:
                continue
            order = h.report(i, "failed", attempt=0, code=70)
            assert order.action is Action.RESTART and order.attempt == 1
            prev = h.runtime.control.table("ns", "j", 0)
            assert prev is not None and order.delta is not None
            table = apply_rank_table_delta(prev, order.delta)
            assert [e.node for e in table.pods] == h.status.placement.nodes  # type: ignore[union-attr]
            assert table.master_port != prev.master_port, "the new attempt rendezvouses on its own port"
        assert any(r == "RestartedInPlace" and "kept on their nodes" in m for _, r, m in h.cluster.events)
    else:
        assert st.phase == "Restarting"
        assert len(deleted) == 2 and not created, "a full restart deletes the whole gang first"
        if row.reason and row.reason != "InPlaceDisabled":
            assert any(r == "FullRestart" and row.reason in m for _, r, m in h.cluster.events), h.cluster.events
    if row.replaced and row.mode == "InPlace":
        moved = [i for i, (a, b) in enumerate(zip(first, h.status.placement.nodes, strict=True)) if a != b]  # type: ignore[union-attr]
        assert set(moved) <= set(row.replaced)


async def test_the_gang_runs_again_once_every_kept_launcher_restarted() -> None:
    h = Harness(cluster(4), make_job(gang={"hotSpares": 1}))
    await running(h)
    node_down(1)(h)
    await h.cycle(5.0)
    assert h.status.phase == "Starting"
    # the placeholder on the spare goes first; only then the replacement's gate is lifted
    spare = h.status.placement.spares  # type: ignore[union-attr]
    new = h.cluster.pods["j-a1-1"]
    assert new["spec"].get("schedulingGates"), "gated while the placeholder holds the spare"
    h.cluster.finish_deletions()
    await h.cycle(0.5)
    assert not h.cluster.pods["j-a1-1"]["spec"].get("schedulingGates")
    assert h.cluster.pods["j-a1-1"]["spec"]["nodeName"] not in spare
    h.run_pods()
    await h.cycle(0.5)
    assert h.status.phase == "Starting" and "waiting for 1 kept pods" in h.status.message
    assert h.report(0, "failed", attempt=0, code=70).action is Action.RESTART
    h.report(0, "running", attempt=1)
    h.report(1, "running", attempt=1)
    await h.cycle(0.5)
    st = h.status
    assert st.phase == "Running" and st.last_restart.state == "Done"  # type: ignore[union-attr]
    assert h.runtime.metrics.registry.get_sample_value("railyard_in_place_restart_seconds_count") == 1
    assert h.runtime.metrics.registry.get_sample_value("railyard_restart_modes_total", {"mode": "InPlace", "reason": "None"}) == 1


async def test_the_restart_is_stamped_when_the_launchers_are_told_not_when_the_cycle_began() -> None:
    """``lastRestart.startedTime`` says when the kept launchers were told (the orders open after
    the cycle's writes: the replacement, its group, the gates); on a loaded server those writes
    take seconds, and a stamp from the cycle's start would count them as the signal's delay."""
    h = Harness(cluster(4), make_job(gang={"hotSpares": 1}))
    await running(h)
    node_down(1)(h)
    create_pods = h.cluster.create_pods

    async def slow_create(pods: Any) -> int:
        h.now += 3.0  # the server takes 3 s to answer
        return await create_pods(pods)

    h.cluster.create_pods = slow_create  # type: ignore[method-assign]
    began = h.now + 5.0
    await h.cycle(5.0)
    st = h.status
    assert st.phase == "Starting" and st.last_restart is not None and st.last_restart.mode == "InPlace"
    assert parse_time(st.last_restart.started_time) == pytest.approx(began + 3.0, abs=1e-3), st.last_restart


async def test_a_launcher_that_does_not_restart_in_time_turns_it_into_a_full_restart() -> None:
    h = Harness(cluster(4), make_job(gang={"hotSpares": 1}, restartPolicy={"inPlaceTimeoutSeconds": 10}))
    await running(h)
    node_down(1)(h)
    await h.cycle(5.0)
    h.cluster.finish_deletions()
    await h.cycle(0.5)
    h.run_pods()
    h.report(1, "running", attempt=1)  # the replacement started; pod 0's launcher stays silent
    for _ in range(12):
        await h.cycle(1.0)
        if h.status.phase != "Starting":
            break
    st = h.status
    assert st.phase == "Restarting" and st.attempt == 2, (st.phase, st.message)
    assert st.last_restart is not None and (st.last_restart.mode, st.last_restart.reason) == ("Full", "RestartNotAnswered")
    assert "j-a0-0" in st.message and "did not restart" in st.message
    assert st.restarts.total == 1, "the same failure: no second restart counted"
    assert not [p for p in h.cluster.pods_of() if not p["metadata"].get("deletionTimestamp")], "the whole gang goes"
    # the old launchers are told to stop
    assert h.report(0, "running", attempt=0, pod="j-a0-0").action is Action.STOP
    h.cluster.finish_deletions()
    await h.cycle(1.0)
    assert h.status.phase == "Starting" and sorted(h.cluster.pods_of(2)[i]["metadata"]["name"] for i in range(2)) == ["j-a2-0", "j-a2-1"]


async def test_a_replaced_pods_launcher_is_told_to_stop() -> None:
    h = Harness(cluster(4), make_job(gang={"hotSpares": 1}))
    await running(h)
    node_down(1)(h)
    await h.cycle(5.0)
    # the partitioned old pod 1 comes back and asks
    order = h.report(1, "running", attempt=0, pod="j-a0-1")
    assert order.action is Action.STOP and "was replaced" in order.reason
    assert h.report(1, "running", attempt=1, pod="j-a1-1").action is Action.CONTINUE


async def test_a_backoff_holds_the_workers_until_it_passes() -> None:
    h = Harness(cluster(4), make_job(gang={"hotSpares": 1}, restartPolicy={"application": {"limit": 3, "backoffSeconds": 10}}))
    await running(h)
    launcher_crash(1)(h)
    await h.cycle(1.0)
    assert h.status.phase == "Restarting" and h.status.last_restart.state == "Pending"  # type: ignore[union-attr]
    assert h.report(0, "failed", attempt=0, code=70).action is Action.CONTINUE, "told to wait during the backoff"
    await h.cycle(5.0)
    assert h.status.phase == "Restarting"
    await h.cycle(5.5)
    assert h.status.phase == "Starting"
    assert h.report(0, "failed", attempt=0, code=70).action is Action.RESTART


async def test_a_restart_leaves_a_straggler_node_behind_when_a_spare_allows() -> None:
    for spares, moves in ((1, True), (0, False)):
        h = Harness(cluster(4 if spares else 2), make_job(gang={"hotSpares": spares}, restartPolicy={"application": {"limit": 3, "backoffSeconds": 0}}))
        await running(h)
        slow = h.pod_nodes()[0]
        assert h.worker.status_wire is not None
        h.worker.status_wire["stragglers"] = [{"rank": 0, "node": slow, "score": 0.6}]
        launcher_crash(1)(h)
        await h.cycle(1.0)
        st = h.status
        assert st.last_restart is not None and st.last_restart.mode == "InPlace", st.last_restart
        if moves:
            assert st.last_restart.replaced == [0] and slow not in st.placement.nodes  # type: ignore[union-attr]
            assert "left stragglers behind" in st.last_restart.message and slow in st.last_restart.message
        else:
            assert st.last_restart.replaced == [] and st.placement.nodes[0] == slow  # type: ignore[union-attr]


async def test_spares_are_held_counted_and_released_when_the_job_ends() -> None:
    h = Harness(cluster(4), make_job(gang={"hotSpares": 2}))
    await running(h)
    spares = h.cluster.pods_of(spare=True)
    assert sorted(p["spec"]["nodeName"] for p in spares) == sorted(h.status.placement.spares)  # type: ignore[union-attr]
    assert h.status.spares_held == 2
    reg = h.runtime.metrics.registry
    assert reg.get_sample_value("railyard_hot_spares", {"namespace": "ns", "job": "j", "state": "held"}) == 2
    pod = spares[0]
    req = pod["spec"]["containers"][0]["resources"]["requests"]
    assert req["nvidia.com/gpu"] == "2", "a placeholder holds what a gang pod needs"
    for i in range(2):
        h.exit_pod(i, 0)
    await h.cycle(1.0)
    assert h.status.phase == "Succeeded"
    assert all(p["metadata"].get("deletionTimestamp") for p in h.cluster.pods_of(spare=True)), "released at once"


async def test_an_operator_restarted_mid_restart_tells_the_launchers_the_same_thing() -> None:
    h = Harness(cluster(4), make_job(gang={"hotSpares": 1}))
    await running(h)
    node_down(1)(h)
    await h.cycle(5.0)
    before = h.report(0, "failed", attempt=0, code=70)
    # a new operator process: no board, no worker memory
    from prometheus_client import CollectorRegistry

    from railyard.handlers.reconcile import reconcile_job
    from railyard.handlers.runtime import JobWorker, OperatorSettings, Runtime

    h.runtime = Runtime(OperatorSettings(metrics_port=0, registry=CollectorRegistry(), coalesce_s=0), reconcile_job)
    h.worker = JobWorker("ns", "j", body=h.worker.body)
    await h.cycle(0.5)
    after = h.report(0, "failed", attempt=0, code=70)
    assert after.action is Action.RESTART and after.attempt == before.attempt == 1
    assert after.delta is not None and before.delta is not None and after.delta.digest == before.delta.digest


@pytest.mark.parametrize("bound", [False, True], ids=["not yet bound", "bound"])
async def test_a_replacement_whose_node_goes_down_after_the_restart_moves_elsewhere(bound: bool) -> None:
    """Issue 46: a failed node's container is killed first (exit 137, as a node agent kills
    it) and its node goes NotReady only later. The restart decided in between keeps the
    replacement on that node (nothing blamed it yet); once the node is NotReady the replacement
    can never run there: it moves (a new Infrastructure recovery blaming and quarantining the
    node), and the gang runs again, instead of waiting out spec.gang.scheduleTimeoutSeconds."""
    h = Harness(cluster(4), make_job(gang={"hotSpares": 1, "scheduleTimeoutSeconds": 900},
                                     restartPolicy={"infrastructure": {"limit": 5, "backoffSeconds": 0}}))
    await running(h)
    node = h.pod_nodes()[1]
    spare = h.status.placement.spares[0]  # type: ignore[union-attr]
    # the container exits first; the scheduler has not got to the replacement when the node goes
    h.cluster.scheduler_binds = bound
    container_exit(1, code=137)(h)
    await h.cycle(1.0)
    st = h.status
    assert st.last_restart is not None and (st.last_restart.mode, st.last_restart.replaced) == ("InPlace", [1])
    assert st.attempt == 1 and st.placement is not None
    assert st.placement.nodes[1] == node, "nothing blamed the node: the replacement stays on it"
    assert h.report(0, "failed", attempt=0, code=70).action is Action.RESTART
    h.report(0, "running", attempt=1)
    assert bool(h.cluster.pods["j-a1-1"]["spec"].get("nodeName")) == bound
    # the node goes NotReady (its lease ran out): the replacement stays Pending there
    h.node_down(node)
    h.cluster.scheduler_binds = True
    for _ in range(10):
        await h.cycle(1.0)
        if h.status.attempt == 2:
            break
    st = h.status
    assert st.attempt == 2, (st.phase, st.message, h.cluster.events)
    assert st.last_restart is not None and (st.last_restart.mode, st.last_restart.replaced) == ("InPlace", [1])
    assert st.last_failure is not None and st.last_failure.reason == "NodeNotReady"  # type: ignore[union-attr]
    assert st.restarts.infrastructure == 2 and st.restarts.total == 2, st.restarts
    assert [q.node for q in st.quarantined_nodes] == [node] and ("quarantine", node) in h.cluster.calls
    assert st.placement.nodes[1] == spare and st.placement.nodes[0] == h.pod_nodes(0)[0]  # type: ignore[union-attr]
    assert "j-a1-1" not in h.cluster.pods, "the stranded replacement is deleted"
    # the placeholder on the spare goes, the new replacement is bound there and runs
    h.cluster.finish_deletions()
    await h.cycle(0.5)
    assert h.cluster.pods["j-a2-1"]["spec"]["nodeName"] == spare
    h.run_pods()
    assert h.report(0, "running", attempt=1).action is Action.RESTART, "the kept launcher restarts again"
    h.report(0, "running", attempt=2)
    h.report(1, "running", attempt=2)
    await h.cycle(0.5)
    st = h.status
    assert st.phase == "Running" and st.last_restart.state == "Done", (st.phase, st.message)  # type: ignore[union-attr]
    assert "j-a0-0" in h.cluster.pods, "the kept pod stayed through both restarts"
    assert any(r == "NodeNotReady" and "(node node-1 blamed: NodeNotReady)" in m for _, r, m in h.cluster.events), \
        h.cluster.events


async def test_a_kept_launcher_still_told_to_restart_keeps_the_second_restart_in_place() -> None:
    """Issue 46, the same order, faster: the node goes NotReady before the kept launcher has
    reported the new attempt (it was told to wait, then to restart). It spoke the restart
    protocol for the attempt the restart came from: the second restart stays in place."""
    h = Harness(cluster(4), make_job(gang={"hotSpares": 1},
                                     restartPolicy={"infrastructure": {"limit": 5, "backoffSeconds": 0}}))
    await running(h)
    node = h.pod_nodes()[1]
    h.cluster.scheduler_binds = False
    container_exit(1, code=137)(h)
    await h.cycle(1.0)
    assert h.status.attempt == 1 and h.status.placement.nodes[1] == node  # type: ignore[union-attr]
    h.node_down(node)
    for _ in range(10):
        await h.cycle(1.0)
        if h.status.attempt == 2:
            break
    st = h.status
    assert st.attempt == 2 and st.last_restart is not None, (st.phase, st.message)
    assert (st.last_restart.mode, st.last_restart.replaced) == ("InPlace", [1]), st.last_restart
    order = h.report(0, "failed", attempt=0, code=70)
    assert (order.action, order.attempt) == (Action.RESTART, 2), "told to restart, now for attempt 2"
    h.cluster.scheduler_binds = True
    h.cluster.finish_deletions()
    await h.cycle(0.5)
    h.run_pods()
    h.report(0, "running", attempt=2)
    h.report(1, "running", attempt=2)
    await h.cycle(0.5)
    assert h.status.phase == "Running" and "j-a0-0" in h.cluster.pods, (h.status.phase, h.status.message)
