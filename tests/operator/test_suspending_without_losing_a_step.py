"""``spec.suspend: true`` on a running gang, in-process on the fake cluster (fake_cluster.py), the
launchers and heartbeats played by the test (issue 47): before the pods are deleted the operator
asks the launchers for a just-in-time save to the memory tier (the planned move's order on the
control channel) and waits for the heartbeats to report it committed; the gang trains on
meanwhile. Resumed, the next attempt is placed on the same nodes (the memory tier is on those
hosts) and its restore hint names that save. The wait is bounded by the operator's setting; past
it the pods go anyway and a Warning Event says so. (The real trainer's first step after such a
resume: tests/system/test_suspending_a_running_job.py.)"""

from __future__ import annotations

import json
from typing import Any

from tests.operator.builders import make_node
from tests.operator.fake_cluster import Harness, make_job

from railyard.logic.jitsave import LEAD_STEPS
from railyard.logic.manifests import configmap_name
from railyard.protocol.control import Action
from railyard.protocol.heartbeat import CheckpointEvent, HeartbeatBatch, RankBeat


def cluster(n: int = 4) -> list[dict[str, Any]]:
    return [make_node(f"node-{i}", gpus=2, leaf=f"leaf-{i // 2}") for i in range(n)]


async def running(h: Harness) -> None:
    await h.cycle()
    h.run_pods()
    await h.cycle(1.0)
    assert all(o.action is Action.CONTINUE for o in h.all_report())
    await h.cycle(1.0)
    assert h.status.phase == "Running", h.cluster.events


def beat(h: Harness, step: int, *, saved: int = -1) -> None:
    """Both pods' ranks (2 per pod) report ``step``; a committed memory-tier save at ``saved``."""
    for pod, node in enumerate(h.pod_nodes()):
        done = (CheckpointEvent(step=saved, tier="memory", ok=True),) if saved >= 0 else ()
        batch = HeartbeatBatch(job="j", attempt=h.status.attempt, pod_index=pod, node=node, sent_at=h.now,
                               ranks=tuple(RankBeat(rank=r, step=step, step_time_s=1.0, compute_s=0.9, loss=2.5,
                                                    tokens_per_s=100.0) for r in (2 * pod, 2 * pod + 1)),
                               checkpoints=done)
        h.runtime.store.ingest("ns", "j", batch, h.now)


def deleting(h: Harness, attempt: int) -> list[bool]:
    return [p["metadata"]["name"] in h.worker.deleting for p in h.cluster.pods_of(attempt)]


async def test_a_suspend_saves_first_and_the_resumed_attempt_restores_that_step() -> None:
    h = Harness(cluster(), make_job())
    await running(h)
    nodes = h.pod_nodes(0)
    beat(h, 7, saved=5)  # the gang trains at step 7; the newest periodic memory save is at 5
    await h.cycle(1.0)
    h.edit_spec(suspend=True)
    await h.cycle(1.0)
    target = 7 + LEAD_STEPS
    assert h.status.phase == "Running" and deleting(h, 0) == [False, False], "no pod goes before the save"
    assert any(r == "SavingBeforeStop" and f"step {target}" in m and "spec.suspend" in m for _, r, m in h.cluster.events)
    orders = h.all_report()
    assert [(o.action, o.save_step, o.reason) for o in orders] == [(Action.SAVE, target, "save before spec.suspend")] * 2
    beat(h, target - 1, saved=5)
    await h.cycle(1.0)
    assert h.status.phase == "Running" and deleting(h, 0) == [False, False], "an older save does not count"
    beat(h, target, saved=target)
    await h.cycle(1.0)
    st = h.status
    assert st.phase == "Suspended" and deleting(h, 0) == [True, True], (st.phase, st.message)
    assert f"the next attempt resumes from the just-in-time save at step {target}" in st.message
    assert any(t == "Normal" and r == "SavedBeforeStop" for t, r, _ in h.cluster.events), h.cluster.events
    assert h.runtime.control.save_order("ns", "j") is None, "the order is done with"
    h.cluster.finish_deletions()
    await h.cycle(1.0)
    assert h.status.phase == "Suspended" and h.cluster.pods_of() == []
    h.edit_spec(suspend=False)
    await h.cycle(1.0)
    st = h.status
    assert st.phase == "Starting" and st.attempt == 1 and st.restarts.total == 0, (st.phase, st.message)
    config = json.loads(h.cluster.objects[("ConfigMap", configmap_name("j", 1))]["data"]["config.json"])
    assert (config["restore"]["tier"], config["restore"]["step"]) == ("memory", target), config["restore"]
    assert h.pod_nodes(1) == nodes, "placed on the nodes whose memory holds the save"


async def test_a_save_that_does_not_come_delays_the_suspend_only_as_long_as_the_setting() -> None:
    h = Harness(cluster(), make_job(), save_before_stop_s=5.0)
    await running(h)
    beat(h, 7, saved=5)
    await h.cycle(1.0)
    h.edit_spec(suspend=True)
    await h.cycle(1.0)
    assert h.status.phase == "Running" and deleting(h, 0) == [False, False]
    await h.cycle(4.0)
    assert h.status.phase == "Running" and deleting(h, 0) == [False, False]
    await h.cycle(1.0)
    st = h.status
    assert st.phase == "Suspended" and deleting(h, 0) == [True, True], (st.phase, st.message)
    said = [m for t, r, m in h.cluster.events if (t, r) == ("Warning", "StoppedWithoutSave")]
    assert said and f"the just-in-time save at step {7 + LEAD_STEPS} was not committed within 5s" in said[0], said
    assert "not committed within 5s" in st.message


async def test_a_gang_not_training_whole_is_suspended_at_once() -> None:
    h = Harness(cluster(), make_job())
    await h.cycle()
    assert h.status.phase == "Starting"
    h.edit_spec(suspend=True)
    await h.cycle(1.0)
    st = h.status
    assert st.phase == "Suspended" and deleting(h, 0) == [True, True] and "not training whole" in st.message
    assert h.runtime.control.save_order("ns", "j") is None
