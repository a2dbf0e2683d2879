"""Issue 35 through the reconcile cycle: Running pods the operator hears nothing from make the job
Blind (condition, Event, metric) before any restart, and hearing them clears it; an operator
restarted under running pods gives new pods the address the old ones use."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from tests.operator.builders import make_node
from tests.operator.conftest import MAIN_NS, Api, OperatorProcess, Workload, base_spec
from tests.operator.fake_cluster import Harness, make_job
from tests.waiting import wait_until

from railyard.handlers import kopf_handlers
from railyard.handlers.health import heartbeat_url_for
from railyard.handlers.reconcile import reconcile_job
from railyard.handlers.runtime import JobWorker, OperatorSettings, Runtime
from railyard.logic.conditions import find_condition
from railyard.logic.health.address import heartbeat_url_of
from railyard.logic.health.silence import HEARD, SILENT


def _cluster(n: int = 4) -> list[dict[str, Any]]:
    return [make_node(f"node-{i}", gpus=2, leaf=f"leaf-{i // 2}") for i in range(n)]


async def _running(h: Harness) -> None:
    await h.cycle()
    h.run_pods()
    await h.cycle(1.0)
    assert h.status.phase == "Running", h.cluster.events


def _silent_pods(h: Harness) -> float | None:
    return h.runtime.metrics.registry.get_sample_value("railyard_silent_pods", {"namespace": "ns", "job": "j"})


def _beat(h: Harness, pod: int, ranks: tuple[int, ...]) -> None:
    from railyard.protocol.heartbeat import HeartbeatBatch, RankBeat

    batch = HeartbeatBatch(job="j", attempt=h.status.attempt, pod_index=pod, node=h.pod_nodes()[pod], sent_at=h.now,
                           ranks=tuple(RankBeat(rank=r, step=0, step_time_s=0.0) for r in ranks))
    h.runtime.store.ingest("ns", "j", batch, h.now)


async def test_silent_running_pods_make_the_job_blind_until_they_are_heard() -> None:
    h = Harness(_cluster(), make_job(), heartbeat_url="http://unreachable.example:8080")
    await _running(h)
    await h.cycle(29.0)
    assert find_condition(h.status.conditions, "Blind") is None, "within the bound: nothing said"
    await h.cycle(2.0)
    st = h.status
    blind = find_condition(st.conditions, "Blind")
    assert st.phase == "Running", "said, not restarted"
    assert blind is not None and (blind.status, blind.reason) == ("True", SILENT)
    assert blind.message.startswith("2/2 Running pods (pod 0-1; ranks 0-3) sent no heartbeat and no launcher report")
    assert "at http://unreachable.example:8080/v1/heartbeats/ns/j" in blind.message
    assert [e for e in h.cluster.events if e[1] == SILENT] == [("Warning", SILENT, blind.message)]
    assert _silent_pods(h) == 2
    # pod 0's launcher gets through; pod 1 still silent: one pod named, no second Event
    h.report(0)
    await h.cycle(2.0)
    blind = find_condition(h.status.conditions, "Blind")
    assert blind is not None and blind.status == "True" and blind.message.startswith("1/2 Running pods (pod 1; ranks 2-3)")
    assert [e[1] for e in h.cluster.events].count(SILENT) == 1 and _silent_pods(h) == 1
    _beat(h, 1, (2, 3))
    await h.cycle(2.0)
    blind = find_condition(h.status.conditions, "Blind")
    assert blind is not None and (blind.status, blind.reason) == ("False", HEARD)
    assert h.cluster.events[-1][:2] == ("Normal", HEARD) and _silent_pods(h) == 0


async def test_pods_heard_in_time_never_show_the_condition() -> None:
    h = Harness(_cluster(), make_job())
    await _running(h)
    h.all_report()
    for _ in range(20):
        await h.cycle(2.0)
    assert find_condition(h.status.conditions, "Blind") is None
    assert not any(e[1] in (SILENT, HEARD) for e in h.cluster.events)


async def test_a_finished_job_is_not_blind() -> None:
    h = Harness(_cluster(), make_job())
    await _running(h)
    await h.cycle(31.0)
    assert find_condition(h.status.conditions, "Blind") is not None
    h.exit_pod(0, 0)
    h.exit_pod(1, 0)
    await h.cycle(1.0)
    blind = find_condition(h.status.conditions, "Blind")
    assert h.status.phase == "Succeeded" and blind is not None and blind.status == "False"


async def test_an_operator_restarted_without_an_address_keeps_the_one_the_pods_use() -> None:
    h = Harness(_cluster(), make_job(), heartbeat_url="http://127.0.0.1:41234")
    await _running(h)
    carried = "http://127.0.0.1:41234/v1/heartbeats/ns/j"
    assert {heartbeat_url_of(p) for p in h.cluster.pods_of(0)} == {carried}
    # a new operator, no --heartbeat-advertise-url: its index holds the running pods
    rt = Runtime(OperatorSettings(metrics_port=8080, registry=CollectorRegistry(), coalesce_s=0), reconcile_job)
    h.cluster.bind(rt)
    rt.workers[("ns", "j")] = JobWorker("ns", "j")
    assert heartbeat_url_for(rt, "ns", "j") == carried
    # and keeps it once the pods are gone (a full restart recreates them after they went)
    rt.job_pods = {}
    assert heartbeat_url_for(rt, "ns", "j") == carried
    # a job with no pods gets the chart's Service; an advertised address wins over the pods'
    assert heartbeat_url_for(rt, "ns", "other") == "http://railyard-operator.railyard-system.svc:8080/v1/heartbeats/ns/other"
    rt.settings.heartbeat_url = "http://10.0.0.5:9000"
    assert heartbeat_url_for(rt, "ns", "j") == "http://10.0.0.5:9000/v1/heartbeats/ns/j"


def test_the_pod_index_keeps_the_heartbeat_url_and_no_other_env() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns"},
           "spec": {"containers": [{"name": "trainer", "env": [{"name": "A", "value": "1"}, {"name": "RAILYARD_HEARTBEAT_URL", "value": "http://x:1"}]}]}}
    assert kopf_handlers.compact_pod(pod)["spec"]["containers"] == [{"name": "trainer", "resources": {}, "env": [{"name": "RAILYARD_HEARTBEAT_URL", "value": "http://x:1"}]}]


# --------------------------------------------------------------------------- on the local cluster


@pytest.mark.cluster
def test_a_workload_that_never_reaches_the_operator_makes_the_job_blind(api: Api, operator: OperatorProcess, workload: Workload, job_name: str) -> None:
    """The stand-in workload runs no launcher and sends no heartbeat: what an operator sees of pods
    that cannot reach it. The job says so (condition and Event, through a real API server) and
    keeps running."""
    api.create_job(MAIN_NS, job_name, base_spec(workload, nodes=2))
    try:
        def blind() -> dict[str, Any] | None:
            st = api.status(MAIN_NS, job_name)
            return next((c for c in st.get("conditions") or () if c["type"] == "Blind" and c["status"] == "True"), None)

        cond = wait_until(blind, timeout=120, message="the Blind condition", retry_on=(Exception,))
        assert cond["reason"] == SILENT and cond["message"].startswith("2/2 Running pods (pod 0-1; ranks 0-1)"), cond
        assert f"at http://127.0.0.1:{operator.port}/v1/heartbeats/{MAIN_NS}/{job_name}" in cond["message"], cond
        assert api.status(MAIN_NS, job_name)["phase"] == "Running", "said, not restarted"
        wait_until(lambda: any(e.reason == SILENT and e.type == "Warning" for e in api.events(MAIN_NS, job_name)), timeout=30, message="the PodsSilent Event", retry_on=(Exception,))
        samples = [s for f in text_string_to_metric_families(operator.metrics_text()) for s in f.samples if s.name == "railyard_silent_pods"]
        assert [s.value for s in samples if s.labels == {"namespace": MAIN_NS, "job": job_name}] == [2.0]
    finally:
        api.delete_job(MAIN_NS, job_name)
